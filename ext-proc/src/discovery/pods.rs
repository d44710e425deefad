//! What a Kubernetes object means for routing, without IO: a pod's endpoints (model, address,
//! routable or not) in AIBrix mode and in InferencePool mode, and an InferencePool's selector
//! and ports.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;

/// AIBrix's model label (and the label selector of AIBrix mode): the pod serves that model
/// (AIBrix v0.7.0 `pkg/cache/informers.go`).
pub const MODEL_LABEL: &str = "model.aibrix.ai/name";
/// AIBrix's port label.
pub const PORT_LABEL: &str = "model.aibrix.ai/port";
/// kvroute's label for a data-parallel server: the pod's vLLM runs this many engines behind
/// each of its ports (`--data-parallel-size`), each routed to as a pod of its own
/// ([`crate::data_parallel`]). Absent, or not a number from 1 to
/// [`crate::data_parallel::MAX_SIZE`]: one engine.
pub const DATA_PARALLEL_LABEL: &str = "kvroute.io/data-parallel-size";
/// The port when [`PORT_LABEL`] is absent (AIBrix's default).
pub const DEFAULT_PORT: u16 = 8000;
/// KubeRay's worker label: such pods are not served directly (AIBrix skips them too).
const RAY_NODE_TYPE: &str = "ray.io/node-type";

/// One endpoint a pod contributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// The router's pod name: the pod's name (with `:PORT` when it has several ports).
    pub name: String,
    /// The model it serves.
    pub model: String,
    /// `ip:port`.
    pub address: String,
    /// Whether it may take requests: Running, Ready, an IP, not being deleted.
    pub routable: bool,
    /// Its engine rank when the pod is a data-parallel server ([`DATA_PARALLEL_LABEL`]).
    pub data_parallel_rank: Option<u32>,
}

/// Whether a pod is routable: phase Running, condition Ready true, an IP, and no deletion
/// timestamp (AIBrix v0.7.0 `pkg/utils/pod.go` asks for the last three).
pub fn routable(pod: &Pod) -> bool {
    let deleting = pod.metadata.deletion_timestamp.is_some();
    let Some(status) = &pod.status else {
        return false;
    };
    let running = status.phase.as_deref() == Some("Running");
    let has_ip = status.pod_ip.as_deref().is_some_and(|ip| !ip.is_empty());
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    running && ready && has_ip && !deleting
}

fn pod_ip(pod: &Pod) -> Option<&str> {
    pod.status
        .as_ref()?
        .pod_ip
        .as_deref()
        .filter(|ip| ip.parse::<std::net::IpAddr>().is_ok())
}

fn address(ip: &str, port: u16) -> String {
    match ip.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(_)) => format!("[{ip}]:{port}"),
        _ => format!("{ip}:{port}"),
    }
}

/// The key of a pod across namespaces: `namespace/name`.
pub fn key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

/// AIBrix mode: the pod's endpoint, if it is one of a model's pods and has an IP. A pod
/// without an IP yet, without the model label or a KubeRay worker has none. Its router name
/// is the pod's name, or `namespace/name` when `qualified` (a watch over several namespaces,
/// where two pods may share a name).
pub fn aibrix_endpoint(pod: &Pod, qualified: bool) -> Option<Endpoint> {
    let labels = pod.metadata.labels.as_ref()?;
    let model = labels.get(MODEL_LABEL).filter(|m| !m.is_empty())?;
    if labels.get(RAY_NODE_TYPE).map(String::as_str) == Some("worker") {
        return None;
    }
    let port = labels
        .get(PORT_LABEL)
        .and_then(|p| p.parse::<u16>().ok())
        .filter(|p| *p > 0)
        .unwrap_or(DEFAULT_PORT);
    let name = pod.metadata.name.clone()?;
    Some(Endpoint {
        name: if qualified { key(pod) } else { name },
        model: model.clone(),
        address: address(pod_ip(pod)?, port),
        routable: routable(pod),
        data_parallel_rank: None,
    })
}

/// InferencePool mode: one endpoint per target port of the pool (all under `model`, the
/// pool's routing model); none before the pod has an IP.
pub fn pool_endpoints(pod: &Pod, ports: &[u16], model: &str) -> Vec<Endpoint> {
    let (Some(name), Some(ip)) = (pod.metadata.name.as_ref(), pod_ip(pod)) else {
        return Vec::new();
    };
    let ready = routable(pod);
    ports
        .iter()
        .map(|port| Endpoint {
            name: if ports.len() == 1 {
                name.clone()
            } else {
                format!("{name}:{port}")
            },
            model: model.to_owned(),
            address: address(ip, *port),
            routable: ready,
            data_parallel_rank: None,
        })
        .collect()
}

/// The pod's `endpoints`, each as one endpoint per engine when the pod carries
/// [`DATA_PARALLEL_LABEL`] (named `NAME/dpR`, at the endpoint's address).
pub fn with_data_parallel_ranks(pod: &Pod, endpoints: Vec<Endpoint>) -> Vec<Endpoint> {
    let size = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(DATA_PARALLEL_LABEL))
        .and_then(|v| v.trim().parse::<u32>().ok())
        .filter(|n| (1..=crate::data_parallel::MAX_SIZE).contains(n))
        .unwrap_or(1);
    if size == 1 {
        return endpoints;
    }
    endpoints
        .into_iter()
        .flat_map(|e| {
            crate::data_parallel::engines(&e.name, size)
                .into_iter()
                .map(move |(name, rank)| Endpoint {
                    name,
                    data_parallel_rank: rank,
                    ..e.clone()
                })
        })
        .collect()
}

/// What kvroute reads of an `InferencePool` (`inference.networking.k8s.io/v1`): its spec's
/// `selector.matchLabels` and `targetPorts[].number`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolSpec {
    /// The pods of the pool.
    #[serde(default)]
    pub selector: PoolSelector,
    /// The ports the model servers listen on.
    #[serde(default)]
    pub target_ports: Vec<PoolPort>,
}

/// `spec.selector`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolSelector {
    /// Labels every pod of the pool has.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
}

/// One of `spec.targetPorts`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct PoolPort {
    /// The port number.
    pub number: u16,
}

impl PoolSpec {
    /// The pool's label selector (`k=v,k=v`), or `None` when it selects nothing usable (an
    /// empty selector would select every pod of the namespace).
    pub fn label_selector(&self) -> Option<String> {
        if self.selector.match_labels.is_empty() {
            return None;
        }
        let parts: Vec<String> = self
            .selector
            .match_labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        Some(parts.join(","))
    }

    /// The target ports, in order, without zeros and duplicates.
    pub fn ports(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = Vec::new();
        for p in &self.target_ports {
            if p.number > 0 && !ports.contains(&p.number) {
                ports.push(p.number);
            }
        }
        ports
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    use super::*;

    /// A pod as the API server would show it.
    pub(crate) fn pod(name: &str, labels: &[(&str, &str)], ip: Option<&str>, ready: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some("default".to_owned()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                ..Default::default()
            },
            status: Some(PodStatus {
                phase: Some("Running".to_owned()),
                pod_ip: ip.map(str::to_owned),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".to_owned(),
                    status: if ready { "True" } else { "False" }.to_owned(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn aibrix_pods_are_read_from_their_labels() {
        let p = pod("vllm-0", &[(MODEL_LABEL, "llama")], Some("10.1.2.3"), true);
        assert_eq!(
            aibrix_endpoint(&p, false),
            Some(Endpoint {
                name: "vllm-0".into(),
                model: "llama".into(),
                address: "10.1.2.3:8000".into(),
                routable: true,
                data_parallel_rank: None,
            })
        );
        let p = pod(
            "vllm-1",
            &[(MODEL_LABEL, "llama"), (PORT_LABEL, "8080")],
            Some("fd00::1"),
            false,
        );
        let e = aibrix_endpoint(&p, true).unwrap();
        assert_eq!((e.address.as_str(), e.routable), ("[fd00::1]:8080", false));
        assert_eq!(e.name, "default/vllm-1", "qualified with its namespace");
        let unlabelled = pod("x", &[], Some("10.0.0.1"), true);
        assert_eq!(aibrix_endpoint(&unlabelled, false), None);
        let no_ip = pod("y", &[(MODEL_LABEL, "llama")], None, false);
        assert_eq!(aibrix_endpoint(&no_ip, false), None);
        let worker = pod(
            "z",
            &[(MODEL_LABEL, "llama"), (RAY_NODE_TYPE, "worker")],
            Some("10.0.0.1"),
            true,
        );
        assert_eq!(aibrix_endpoint(&worker, false), None);
    }

    #[test]
    fn a_pod_is_routable_only_running_ready_with_an_ip_and_not_deleting() {
        let mut p = pod("a", &[], Some("10.0.0.1"), true);
        assert!(routable(&p));
        p.metadata.deletion_timestamp = Some(Time(Default::default()));
        assert!(!routable(&p));
        let mut p = pod("a", &[], Some("10.0.0.1"), true);
        p.status.as_mut().unwrap().phase = Some("Pending".into());
        assert!(!routable(&p));
        assert!(!routable(&pod("a", &[], None, true)));
        assert!(!routable(&pod("a", &[], Some("10.0.0.1"), false)));
    }

    #[test]
    fn a_data_parallel_pod_is_one_endpoint_per_engine() {
        fn labels(size: &str) -> [(&str, &str); 2] {
            [(MODEL_LABEL, "llama"), (DATA_PARALLEL_LABEL, size)]
        }
        let p = pod("vllm-0", &labels("3"), Some("10.1.2.3"), true);
        let got = with_data_parallel_ranks(&p, aibrix_endpoint(&p, true).into_iter().collect());
        let want: Vec<(String, Option<u32>)> = (0..3)
            .map(|r| (format!("default/vllm-0/dp{r}"), Some(r)))
            .collect();
        assert_eq!(
            got.iter()
                .map(|e| (e.name.clone(), e.data_parallel_rank))
                .collect::<Vec<_>>(),
            want
        );
        assert!(got
            .iter()
            .all(|e| e.address == "10.1.2.3:8000" && e.model == "llama" && e.routable));
        // Per port of a pool, too.
        let pool = with_data_parallel_ranks(&p, pool_endpoints(&p, &[8000, 8001], "pool"));
        assert_eq!(pool.len(), 6);
        assert_eq!(pool[5].name, "vllm-0:8001/dp2");
        // 1, 0, too large or not a number: one engine, named as before.
        for size in ["1", "0", "1025", "two", ""] {
            let p = pod("vllm-1", &labels(size), Some("10.1.2.4"), true);
            let one =
                with_data_parallel_ranks(&p, aibrix_endpoint(&p, false).into_iter().collect());
            assert_eq!(
                one.iter()
                    .map(|e| (e.name.as_str(), e.data_parallel_rank))
                    .collect::<Vec<_>>(),
                [("vllm-1", None)],
                "{size:?}"
            );
        }
    }

    #[test]
    fn pool_specs_give_a_selector_and_ports() {
        let spec: PoolSpec = serde_json::from_value(serde_json::json!({
            "selector": { "matchLabels": { "app": "vllm", "tier": "gpu" } },
            "targetPorts": [{ "number": 8000 }, { "number": 8001 }, { "number": 8000 }],
            "endpointPickerRef": { "name": "kvroute", "port": { "number": 50052 } }
        }))
        .unwrap();
        assert_eq!(spec.label_selector().as_deref(), Some("app=vllm,tier=gpu"));
        assert_eq!(spec.ports(), [8000, 8001]);
        let p = pod("vllm-0", &[("app", "vllm")], Some("10.0.0.5"), true);
        let e = pool_endpoints(&p, &spec.ports(), "pool/vllm");
        assert_eq!(e.len(), 2);
        assert_eq!(
            (e[1].name.as_str(), e[1].address.as_str()),
            ("vllm-0:8001", "10.0.0.5:8001")
        );
        assert_eq!(pool_endpoints(&p, &[8000], "m")[0].name, "vllm-0");
        assert_eq!(PoolSpec::default().label_selector(), None);
    }
}
