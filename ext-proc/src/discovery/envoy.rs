//! Pods from Envoy itself (`[discovery] source = "envoy"`): inside Envoy (the dynamic module),
//! the upstream cluster's hosts and their health as Envoy sees them (EDS, DNS or static
//! endpoints; active health checks; outlier detection), published by the module's load-balancing
//! policy through an [`EnvoyFeed`] whenever Envoy updates the cluster's membership or health.
//!
//! Every host serves the one configured model (`[discovery.envoy] model`), under which every
//! request is routed, as with an InferencePool; a host's pod name is its `ip:port`. A host Envoy
//! considers unhealthy (failing active checks, ejected by outlier detection) is an unready pod:
//! kvroute does not pick it, and its in-flight requests still release.

use std::collections::BTreeMap;

use tokio::sync::watch;

use super::fleet::Fleet;
use super::pods::Endpoint;

/// One upstream host as Envoy reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvoyHost {
    /// `ip:port`.
    pub address: String,
    /// Whether Envoy would send it traffic (healthy, or degraded).
    pub healthy: bool,
}

/// Where the module publishes the cluster's hosts. Cloning shares the feed.
#[derive(Clone, Debug)]
pub struct EnvoyFeed(watch::Sender<Option<Vec<EnvoyHost>>>);

impl EnvoyFeed {
    pub(super) fn new() -> (EnvoyFeed, watch::Receiver<Option<Vec<EnvoyHost>>>) {
        let (tx, rx) = watch::channel(None);
        (EnvoyFeed(tx), rx)
    }

    /// Publishes the cluster's complete host list (sorted and deduplicated here); a list equal
    /// to the last one changes nothing.
    pub fn publish(&self, mut hosts: Vec<EnvoyHost>) {
        hosts.sort_by(|a, b| a.address.cmp(&b.address).then(b.healthy.cmp(&a.healthy)));
        hosts.dedup_by(|a, b| a.address == b.address);
        self.0.send_if_modified(|current| {
            if current.as_ref() == Some(&hosts) {
                return false;
            }
            *current = Some(hosts);
            true
        });
    }
}

/// Applies every published host list to the router until `stop` changes.
pub(super) async fn run(
    model: String,
    mut fleet: Fleet,
    mut rx: watch::Receiver<Option<Vec<EnvoyHost>>>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let hosts = rx.borrow_and_update().clone();
        if let Some(hosts) = hosts {
            let pods: BTreeMap<String, Vec<Endpoint>> = hosts
                .into_iter()
                .map(|h| {
                    let endpoint = Endpoint {
                        name: h.address.clone(),
                        model: model.clone(),
                        address: h.address.clone(),
                        routable: h.healthy,
                        data_parallel_rank: None,
                    };
                    (h.address, vec![endpoint])
                })
                .collect();
            fleet.replace(0, pods);
        }
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { return },
            _ = stop.changed() => return,
        }
    }
}
