//! The router side of discovery: the endpoints a source sees, applied to the router as pod
//! additions, updates and removals, logged one line per change, and counted in
//! `kvroute_discovery_pods{model,state}`.
//!
//! Pods are grouped by *scope* (one per list/watch stream: a namespace, or the pool's pods) so
//! that a stream's relist replaces exactly what that stream had reported. Changes keep in-flight
//! state: an address or readiness change updates the pod in place (its in-flight count and
//! open tickets stay), and a removed pod's open tickets become orphans the router still
//! releases exactly once.

use std::collections::BTreeMap;
use std::sync::Arc;

use kvroute_core::PodSpec;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::pods::Endpoint;
use crate::shared::Shared;

/// Discovery's metrics.
#[derive(Clone, Debug, Default)]
pub struct DiscoveryMetrics {
    pods: Family<Vec<(&'static str, String)>, Gauge>,
    errors: Counter,
}

impl DiscoveryMetrics {
    /// Creates and registers `kvroute_discovery_pods{model,state}` and
    /// `kvroute_discovery_errors_total`.
    pub fn register(registry: &mut Registry) -> DiscoveryMetrics {
        let m = DiscoveryMetrics::default();
        registry.register(
            "kvroute_discovery_pods",
            "Pods discovery currently sees, by model and state (ready: routable; unready: listed but not Running and Ready, or being deleted)",
            m.pods.clone(),
        );
        registry.register(
            "kvroute_discovery_errors",
            "Failed list, watch or client set-up calls to the Kubernetes API (each is retried with backoff)",
            m.errors.clone(),
        );
        m
    }

    /// Counts one failed API call.
    pub fn error(&self) {
        self.errors.inc();
    }

    /// Failed API calls so far.
    pub fn errors(&self) -> u64 {
        self.errors.get()
    }
}

type PodKey = (usize, String);

/// The endpoints discovery has applied, by scope and pod name.
#[derive(Debug)]
pub struct Fleet {
    shared: Arc<Shared>,
    metrics: DiscoveryMetrics,
    known: BTreeMap<PodKey, Vec<Endpoint>>,
    /// Scopes that completed their first list.
    synced: Vec<bool>,
}

impl Fleet {
    /// A fleet of `scopes` list/watch streams feeding the router in `shared`. The service is
    /// not ready (`/readyz`) until every scope has completed its first list.
    pub fn new(shared: Arc<Shared>, metrics: DiscoveryMetrics, scopes: usize) -> Fleet {
        shared.set_discovery_synced(scopes == 0);
        Fleet {
            shared,
            metrics,
            known: BTreeMap::new(),
            synced: vec![false; scopes],
        }
    }

    /// The metrics.
    pub fn metrics(&self) -> &DiscoveryMetrics {
        &self.metrics
    }

    /// Sets a pod's endpoints (none: it has none now, e.g. no IP yet).
    pub fn upsert(&mut self, scope: usize, pod: &str, endpoints: Vec<Endpoint>) {
        let key = (scope, pod.to_owned());
        let old = self.known.remove(&key).unwrap_or_default();
        self.apply(&old, &endpoints);
        if !endpoints.is_empty() {
            self.known.insert(key, endpoints);
        }
        self.export();
    }

    /// Removes a pod.
    pub fn remove(&mut self, scope: usize, pod: &str) {
        if let Some(old) = self.known.remove(&(scope, pod.to_owned())) {
            self.apply(&old, &[]);
        }
        self.export();
    }

    /// A complete list of the scope's pods: pods it no longer has are removed (a relist after
    /// a dropped watch or 410 Gone loses nothing and keeps nothing stale).
    pub fn replace(&mut self, scope: usize, pods: BTreeMap<String, Vec<Endpoint>>) {
        let gone: Vec<PodKey> = self
            .known
            .keys()
            .filter(|(s, name)| *s == scope && !pods.contains_key(name))
            .cloned()
            .collect();
        for key in gone {
            if let Some(old) = self.known.remove(&key) {
                self.apply(&old, &[]);
            }
        }
        for (pod, endpoints) in pods {
            let key = (scope, pod);
            let old = self.known.remove(&key).unwrap_or_default();
            self.apply(&old, &endpoints);
            if !endpoints.is_empty() {
                self.known.insert(key, endpoints);
            }
        }
        if let Some(s) = self.synced.get_mut(scope) {
            if !*s {
                *s = true;
                if self.synced.iter().all(|s| *s) {
                    tracing::info!(pods = self.known.len(), "discovery: first list complete");
                    self.shared.set_discovery_synced(true);
                }
            }
        }
        self.export();
    }

    /// Every endpoint currently applied.
    pub fn endpoints(&self) -> impl Iterator<Item = &Endpoint> {
        self.known.values().flatten()
    }

    /// Applies the change from `old` to `new` endpoints of one pod to the router.
    fn apply(&self, old: &[Endpoint], new: &[Endpoint]) {
        let max_seqs = self.shared.router.lock().config().ttft.max_seqs;
        for e in old {
            if !new.iter().any(|n| n.name == e.name) {
                let mut router = self.shared.router.lock();
                if let Some(id) = router.pod_id(&e.name) {
                    let open = router.in_flight(id).unwrap_or(0);
                    let _ = router.remove_pod(id);
                    drop(router);
                    tracing::info!(pod = %e.name, model = %e.model, address = %e.address, in_flight = open, "discovery: pod removed");
                }
            }
        }
        for n in new {
            let before = old.iter().find(|o| o.name == n.name);
            if before == Some(n) {
                continue;
            }
            let mut router = self.shared.router.lock();
            if let Some(b) = before.filter(|b| b.model != n.model) {
                if let Some(id) = router.pod_id(&b.name) {
                    let _ = router.detach_pod(&b.model, id);
                }
            }
            let spec = PodSpec {
                name: &n.name,
                address: &n.address,
                ready: n.routable,
            };
            let added = router.add_pod(&n.model, spec).map(|id| {
                if before.is_none() {
                    let _ = router.set_pod_capacity(id, max_seqs);
                }
                let _ = router.set_pod_data_parallel_rank(id, n.data_parallel_rank);
            });
            if added.is_ok() {
                // The model may be new: its [admission] policy, if any.
                self.shared.apply_admission(&mut router, &n.model);
            }
            drop(router);
            match (added, before) {
                (Err(e), _) => {
                    tracing::warn!(pod = %n.name, address = %n.address, error = %e, "discovery: pod refused")
                }
                (Ok(()), None) => {
                    tracing::info!(pod = %n.name, model = %n.model, address = %n.address, ready = n.routable, "discovery: pod added")
                }
                (Ok(()), Some(b)) => {
                    if b.routable != n.routable {
                        tracing::info!(pod = %n.name, ready = n.routable, "discovery: pod readiness changed");
                    }
                    if b.address != n.address {
                        tracing::info!(pod = %n.name, from = %b.address, to = %n.address, "discovery: pod address changed");
                    }
                    if b.model != n.model {
                        tracing::info!(pod = %n.name, from = %b.model, to = %n.model, "discovery: pod model changed");
                    }
                }
            }
        }
        // A pod added, back in service or removed: the held requests are offered again.
        self.shared.holds.kick();
    }

    fn export(&self) {
        self.metrics.pods.clear();
        // A data-parallel server's engines are one pod (its rank 0).
        for e in self
            .endpoints()
            .filter(|e| e.data_parallel_rank.unwrap_or(0) == 0)
        {
            let state = if e.routable { "ready" } else { "unready" };
            self.metrics
                .pods
                .get_or_create(&vec![
                    ("model", e.model.clone()),
                    ("state", state.to_owned()),
                ])
                .inc();
        }
    }
}
