//! The Kubernetes source: list then watch pods (and, in InferencePool mode, the pool) with the
//! `kube` client's watcher, which resumes a dropped watch from the last resource version,
//! relists on 410 Gone (then [`Fleet::replace`] drops the pods that went away meanwhile), and
//! is polled through a backoff after errors.
//!
//! RBAC it needs, nothing else: `list` and `watch` on `pods` (in the watched namespaces), and
//! in InferencePool mode `list` and `watch` on `inferencepools.inference.networking.k8s.io`.

use std::collections::BTreeMap;
use std::pin::Pin;

use futures_util::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use tokio::sync::watch;

use super::fleet::Fleet;
use super::pods::{self, Endpoint, PoolSpec};
use super::{KubernetesConfig, Mode};

type Events<K> = Pin<Box<dyn Stream<Item = (usize, Result<Event<K>, watcher::Error>)> + Send>>;

/// Builds the API client: `api_server` when given (no credentials: a local proxy or a test
/// server), else what `kube::Config::infer` finds (the local kubeconfig, else the in-cluster
/// service account).
async fn client(cfg: &KubernetesConfig) -> Result<kube::Client, String> {
    let config = match &cfg.api_server {
        Some(url) => kube::Config::new(url.parse().map_err(|e| format!("{e}"))?),
        None => kube::Config::infer().await.map_err(|e| e.to_string())?,
    };
    kube::Client::try_from(config).map_err(|e| e.to_string())
}

/// Runs discovery until `stop` changes.
pub async fn run(cfg: KubernetesConfig, mut fleet: Fleet, mut stop: watch::Receiver<bool>) {
    let mut delay = std::time::Duration::from_millis(500);
    let client = loop {
        match client(&cfg).await {
            Ok(c) => break c,
            Err(e) => {
                fleet.metrics().error();
                tracing::error!(error = %e, "discovery: cannot build the Kubernetes client; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = stop.changed() => return,
                }
                delay = (delay * 2).min(std::time::Duration::from_secs(30));
            }
        }
    };
    match &cfg.mode {
        Mode::Aibrix { namespaces } => aibrix(client, namespaces, &mut fleet, stop).await,
        Mode::InferencePool { name, namespace } => {
            pool(client, name, namespace, &mut fleet, stop).await
        }
    }
}

/// A watcher's events, tagged with `scope`, with the default backoff after errors.
fn tagged<K>(api: Api<K>, config: watcher::Config, scope: usize) -> Events<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    watcher::watcher(api, config)
        .default_backoff()
        .map(move |e| (scope, e))
        .boxed()
}

/// Per-scope relist buffers: `Init` opens one, `InitApply` fills it, `InitDone` hands it over.
#[derive(Default)]
struct Relists(BTreeMap<usize, BTreeMap<String, Vec<Endpoint>>>);

/// Applies one pod event of `scope` to the fleet, with `endpoints` telling what a pod is.
fn on_pod_event(
    fleet: &mut Fleet,
    relists: &mut Relists,
    scope: usize,
    event: Result<Event<Pod>, watcher::Error>,
    endpoints: &dyn Fn(&Pod) -> Vec<Endpoint>,
) {
    let name = pods::key;
    match event {
        Ok(Event::Init) => {
            relists.0.insert(scope, BTreeMap::new());
        }
        Ok(Event::InitApply(p)) => {
            let list = relists.0.entry(scope).or_default();
            list.insert(name(&p), endpoints(&p));
        }
        Ok(Event::InitDone) => {
            let list = relists.0.remove(&scope).unwrap_or_default();
            fleet.replace(scope, list);
        }
        Ok(Event::Apply(p)) => fleet.upsert(scope, &name(&p), endpoints(&p)),
        Ok(Event::Delete(p)) => fleet.remove(scope, &name(&p)),
        Err(e) => {
            fleet.metrics().error();
            tracing::warn!(error = %e, "discovery: pod list/watch failed; retrying with backoff");
        }
    }
}

/// AIBrix mode: the pods labelled `model.aibrix.ai/name` in each namespace (all when none is
/// given).
async fn aibrix(
    client: kube::Client,
    namespaces: &[String],
    fleet: &mut Fleet,
    mut stop: watch::Receiver<bool>,
) {
    let config = watcher::Config::default().labels(pods::MODEL_LABEL);
    let apis: Vec<Api<Pod>> = if namespaces.is_empty() {
        vec![Api::all(client)]
    } else {
        namespaces
            .iter()
            .map(|ns| Api::namespaced(client.clone(), ns))
            .collect()
    };
    let mut events = futures_util::stream::select_all(
        apis.into_iter()
            .enumerate()
            .map(|(scope, api)| tagged(api, config.clone(), scope)),
    );
    let mut relists = Relists::default();
    // One namespace: pods are named as in it (AIBrix's `target-pod`); several or all: a name
    // can repeat across them, so `namespace/name`.
    let qualified = namespaces.len() != 1;
    let endpoints = |p: &Pod| {
        pods::with_data_parallel_ranks(p, pods::aibrix_endpoint(p, qualified).into_iter().collect())
    };
    loop {
        tokio::select! {
            next = events.next() => match next {
                Some((scope, event)) => on_pod_event(fleet, &mut relists, scope, event, &endpoints),
                None => return,
            },
            _ = stop.changed() => return,
        }
    }
}

/// The `InferencePool` resource (`inference.networking.k8s.io/v1`).
fn pool_resource() -> ApiResource {
    let gvk = GroupVersionKind::gvk("inference.networking.k8s.io", "v1", "InferencePool");
    ApiResource::from_gvk_with_plural(&gvk, "inferencepools")
}

/// The pod scope in InferencePool mode (the pool itself has no endpoints).
const POOL_PODS: usize = 0;

/// InferencePool mode: the pool `name`, and the pods its selector picks, watched again
/// whenever the selector or the target ports change.
async fn pool(
    client: kube::Client,
    name: &str,
    namespace: &str,
    fleet: &mut Fleet,
    mut stop: watch::Receiver<bool>,
) {
    let model = super::pool_model(name);
    let pools: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &pool_resource());
    let pool_config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut pool_events = watcher::watcher(pools, pool_config)
        .default_backoff()
        .boxed();
    let mut spec: Option<PoolSpec> = None;
    let mut pod_events: Option<Events<Pod>> = None;
    let mut relists = Relists::default();
    let mut listed_pool = false;
    // Whether the pool was in the current (re)list: a pool deleted while the watch was down
    // shows only as its absence from the relist.
    let mut pool_in_list = false;
    loop {
        let next_pod = async {
            match pod_events.as_mut() {
                Some(s) => s.next().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            event = pool_events.next() => {
                let Some(event) = event else { return };
                let seen = match event {
                    Ok(Event::InitApply(p)) => {
                        pool_in_list = true;
                        Some(Some(p))
                    }
                    Ok(Event::Apply(p)) => Some(Some(p)),
                    Ok(Event::Delete(_)) => Some(None),
                    Ok(Event::Init) => {
                        pool_in_list = false;
                        None
                    }
                    Ok(Event::InitDone) if !pool_in_list => {
                        if !listed_pool || spec.is_some() {
                            tracing::error!(pool = name, namespace, "discovery: InferencePool not found; no pods until it exists");
                        }
                        listed_pool = true;
                        spec = None;
                        pod_events = None;
                        relists = Relists::default();
                        fleet.replace(POOL_PODS, BTreeMap::new());
                        None
                    }
                    Ok(Event::InitDone) => {
                        listed_pool = true;
                        None
                    }
                    Err(e) => {
                        fleet.metrics().error();
                        tracing::warn!(error = %e, "discovery: InferencePool list/watch failed; retrying with backoff");
                        None
                    }
                };
                match seen {
                    Some(Some(obj)) => {
                        let new: PoolSpec = match serde_json::from_value(obj.data.get("spec").cloned().unwrap_or_default()) {
                            Ok(s) => s,
                            Err(e) => {
                                fleet.metrics().error();
                                tracing::error!(pool = name, error = %e, "discovery: InferencePool spec unreadable; keeping the last one");
                                continue;
                            }
                        };
                        if spec.as_ref() == Some(&new) {
                            continue;
                        }
                        match new.label_selector() {
                            Some(selector) if !new.ports().is_empty() => {
                                tracing::info!(pool = name, %selector, ports = ?new.ports(), "discovery: InferencePool selector and ports");
                                let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
                                let config = watcher::Config::default().labels(&selector);
                                pod_events = Some(tagged(pods, config, POOL_PODS));
                                relists = Relists::default();
                            }
                            _ => {
                                tracing::error!(pool = name, "discovery: InferencePool has no selector labels or no target port; no pods");
                                pod_events = None;
                                fleet.replace(POOL_PODS, BTreeMap::new());
                            }
                        }
                        spec = Some(new);
                    }
                    Some(None) => {
                        tracing::error!(pool = name, "discovery: InferencePool deleted; its pods are removed");
                        spec = None;
                        pod_events = None;
                        fleet.replace(POOL_PODS, BTreeMap::new());
                    }
                    None => {}
                }
            }
            event = next_pod => {
                let Some((scope, event)) = event else { pod_events = None; continue };
                let ports = spec.as_ref().map(PoolSpec::ports).unwrap_or_default();
                let endpoints = |p: &Pod| {
                    pods::with_data_parallel_ranks(p, pods::pool_endpoints(p, &ports, &model))
                };
                on_pod_event(fleet, &mut relists, scope, event, &endpoints);
            }
            _ = stop.changed() => return,
        }
    }
}
