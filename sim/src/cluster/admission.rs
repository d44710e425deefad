//! [`super::ClusterConfig::admission`]: requests the router holds are offered again whenever
//! capacity may have freed (a step's tokens, an engine snapshot, an arrival), in the router's
//! order; those past their deadline, and those shed at once, get a 429 that the client may
//! answer by sending again `Retry-After` later ([`super::ClusterConfig::shed_retries`]).

use kvroute_core::{Admitted, Priority, Shed, StrategySpec};

use super::flight::{Flight, Live};
use super::request::route_request;
use super::{ts, Cluster};
use crate::report::RequestRecord;
use crate::workload::Arrival;

/// The header carrying a request's priority (see [`Priority::parse`]).
pub const PRIORITY_HEADER: &str = "x-kvroute-priority";
/// The header naming a request's tenant.
pub const TENANT_HEADER: &str = "x-kvroute-tenant";

fn header<'a>(a: &'a Arrival, name: &str) -> Option<&'a str> {
    a.headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// The arrival's priority (standard when it names none or one that does not parse) and tenant.
pub(super) fn priority_and_tenant(a: &Arrival) -> (i32, Option<&str>) {
    let priority = header(a, PRIORITY_HEADER)
        .and_then(Priority::parse)
        .unwrap_or(Priority::STANDARD);
    (priority, header(a, TENANT_HEADER))
}

impl Cluster {
    /// Offers the held requests to the router, head first, until one stays held.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn pump_queue(
        &mut self,
        now: u64,
        arrivals: &[Arrival],
        specs: &[Option<StrategySpec>],
        default_strategy: &StrategySpec,
        live: &mut [Live],
        records: &mut [RequestRecord],
        flight: &mut Flight,
    ) {
        while let Some(q) = self.router.next_queued(&self.config.model) {
            let Some((id, keyed)) = self.queued.get(&q) else {
                // Not ours (cannot happen: every queued id is recorded); drop it.
                self.router.cancel_queued(q);
                continue;
            };
            let id = *id;
            let spec = specs[id].as_ref().unwrap_or(default_strategy);
            let request = route_request(&self.config.model, keyed, spec, &arrivals[id], live);
            match self.router.dispatch(q, request, ts(now)) {
                Ok(Admitted::Queued(_)) => break,
                Ok(Admitted::Routed(d)) => {
                    let (_, keyed) = self.queued.remove(&q).expect("looked up above");
                    let pod = self.routed(id, &d, keyed, now, live, records);
                    flight.dispatched(now + self.config.overhead_us, id, pod);
                }
                Ok(Admitted::Shed(shed)) => {
                    // Too late for its target (see `Router::dispatch`).
                    self.queued.remove(&q);
                    self.answer_shed(id, shed, now, live, records, flight);
                }
                Err(e) => {
                    self.queued.remove(&q);
                    records[id].error = Some(e.to_string());
                    flight.answered(id);
                }
            }
        }
    }

    /// Answers the held requests whose deadline has passed.
    pub(super) fn expire_queue(
        &mut self,
        now: u64,
        records: &mut [RequestRecord],
        live: &mut [Live],
        flight: &mut Flight,
    ) {
        let mut expired = Vec::new();
        self.router.expire_queued(ts(now), &mut expired);
        for (q, shed) in expired {
            if let Some((id, _)) = self.queued.remove(&q) {
                self.answer_shed(id, shed, now, live, records, flight);
            }
        }
    }

    fn answer_shed(
        &mut self,
        id: usize,
        shed: Shed,
        now: u64,
        live: &mut [Live],
        records: &mut [RequestRecord],
        flight: &mut Flight,
    ) {
        match self.shed(id, shed, now, live, records) {
            Some(at) => flight.retry_later(at, id),
            None => flight.answered(id),
        }
    }

    /// Records request `id`'s 429; returns when the client sends it again, if it does.
    pub(super) fn shed(
        &mut self,
        id: usize,
        shed: Shed,
        now: u64,
        live: &mut [Live],
        records: &mut [RequestRecord],
    ) -> Option<u64> {
        let rec = &mut records[id];
        rec.status = Some(429);
        rec.error = Some(format!("shed: {}", shed.reason.as_str()));
        let l = &mut live[id];
        l.sheds += 1;
        (l.sheds <= self.config.shed_retries).then(|| now + shed.retry_after_ms * 1_000)
    }
}
