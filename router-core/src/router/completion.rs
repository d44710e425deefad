//! How a routed request ends, or reports on itself: its completion (release exactly once,
//! health, learning), its first token, and its detachment when its end can no longer be seen.

use super::Router;
use crate::ids::{ModelId, PodId, Ticket};
use crate::tickets::{Completion, Outcome, Released, TicketError, Timings};
use crate::time::Timestamp;
use crate::ttft;

impl Router {
    /// Releases the ticket's in-flight slot, exactly once. A second completion, or one for a
    /// ticket that expired or was never issued, is an error and changes nothing. A successful
    /// completion's timings teach `least-ttft`'s model; a first-token or total time longer than
    /// the time since routing (as the router's clock saw it) is taken as that time.
    pub fn complete(
        &mut self,
        ticket: Ticket,
        completion: Completion,
        now: Timestamp,
    ) -> Result<Released, TicketError> {
        let now = self.clock(now);
        let open = self.tickets.take(ticket)?;
        self.tickets.stats.completed[completion.outcome.index()] += 1;
        // Released before anything is learned: the slot is freed whatever learning does.
        let mut released = self.release(ticket, open.pod, open.model, open.issued, now);
        if !released.orphaned {
            released.health = self.judge(open.pod, ticket, completion.outcome, now);
        }
        if completion.outcome == Outcome::Success {
            if let Ok(p) = self.registry.pod_mut(open.pod) {
                let timings = completion.timings.at_most(now.millis_since(open.issued));
                ttft::learn(
                    &mut p.model,
                    &mut self.global,
                    &self.config.ttft,
                    open.context,
                    &timings,
                );
            }
        }
        Ok(released)
    }

    /// Reports the first token of an open request, as soon as the shell sees it (streaming
    /// proxies see it long before the completion). Only `first_token_ms` (time from routing to
    /// the first token; `None` = until `now`, and never more than that), `prompt_tokens` and
    /// `cached_tokens` of
    /// `timings` are read. The time teaches least-ttft's prefill rate or overhead a whole decode
    /// earlier than the completion would; prompt and cached tokens, when given (a stream
    /// carries usage at its first token only with vLLM's continuous usage stats), teach bytes
    /// per token and `trust`/`extra`, else the completion's usage does. What a report taught,
    /// the completion does not learn again, and the request's prefill counts as over from
    /// then on. Optional: a shell that never calls it loses nothing but that head start.
    /// Nothing is released; an unknown or closed ticket is an error and changes nothing, and a
    /// second report for the same ticket is ignored.
    pub fn first_token(
        &mut self,
        ticket: Ticket,
        timings: Timings,
        now: Timestamp,
    ) -> Result<(), TicketError> {
        let now = self.clock(now);
        let open = self.tickets.get_mut(ticket)?;
        if open.context.first_token_learned {
            return Ok(());
        }
        let (pod, issued) = (open.pod, open.issued);
        let since_routed = now.millis_since(issued);
        let timings = timings.at_most(since_routed);
        let elapsed_ms = timings.first_token_ms.unwrap_or(since_routed);
        let timings = Timings {
            first_token_ms: Some(elapsed_ms),
            ..timings
        };
        match self.registry.pod_mut(pod) {
            Ok(p) => {
                ttft::learn_first_token(
                    &mut p.model,
                    &mut self.global,
                    &self.config.ttft,
                    &mut open.context,
                    &timings,
                );
                // A probe is answered once its cached tokens have been learned.
                let answered = open.context.usage_learned && timings.cached_tokens.is_some();
                p.model
                    .first_token(ticket, issued.add_millis(elapsed_ms), answered);
            }
            Err(_) => open.context.first_token_learned = true,
        }
        Ok(())
    }

    pub(super) fn release(
        &mut self,
        ticket: Ticket,
        pod: PodId,
        model: ModelId,
        issued: Timestamp,
        now: Timestamp,
    ) -> Released {
        let orphaned = match self.registry.pod_mut(pod) {
            Ok(p) => {
                debug_assert!(p.in_flight > 0, "in-flight underflow on {pod}");
                p.in_flight = p.in_flight.saturating_sub(1);
                p.busy.set_busy(now, p.in_flight > 0);
                p.model.forget_ticket(ticket);
                false
            }
            Err(_) => {
                self.tickets.stats.orphaned += 1;
                true
            }
        };
        Released {
            pod,
            model,
            orphaned,
            age_ms: now.millis_since(issued),
            health: None,
        }
    }

    /// The shell can no longer observe how `ticket` ends (its proxy connection dropped while
    /// the response goes on): instead of releasing the slot now, while the pod is still
    /// working, the router keeps it until the request's predicted end (its predicted wait,
    /// prefill and a decode of the expected length), then releases it as
    /// [`crate::TicketStats::detached_released`]. A completion before then releases it as
    /// usual. Returns the release time. An unknown or closed ticket is an error and changes
    /// nothing.
    pub fn detach(&mut self, ticket: Ticket, now: Timestamp) -> Result<Timestamp, TicketError> {
        let now = self.clock(now);
        let open = self.tickets.get_mut(ticket)?;
        let (pod, issued, context) = (open.pod, open.issued, open.context);
        let end = match self.registry.pod(pod) {
            Ok(p) => ttft::predicted_end(&p.model, &self.global, ticket, issued, &context),
            Err(_) => now,
        };
        let at = end.max(now);
        self.tickets.detach(ticket, at)?;
        Ok(at)
    }
}
