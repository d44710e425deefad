//! [`ClusterConfig::pod_events`]: pods added, removed or failing at given times of a run.
//!
//! ## Contract
//! - Each pod is *listed* (the router has it, as discovery would) and *alive* (its engine
//!   runs) or not. A pod whose first event is [`PodEventKind::Add`] starts neither (it was
//!   registered and removed again, so the router never routes to it before); every other pod
//!   starts both.
//! - [`PodEventKind::Add`] needs a pod not both listed and alive: the router is told of it
//!   (`Router::add_pod` with its capacity, under a new id if it was removed), and a dead
//!   engine starts empty; an engine that was only removed keeps its work and cache.
//!   [`PodEventKind::Remove`] needs a listed pod: `Router::remove_pod` (no new requests, its
//!   index entries and engine view dropped, its open tickets orphans); its engine finishes
//!   what it holds. [`PodEventKind::Fail`] needs an alive engine: every request it holds
//!   fails (status 502, completed as [`Outcome::Reset`]), its cache is lost, and requests that
//!   reach it while it is dead fail to connect (status 503, [`Outcome::ConnectFailed`]); the
//!   router still lists it and is not told (its health tracking may eject it).
//! - The sequence is checked when the cluster is built (a pod the cluster does not have, a
//!   transition the state does not allow, times that decrease, or pod events with KV events,
//!   whose subscriber's reconnection and replay are not modelled, are errors naming the
//!   line). Events happen during the first [`Cluster::run`], at their times from its start,
//!   before anything else at the same instant.
//! - A dead engine is not scraped (no snapshot reaches the router); its gauges read 0.
//!   Counters of an engine that failed are kept, so a run's counter deltas count its work.

use std::collections::VecDeque;

use kvroute_core::{Completion, Outcome, PodSpec};

use super::flight::{Flight, Live};
use super::{pod_address, ts, Cluster, ClusterConfig, SimError};
use crate::engine::{Engine, EngineCounters};
use crate::report::RequestRecord;
use crate::workload::trace::{PodEvent, PodEventKind};

/// Each pod's state and the events to come.
#[derive(Debug)]
pub(super) struct PodStates {
    /// Whether the router lists the pod.
    pub(super) listed: Vec<bool>,
    /// Whether its engine runs.
    pub(super) alive: Vec<bool>,
    /// The cumulative counters of the engines that failed, per pod.
    retired: Vec<EngineCounters>,
    /// Events not applied yet, in time order.
    pending: VecDeque<(usize, PodEvent)>,
}

impl PodStates {
    /// The states at the start, with `config.pod_events` checked (see the module docs).
    pub(super) fn new(config: &ClusterConfig) -> Result<PodStates, SimError> {
        let n = config.pods.len();
        let mut states = PodStates {
            listed: vec![true; n],
            alive: vec![true; n],
            retired: vec![EngineCounters::default(); n],
            pending: VecDeque::new(),
        };
        let bad = |ev: &PodEvent, message: String| SimError::PodEvent {
            line: ev.line,
            message,
        };
        if let (Some(ev), true) = (config.pod_events.first(), config.kv_events) {
            return Err(bad(
                ev,
                "pod lines cannot run with KV events (a subscriber's reconnection is not modelled)"
                    .into(),
            ));
        }
        let mut seen = vec![false; n];
        let mut last = 0;
        for ev in &config.pod_events {
            let Some(pod) = config.pods.iter().position(|p| *p == ev.pod) else {
                return Err(bad(ev, format!("no pod {:?} in the cluster", ev.pod)));
            };
            if ev.at_us < last {
                return Err(bad(ev, "pod lines must not go back in time".into()));
            }
            last = ev.at_us;
            if !seen[pod] && ev.kind == PodEventKind::Add {
                states.listed[pod] = false;
                states.alive[pod] = false;
            }
            seen[pod] = true;
            states.pending.push_back((pod, ev.clone()));
        }
        // Walk the sequence on a copy to check every transition.
        let (mut listed, mut alive) = (states.listed.clone(), states.alive.clone());
        for (pod, ev) in &states.pending {
            let p = *pod;
            let allowed = match ev.kind {
                PodEventKind::Add => !(listed[p] && alive[p]),
                PodEventKind::Remove => listed[p],
                PodEventKind::Fail => alive[p],
            };
            if !allowed {
                let why = match ev.kind {
                    PodEventKind::Add => "is already serving",
                    PodEventKind::Remove => "is not listed",
                    PodEventKind::Fail => "is not running",
                };
                return Err(bad(
                    ev,
                    format!("{} {:?}: the pod {why}", ev.kind.key(), ev.pod),
                ));
            }
            match ev.kind {
                PodEventKind::Add => (listed[p], alive[p]) = (true, true),
                PodEventKind::Remove => listed[p] = false,
                PodEventKind::Fail => alive[p] = false,
            }
        }
        Ok(states)
    }

    /// When the next event is due, µs.
    pub(super) fn next_at(&self) -> Option<u64> {
        self.pending.front().map(|(_, ev)| ev.at_us)
    }

    /// Whether the pod is listed and its engine runs (as every pod is without pod events).
    pub(super) fn serving(&self, pod: usize) -> bool {
        self.listed[pod] && self.alive[pod]
    }
}

impl Cluster {
    /// Engine `e`'s cumulative counters, those of the engines it replaced included.
    pub(super) fn engine_counters(&self, e: usize) -> EngineCounters {
        let mut c = self.engines[e].counters();
        c.accumulate(&self.pod_state.retired[e]);
        c
    }

    /// Applies every pod event due at or before `now`.
    pub(super) fn apply_pod_events(
        &mut self,
        now: u64,
        live: &mut [Live],
        records: &mut [RequestRecord],
        flight: &mut Flight,
        busy_until: &mut [Option<u64>],
    ) -> Result<(), SimError> {
        while let Some((e, ev)) = self
            .pod_state
            .pending
            .front()
            .filter(|(_, ev)| ev.at_us <= now)
            .cloned()
        {
            self.pod_state.pending.pop_front();
            match ev.kind {
                PodEventKind::Add => {
                    if !self.pod_state.listed[e] {
                        let id = self.router.add_pod(
                            &self.config.model,
                            PodSpec {
                                name: &self.config.pods[e],
                                address: &pod_address(e),
                                ready: true,
                            },
                        )?;
                        let max_seqs = self.engines[e].config().max_num_seqs;
                        self.router.set_pod_capacity(
                            id,
                            self.config.router_max_seqs.unwrap_or(max_seqs),
                        )?;
                        self.pod_ids[e] = id;
                    }
                    (self.pod_state.listed[e], self.pod_state.alive[e]) = (true, true);
                }
                PodEventKind::Remove => {
                    self.router.remove_pod(self.pod_ids[e])?;
                    self.pod_state.listed[e] = false;
                }
                PodEventKind::Fail => {
                    self.fail_engine(e, now, live, records, flight)?;
                    busy_until[e] = None;
                }
            }
        }
        Ok(())
    }

    /// Engine `e` dies at `now`: the requests it holds fail; it is replaced by an empty one,
    /// dead until a `pod_add`.
    fn fail_engine(
        &mut self,
        e: usize,
        now: u64,
        live: &mut [Live],
        records: &mut [RequestRecord],
        flight: &mut Flight,
    ) -> Result<(), SimError> {
        for (id, l) in live.iter_mut().enumerate() {
            if !self.engines[e].contains(id as u64) {
                continue;
            }
            let rec = &mut records[id];
            rec.status = Some(502);
            rec.error = Some(format!("pod {} failed", self.config.pods[e]));
            if std::mem::take(&mut l.timed) {
                self.timed_open -= 1;
            }
            if let Some(ticket) = l.ticket.take() {
                let _ = self
                    .router
                    .complete(ticket, Completion::new(Outcome::Reset), ts(now));
            }
            flight.answered(id);
        }
        let counters = self.engines[e].counters();
        self.pod_state.retired[e].accumulate(&counters);
        self.engines[e] = Engine::new(*self.engines[e].config())?;
        self.pod_state.alive[e] = false;
        Ok(())
    }

    /// Request `id` reached dead engine `pod` at `now`: it fails to connect.
    pub(super) fn refuse_connection(
        &mut self,
        id: usize,
        pod: usize,
        now: u64,
        live: &mut [Live],
        records: &mut [RequestRecord],
    ) {
        let rec = &mut records[id];
        rec.status = Some(503);
        rec.error = Some(format!(
            "pod {} is down (connection refused)",
            self.config.pods[pod]
        ));
        if let Some(ticket) = live[id].ticket.take() {
            let _ = self
                .router
                .complete(ticket, Completion::new(Outcome::ConnectFailed), ts(now));
        }
    }
}
