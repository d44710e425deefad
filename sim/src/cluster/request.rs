//! One request's way through a run: sent (routed, held by the router, shed or refused),
//! handed to its engine, answered (its completion reported to the router).

use kvroute_core::{Admitted, Completion, Outcome, RouteRequest, StrategySpec, Timings};

use super::flight::{Live, Sent};
use super::{admission, ts, Cluster, Feedback, Keyed, ENVOY_TIMED_STREAMS};
use crate::report::RequestRecord;
use crate::workload::Arrival;

/// The request the router is asked to route for `a`, keyed as `keyed`; a conversation's
/// later turn sends the session id its previous turn's answer carried.
pub(super) fn route_request<'a>(
    model: &'a str,
    keyed: &'a Keyed,
    spec: &'a StrategySpec,
    a: &Arrival,
    live: &'a [Live],
) -> RouteRequest<'a> {
    let session_id = a
        .follows
        .and_then(|f| live[f.previous].session_id.as_deref());
    let mut request = RouteRequest::new(model, &keyed.hashes)
        .with_strategy(spec)
        .with_max_output_tokens(Some(a.max_tokens))
        .with_session_id(session_id);
    if let Some(t) = keyed.tokens {
        request = request.with_tokens(t);
    }
    request
}

impl Cluster {
    /// Sends request `id` at `now`: routes it ([`Router::admit`]), or leaves it held by the
    /// router, or records its 429 (or its failure).
    pub(super) fn send(
        &mut self,
        id: usize,
        a: &Arrival,
        spec: &StrategySpec,
        now: u64,
        live: &mut [Live],
        records: &mut [RequestRecord],
    ) -> Sent {
        let rec = &mut records[id];
        if rec.sent_s.is_none() {
            rec.sent_s = Some(now as f64 / 1e6);
            live[id].sent_us = now;
        }
        let keyed = match self.keyed(&a.prompt) {
            Ok(k) => k,
            Err(e) => {
                // vLLM answers a prompt it cannot tokenize with a 400; a gateway that tokenizes
                // the same way would not route it.
                rec.error = Some(e.to_string());
                rec.status = Some(400);
                return Sent::Refused { id };
            }
        };
        let (priority, tenant) = admission::priority_and_tenant(a);
        let request = route_request(&self.config.model, &keyed, spec, a, live)
            .with_priority(priority, tenant);
        match self.router.admit(request, ts(now)) {
            Ok(Admitted::Routed(d)) => {
                let pod = self.routed(id, &d, keyed, now, live, records);
                Sent::Routed {
                    due: now + self.config.overhead_us,
                    id,
                    pod,
                }
            }
            Ok(Admitted::Queued(q)) => {
                self.queued.insert(q, (id, keyed));
                Sent::Queued
            }
            Ok(Admitted::Shed(shed)) => Sent::Shed {
                id,
                retry_at: self.shed(id, shed, now, live, records),
            },
            Err(e) => {
                rec.error = Some(e.to_string());
                Sent::Refused { id }
            }
        }
    }

    /// Records a decision for request `id` routed at `now`; returns the pod's index.
    pub(super) fn routed(
        &mut self,
        id: usize,
        d: &kvroute_core::Decision,
        keyed: Keyed,
        now: u64,
        live: &mut [Live],
        records: &mut [RequestRecord],
    ) -> usize {
        let rec = &mut records[id];
        let pod = self.pod_ids.iter().position(|&p| p == d.pod).unwrap_or(0);
        // A request sent again after a 429 is judged on this answer.
        (rec.status, rec.error) = (None, None);
        rec.pod = Some(d.pod_name.to_string());
        rec.reason = Some(d.reason.as_str().to_owned());
        rec.match_percent = Some(d.match_percent);
        rec.imbalance = Some(d.imbalance);
        rec.decision = Some(d.to_string());
        rec.predicted_cached_tokens = Some(d.prediction.cached_tokens);
        rec.held_cached_tokens = Some(self.engines[pod].cached_prefix_tokens(&keyed.ids));
        if self.config.kv_events {
            let block_size = self.config.engine.block_size;
            let published = self.published[pod].cached_prefix_tokens(&keyed.ids, block_size);
            rec.published_cached_tokens = Some(published);
        }
        let l = &mut live[id];
        l.routed_us = now;
        l.pod = pod;
        l.ids = keyed.ids;
        l.ticket = Some(d.ticket);
        l.session_id.clone_from(&d.session_id);
        l.timing_budget = d.prediction.timing_budget(
            ENVOY_TIMED_STREAMS,
            self.config.router.ttft.engine_block_tokens,
        );
        pod
    }

    /// Hands a routed request to its engine; false (a failed request) if the engine rejects it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn submit(
        &mut self,
        id: usize,
        pod: usize,
        a: &Arrival,
        now: u64,
        live: &mut [Live],
        records: &mut [RequestRecord],
        busy_until: &mut [Option<u64>],
    ) -> bool {
        if !self.pod_state.alive[pod] {
            self.refuse_connection(id, pod, now, live, records);
            return false;
        }
        let tokens = std::mem::take(&mut live[id].ids);
        let submitted =
            self.engines[pod].submit_stopping(id as u64, &tokens, a.max_tokens, a.output_tokens);
        if let Err(e) = submitted {
            let rec = &mut records[id];
            rec.error = Some(e.to_string());
            rec.status = Some(400);
            if let Some(ticket) = live[id].ticket.take() {
                // A request the engine refuses (400) is the client's error: it says nothing
                // about the pod's health (a failure would count towards its ejection).
                let _ = self
                    .router
                    .complete(ticket, Completion::new(Outcome::Cancelled), ts(now));
            }
            return false;
        }
        if let Some(answer) = &a.answer {
            // Its blocks, answer included, as the next turn will send them back.
            if let Ok(ids) = self
                .config
                .prompts
                .completion(&format!("{}{answer}", a.prompt))
            {
                self.engines[pod].cache_answer(id as u64, ids);
            }
        }
        if busy_until[pod].is_none() {
            busy_until[pod] = self.engines[pod].start_step().map(|dur| now + dur);
        }
        // Accepted: the response headers are on their way, and kvroute-ext-proc decides there
        // whether to time the response.
        if self.config.feedback == Feedback::Envoy && self.timed_open < live[id].timing_budget {
            self.timed_open += 1;
            self.timed_total += 1;
            self.timed_peak = self.timed_peak.max(self.timed_open);
            live[id].timed = true;
        }
        true
    }

    pub(super) fn finish(&mut self, rec: &mut RequestRecord, l: &Live, t: u64) {
        let first = l.first_us.unwrap_or(t);
        let last = l.last_us.unwrap_or(t);
        rec.status = Some(200);
        rec.success = true;
        rec.ttft_s = Some((first - l.sent_us) as f64 / 1e6);
        // `planned_s` is a whole number of µs over 10^6: exact back to µs.
        let planned_us = (rec.planned_s * 1e6).round() as u64;
        rec.planned_ttft_s = Some(first.saturating_sub(planned_us) as f64 / 1e6);
        rec.tpot_ms =
            Some((last - first) as f64 / 1e3 / f64::from(l.generated.saturating_sub(1).max(1)));
        rec.e2e_s = Some((t - l.sent_us) as f64 / 1e6);
        rec.prompt_tokens = Some(l.prompt);
        rec.cached_tokens = Some(l.cached);
        rec.output_tokens = Some(l.generated);
        rec.judge(&self.config.slo);
        if let Some(ticket) = l.ticket {
            let total_ms = Some((t - l.routed_us) / 1000);
            if l.timed {
                self.timed_open -= 1;
            }
            let full = match self.config.feedback {
                Feedback::Streaming => true,
                Feedback::Envoy => l.timed,
                Feedback::TotalOnly => false,
            };
            let timings = if full {
                Timings {
                    first_token_ms: Some((first - l.routed_us) / 1000),
                    total_ms,
                    output_tokens: Some(l.generated),
                    cached_tokens: Some(l.cached),
                    prompt_tokens: Some(l.prompt),
                }
            } else {
                Timings {
                    total_ms,
                    ..Timings::default()
                }
            };
            let _ = self.router.complete(
                ticket,
                Completion {
                    outcome: Outcome::Success,
                    timings,
                },
                ts(t),
            );
        }
    }
}
