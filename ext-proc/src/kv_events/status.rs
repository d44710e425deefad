//! What the KV-event subscriptions did, per pod, and its `/metrics` export: the subscriptions'
//! counters from [`KvEventsStatus`], the engine views' state and counts from the core
//! ([`kvroute_core::Router::kv_view`]), read at scrape time.

use std::collections::BTreeMap;
use std::sync::Arc;

use kvroute_core::Router;
use parking_lot::Mutex;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;

use crate::metrics::{counter, gauge, Labels};

/// One pod's subscription counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodStatus {
    /// The publisher endpoint.
    pub endpoint: String,
    /// Whether the subscription is up.
    pub connected: bool,
    /// Messages received (live).
    pub batches: u64,
    /// Failed connections (and transport errors).
    pub connect_errors: u64,
    /// Messages that were not `(topic, seq, payload)`.
    pub malformed: u64,
    /// Payloads that did not decode.
    pub decode_errors: u64,
    /// Sequence gaps seen.
    pub gaps: u64,
    /// Replays asked for.
    pub replays: u64,
    /// Replays that failed (timeout, connection).
    pub replay_errors: u64,
    /// Gaps given up on (the view went stale).
    pub gaps_accepted: u64,
    /// Views suspended for silence.
    pub suspensions: u64,
    /// Views dropped because the publisher was down.
    pub views_dropped: u64,
    /// The last connection or replay error.
    pub last_error: Option<String>,
}

/// Pod name → its subscription's counters. Never held across the router lock.
#[derive(Clone, Debug, Default)]
pub struct KvEventsStatus(Arc<Mutex<BTreeMap<String, PodStatus>>>);

impl KvEventsStatus {
    /// Changes `pod`'s entry (created if missing).
    pub fn update(&self, pod: &str, f: impl FnOnce(&mut PodStatus)) {
        let mut t = self.0.lock();
        match t.get_mut(pod) {
            Some(s) => f(s),
            None => f(t.entry(pod.to_owned()).or_default()),
        }
    }

    /// Drops `pod`'s entry (its subscription stopped).
    pub fn remove(&self, pod: &str) {
        self.0.lock().remove(pod);
    }

    /// Every pod's entry.
    pub fn snapshot(&self) -> BTreeMap<String, PodStatus> {
        self.0.lock().clone()
    }

    /// Registers the export over `router` and this table.
    pub fn register(&self, registry: &mut Registry, router: Arc<Mutex<Router>>) {
        registry.register_collector(Box::new(Collector {
            router,
            status: self.clone(),
        }));
    }
}

/// The states of `kvroute_kv_view_state`.
pub const VIEW_STATES: [&str; 4] = ["engine", "suspended", "stale", "none"];

#[derive(Debug)]
struct Collector {
    router: Arc<Mutex<Router>>,
    status: KvEventsStatus,
}

fn pod(name: &str) -> Labels {
    vec![("pod", name.to_owned())]
}

impl prometheus_client::collector::Collector for Collector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> std::fmt::Result {
        let views: Vec<_> = {
            let router = self.router.lock();
            router
                .pods()
                .into_iter()
                .map(|p| (p.name.to_string(), router.kv_view(p.id)))
                .collect()
        };
        let status = self.status.snapshot();
        let (mut state, mut blocks, mut bytes) = (vec![], vec![], vec![]);
        let (mut stored, mut removed, mut unkeyed, mut resets) = (vec![], vec![], vec![], vec![]);
        for (name, view) in &views {
            let now = match view {
                None => "none",
                Some(v) if !v.complete => "stale",
                Some(v) if v.suspended => "suspended",
                Some(_) => "engine",
            };
            for s in VIEW_STATES {
                let l = vec![("pod", name.clone()), ("state", s.to_owned())];
                state.push((l, i64::from(s == now)));
            }
            let Some(v) = view else { continue };
            blocks.push((pod(name), i64::try_from(v.blocks).unwrap_or(i64::MAX)));
            bytes.push((pod(name), i64::try_from(v.memory_bytes).unwrap_or(i64::MAX)));
            stored.push((pod(name), v.stored));
            removed.push((pod(name), v.removed));
            unkeyed.push((pod(name), v.unkeyed));
            resets.push((pod(name), v.resets));
        }
        gauge(&mut enc, "kvroute_kv_view_state", "Which view each pod is matched against: engine (its KV events), suspended (events stopped while requests went to it), stale (a gap was not repaired), none (no events): all but engine use the router-side index", &state)?;
        gauge(
            &mut enc,
            "kvroute_kv_view_blocks",
            "Engine blocks the pod's view holds",
            &blocks,
        )?;
        gauge(
            &mut enc,
            "kvroute_kv_view_memory_bytes",
            "Memory the pod's engine view takes",
            &bytes,
        )?;
        counter(
            &mut enc,
            "kvroute_kv_view_blocks_stored",
            "Blocks the engine reported stored and the view keyed",
            &stored,
        )?;
        counter(
            &mut enc,
            "kvroute_kv_view_blocks_removed",
            "Blocks the engine reported removed that the view held",
            &removed,
        )?;
        counter(&mut enc, "kvroute_kv_view_blocks_unkeyed", "Stored blocks the view could not key (unknown parent, multimodal or prompt-embeds extra keys)", &unkeyed)?;
        counter(
            &mut enc,
            "kvroute_kv_view_resets",
            "Times the view was emptied (engine restart, cache cleared)",
            &resets,
        )?;

        let (mut up, mut batches, mut errors, mut gaps) = (vec![], vec![], vec![], vec![]);
        for (name, s) in &status {
            up.push((pod(name), i64::from(s.connected)));
            batches.push((pod(name), s.batches));
            for (kind, n) in [
                ("connect", s.connect_errors),
                ("malformed", s.malformed),
                ("decode", s.decode_errors),
                ("replay", s.replay_errors),
            ] {
                errors.push((vec![("pod", name.clone()), ("kind", kind.to_owned())], n));
            }
            for (outcome, n) in [
                ("seen", s.gaps),
                ("replayed", s.replays),
                ("accepted", s.gaps_accepted),
            ] {
                gaps.push((vec![("pod", name.clone()), ("what", outcome.to_owned())], n));
            }
        }
        gauge(
            &mut enc,
            "kvroute_kv_events_connected",
            "Whether the pod's KV-event subscription is up",
            &up,
        )?;
        counter(
            &mut enc,
            "kvroute_kv_events_batches",
            "KV-event batches received live",
            &batches,
        )?;
        counter(
            &mut enc,
            "kvroute_kv_events_errors",
            "KV-event subscription errors, by kind",
            &errors,
        )?;
        counter(
            &mut enc,
            "kvroute_kv_events_gaps",
            "KV-event sequence gaps: seen, replays asked for, given up on (view stale)",
            &gaps,
        )?;
        Ok(())
    }
}
