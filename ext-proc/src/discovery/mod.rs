//! Where the pods come from (`[discovery]`): the configuration file (`static`, the default:
//! `[models.NAME] pods = [...]`, applied on every reload), Envoy's own upstream cluster
//! (`envoy`, inside Envoy only: the dynamic module, [`envoy`]), or the Kubernetes API
//! (`kubernetes`), in one of two modes:
//!
//! - **AIBrix** (`mode = "aibrix"`): the pods labelled `model.aibrix.ai/name` in the watched
//!   namespaces serve the model that label names, at `status.podIP` and the port of the label
//!   `model.aibrix.ai/port` (8000 when absent), as AIBrix v0.7.0's gateway discovers them
//!   (`pkg/cache/informers.go`, `pkg/utils/pod.go` in vllm-project/aibrix).
//! - **InferencePool** (`mode = "inference-pool"`): the pods selected by one
//!   `InferencePool` (`inference.networking.k8s.io/v1`: `spec.selector.matchLabels`,
//!   `spec.targetPorts`), as a Gateway API Inference Extension endpoint picker does. A pool
//!   serves whatever model its model servers serve: every request, whatever its `model`, is
//!   routed over the pool's pods (under one router model named after the pool, so they share
//!   one prefix index), and the model server answers for a model it does not have.
//!
//! A pod labelled `kvroute.io/data-parallel-size: "N"` is N engines behind each of its
//! endpoints, each routed to as a pod of its own ([`crate::data_parallel`]).
//!
//! A pod is routable when it is Running, Ready, has an IP and is not being deleted; pods that
//! are listed but not routable are kept unready (their in-flight requests still release).
//! `/readyz` stays false until the first complete list. Module map: [`pods`] (what an object
//! means, no IO), [`fleet`] (applying it to the router, logs, metrics), [`kubernetes`] (the
//! list/watch task).

pub mod envoy;
pub mod fleet;
pub mod kubernetes;
pub mod pods;

use std::sync::Arc;

use prometheus_client::registry::Registry;
use serde::Deserialize;
use tokio::sync::watch;

pub use fleet::{DiscoveryMetrics, Fleet};

use crate::shared::Shared;

/// `[discovery]` as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiscoverySection {
    /// `static` (default), `kubernetes`, or `envoy` (inside Envoy only).
    pub source: Option<String>,
    /// `[discovery.kubernetes]`.
    pub kubernetes: Option<KubernetesSection>,
    /// `[discovery.envoy]`.
    pub envoy: Option<EnvoySection>,
}

/// `[discovery.envoy]` as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvoySection {
    /// The model every host of Envoy's upstream cluster serves (required).
    pub model: Option<String>,
}

/// `[discovery.kubernetes]` as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesSection {
    /// `aibrix` (default) or `inference-pool`.
    pub mode: Option<String>,
    /// AIBrix mode: the namespaces watched; absent or empty = every namespace (AIBrix's
    /// behaviour; needs a ClusterRole).
    pub namespaces: Option<Vec<String>>,
    /// InferencePool mode: the pool's name (required).
    pub pool_name: Option<String>,
    /// InferencePool mode: its namespace (default `default`).
    pub pool_namespace: Option<String>,
    /// The API server's URL, without credentials (a `kubectl proxy`, or a test server);
    /// default: the local kubeconfig if there is one, else the in-cluster service account.
    pub api_server: Option<String>,
}

/// Where pods come from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Discovery {
    /// From the configuration file's `[models.NAME]` sections.
    #[default]
    Static,
    /// From the Kubernetes API.
    Kubernetes(KubernetesConfig),
    /// From Envoy's upstream cluster, inside Envoy (see [`envoy`]).
    Envoy {
        /// The model every host serves, and every request is routed under.
        model: String,
    },
}

/// A validated `[discovery.kubernetes]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubernetesConfig {
    /// What is watched.
    pub mode: Mode,
    /// The API server's URL, if given.
    pub api_server: Option<String>,
}

/// What the Kubernetes source watches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Pods labelled `model.aibrix.ai/name` in these namespaces (empty = all).
    Aibrix {
        /// The namespaces.
        namespaces: Vec<String>,
    },
    /// The pods of one InferencePool.
    InferencePool {
        /// Its name.
        name: String,
        /// Its namespace.
        namespace: String,
    },
}

/// Why `[discovery]` was rejected.
#[derive(Debug, thiserror::Error)]
#[error("invalid [discovery] setting: {0}")]
pub struct DiscoveryError(String);

impl DiscoverySection {
    /// Validates the section.
    pub fn build(&self) -> Result<Discovery, DiscoveryError> {
        let source = self.source.as_deref().unwrap_or("static");
        if self.envoy.is_some() && source != "envoy" {
            return Err(DiscoveryError(
                "[discovery.envoy] is given but source is not \"envoy\"".into(),
            ));
        }
        if self.kubernetes.is_some() && source == "envoy" {
            return Err(DiscoveryError(
                "[discovery.kubernetes] is given but source is \"envoy\"".into(),
            ));
        }
        match source {
            "envoy" => {
                let model = self
                    .envoy
                    .as_ref()
                    .and_then(|e| e.model.clone())
                    .filter(|m| !m.is_empty())
                    .ok_or_else(|| {
                        DiscoveryError(
                            "source = \"envoy\" needs [discovery.envoy] model, the model every host of the cluster serves".into(),
                        )
                    })?;
                Ok(Discovery::Envoy { model })
            }
            "static" => {
                if self.kubernetes.is_some() {
                    return Err(DiscoveryError(
                        "[discovery.kubernetes] is given but source is not \"kubernetes\"".into(),
                    ));
                }
                Ok(Discovery::Static)
            }
            "kubernetes" => {
                let k = self.kubernetes.clone().unwrap_or_default();
                let mode = match k.mode.as_deref().unwrap_or("aibrix") {
                    "aibrix" => {
                        if k.pool_name.is_some() || k.pool_namespace.is_some() {
                            return Err(DiscoveryError(
                                "pool_name and pool_namespace are for mode = \"inference-pool\""
                                    .into(),
                            ));
                        }
                        let namespaces = k.namespaces.unwrap_or_default();
                        if namespaces.iter().any(|n| n.is_empty()) {
                            return Err(DiscoveryError("empty namespace name".into()));
                        }
                        Mode::Aibrix { namespaces }
                    }
                    "inference-pool" => {
                        if k.namespaces.is_some() {
                            return Err(DiscoveryError(
                                "namespaces is for mode = \"aibrix\"; an InferencePool's pods are in pool_namespace".into(),
                            ));
                        }
                        let name = k.pool_name.filter(|n| !n.is_empty()).ok_or_else(|| {
                            DiscoveryError("mode = \"inference-pool\" needs pool_name".into())
                        })?;
                        Mode::InferencePool {
                            name,
                            namespace: k.pool_namespace.unwrap_or_else(|| "default".into()),
                        }
                    }
                    other => {
                        return Err(DiscoveryError(format!(
                            "unknown mode {other:?} (aibrix or inference-pool)"
                        )))
                    }
                };
                if let Some(url) = &k.api_server {
                    if !(url.starts_with("http://") || url.starts_with("https://")) {
                        return Err(DiscoveryError(format!(
                            "api_server {url:?} must be an http:// or https:// URL"
                        )));
                    }
                }
                Ok(Discovery::Kubernetes(KubernetesConfig {
                    mode,
                    api_server: k.api_server,
                }))
            }
            other => Err(DiscoveryError(format!(
                "unknown source {other:?} (static, kubernetes or envoy)"
            ))),
        }
    }
}

impl Discovery {
    /// The router model every request is routed under, when the source decides it (an
    /// InferencePool serves every model its servers have).
    pub fn routing_model(&self) -> Option<String> {
        match self {
            Discovery::Kubernetes(KubernetesConfig {
                mode: Mode::InferencePool { name, .. },
                ..
            }) => Some(pool_model(name)),
            Discovery::Envoy { model } => Some(model.clone()),
            _ => None,
        }
    }

    /// Whether pods come from the configuration file.
    pub fn is_static(&self) -> bool {
        matches!(self, Discovery::Static)
    }
}

/// The router model of an InferencePool's pods: the pool's name.
pub fn pool_model(pool: &str) -> String {
    pool.to_owned()
}

/// The discovery source as a running part of the service: its metrics (registered at
/// start-up) and its task.
#[derive(Debug)]
pub struct Source {
    discovery: Discovery,
    metrics: DiscoveryMetrics,
    envoy: Option<(
        envoy::EnvoyFeed,
        watch::Receiver<Option<Vec<envoy::EnvoyHost>>>,
    )>,
}

impl Source {
    /// Registers the source's metrics.
    pub fn register(discovery: Discovery, registry: &mut Registry) -> Source {
        let envoy = matches!(discovery, Discovery::Envoy { .. }).then(envoy::EnvoyFeed::new);
        Source {
            discovery,
            metrics: DiscoveryMetrics::register(registry),
            envoy,
        }
    }

    /// Where Envoy publishes its hosts, for `source = "envoy"`.
    pub fn envoy_feed(&self) -> Option<envoy::EnvoyFeed> {
        self.envoy.as_ref().map(|(feed, _)| feed.clone())
    }

    /// Starts watching (nothing to do for the static source, which the configuration applies)
    /// until `stop` changes. The service is not ready until the first list is complete.
    pub fn spawn(self, shared: Arc<Shared>, stop: watch::Receiver<bool>) {
        match self.discovery {
            Discovery::Static => shared.set_discovery_synced(true),
            Discovery::Envoy { model } => {
                // Known from the start: requests get 503 (no ready pod) until Envoy's first
                // membership update.
                {
                    let mut router = shared.router.lock();
                    let _ = router.add_model(&model);
                    shared.apply_admission(&mut router, &model);
                }
                let fleet = Fleet::new(shared, self.metrics, 1);
                if let Some((_, rx)) = self.envoy {
                    tokio::spawn(envoy::run(model, fleet, rx, stop));
                }
            }
            Discovery::Kubernetes(cfg) => {
                let scopes = match &cfg.mode {
                    Mode::Aibrix { namespaces } => namespaces.len().max(1),
                    Mode::InferencePool { .. } => 1,
                };
                if let Mode::InferencePool { name, .. } = &cfg.mode {
                    // Known from the start: requests get 503 (no ready pod), not 400, until
                    // the pool's pods are listed.
                    let mut router = shared.router.lock();
                    let _ = router.add_model(&pool_model(name));
                    shared.apply_admission(&mut router, &pool_model(name));
                }
                let fleet = Fleet::new(shared, self.metrics, scopes);
                tokio::spawn(kubernetes::run(cfg, fleet, stop));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(text: &str) -> Result<Discovery, DiscoveryError> {
        #[derive(Deserialize)]
        struct File {
            discovery: DiscoverySection,
        }
        toml::from_str::<File>(text).unwrap().discovery.build()
    }

    #[test]
    fn the_section_is_validated() {
        assert_eq!(build("[discovery]").unwrap(), Discovery::Static);
        let k = build("[discovery]\nsource = \"kubernetes\"").unwrap();
        assert_eq!(
            k,
            Discovery::Kubernetes(KubernetesConfig {
                mode: Mode::Aibrix { namespaces: vec![] },
                api_server: None
            })
        );
        assert_eq!(k.routing_model(), None);
        let pool = build("[discovery]\nsource = \"kubernetes\"\n[discovery.kubernetes]\nmode = \"inference-pool\"\npool_name = \"p\"").unwrap();
        assert_eq!(pool.routing_model().as_deref(), Some("p"));
        let e = build("[discovery]\nsource = \"envoy\"\n[discovery.envoy]\nmodel = \"m\"").unwrap();
        assert_eq!(e, Discovery::Envoy { model: "m".into() });
        assert_eq!(e.routing_model().as_deref(), Some("m"));
        for bad in [
            "[discovery]\nsource = \"envoy\"",
            "[discovery]\nsource = \"envoy\"\n[discovery.envoy]\nmodel = \"\"",
            "[discovery]\n[discovery.envoy]\nmodel = \"m\"",
            "[discovery]\nsource = \"envoy\"\n[discovery.envoy]\nmodel = \"m\"\n[discovery.kubernetes]\n",
            "[discovery]\nsource = \"dns\"",
            "[discovery]\n[discovery.kubernetes]\nmode = \"aibrix\"",
            "[discovery]\nsource = \"kubernetes\"\n[discovery.kubernetes]\nmode = \"inference-pool\"",
            "[discovery]\nsource = \"kubernetes\"\n[discovery.kubernetes]\nmode = \"x\"",
            "[discovery]\nsource = \"kubernetes\"\n[discovery.kubernetes]\npool_name = \"p\"",
            "[discovery]\nsource = \"kubernetes\"\n[discovery.kubernetes]\nnamespaces = [\"\"]",
            "[discovery]\nsource = \"kubernetes\"\n[discovery.kubernetes]\napi_server = \"localhost:1\"",
        ] {
            assert!(build(bad).is_err(), "{bad}");
        }
    }
}
