//! [`TicketGuard`]: releases a routed request's in-flight slot exactly once.
//!
//! The guard is created right after [`kvroute_core::Router::route`] returns a decision and is
//! owned by that request's stream state, which lives in the reply stream
//! tonic polls for the ext_proc stream (no task of its own: [`crate::service`]). With
//! `response_trailer_mode: SEND` Envoy keeps that stream open until the HTTP response is over
//! (finished, aborted, reset or failed) and closes it within about a millisecond
//! (measured with Envoy 1.40). tonic then drops the reply stream, the state and the guard: `Drop`
//! is the only release path, and Rust runs it exactly once, also when unwinding. A release
//! wakes admission's pump ([`crate::admission`]): the slot may go to a held request.
//!
//! The outcome reported is what [`ResponseEnd::outcome`] makes of the response headers (status
//! and Envoy's `response.code_details`): success, failed (a 5xx from the pod), connect failure,
//! reset or timeout (Envoy's own replies), or cancelled when no response headers came (the
//! client left first); a client abort after the headers cannot be told from a normal end (see
//! below). The core turns failures into pod ejections ([`kvroute_core::HealthConfig`]); what
//! changes is logged here.
//!
//! Timings reported with the completion ([`Timings`]):
//! - `total_ms` (route → end of the side stream, which Envoy closes within about a
//!   millisecond of the response's end) only when the response headers were seen with a 2xx
//!   status and the outcome is still `Success`. Failed requests (5xx, no response) and
//!   requests whose response headers were not seen (response-headers phase SKIP, or the client
//!   left before the response started) report no timings.
//! - `first_token_ms`, `prompt_tokens`, `output_tokens` and `cached_tokens` only for a response
//!   kvroute timed ([`crate::stream_timing`]: its first body chunk and its usage event), under
//!   the same conditions as `total_ms`. For the others the response headers are all there is,
//!   and they are not the first token: `kvroute-sim serve` (axum `Body::from_stream`) and vLLM
//!   (`StreamingResponse`) send a streaming response's headers before the first token is
//!   computed, and a non-streaming response's only after the last one.
//! - Client aborts mid-response cannot be told from normal ends: with `response_trailer_mode:
//!   SEND` and body `NONE`, Envoy ends the side stream the same clean way for both
//!   (measured against Envoy 1.40). Such a request reports `Success` with a short
//!   `total_ms`; the core's bounded learning limits what one such sample can move.

use std::time::Instant;

use std::sync::Arc;

use kvroute_core::{Completion, Outcome, Ticket, Timings};

use crate::health::ResponseEnd;
use crate::shared::Shared;
use crate::stream_timing::ResponseTiming;

/// Owns one open ticket; dropping it completes the ticket.
#[derive(Debug)]
pub struct TicketGuard {
    shared: Arc<Shared>,
    ticket: Ticket,
    /// The model routed for and the pod chosen (for the first-token metric).
    model: Arc<str>,
    pod: Arc<str>,
    routed_at: Instant,
    response: ResponseEnd,
    timing: Option<ResponseTiming>,
    /// Detach instead of completing at drop ([`TicketGuard::detach`]).
    detached: bool,
}

impl TicketGuard {
    /// Takes ownership of `ticket` (just issued by the router in `shared` for `model`, to
    /// `pod`).
    pub fn new(shared: Arc<Shared>, ticket: Ticket, model: Arc<str>, pod: Arc<str>) -> Self {
        TicketGuard {
            shared,
            ticket,
            model,
            pod,
            routed_at: Instant::now(),
            response: ResponseEnd::default(),
            timing: None,
            detached: false,
        }
    }

    /// Records what the response headers said (their status, and Envoy's code details when it
    /// sent them).
    pub fn on_response(&mut self, response: ResponseEnd) {
        self.response = response;
    }

    /// At drop, hand the ticket to [`kvroute_core::Router::detach`] (the slot is held until
    /// the request's predicted end) instead of completing it: the side stream's end no longer
    /// says the response ended.
    pub fn detach(&mut self) {
        self.detached = true;
    }

    /// Times the response's body from now on (kvroute asked Envoy to stream it through).
    pub fn time_response(&mut self, timing: ResponseTiming) {
        self.timing = Some(timing);
    }

    /// The timing of the response, when it is timed.
    pub fn timing_mut(&mut self) -> Option<&mut ResponseTiming> {
        self.timing.as_mut()
    }

    /// What is reported at release, `now` being the release instant (see the module docs).
    pub fn completion(&self, now: Instant) -> Completion {
        let mut c = Completion::new(self.response.outcome());
        let ok = self
            .response
            .status
            .is_some_and(|s| (200..300).contains(&s));
        if c.outcome == Outcome::Success && ok {
            let ms = |at: Instant| {
                u64::try_from(at.saturating_duration_since(self.routed_at).as_millis())
                    .unwrap_or(u64::MAX)
            };
            let timing = self.timing.as_ref();
            let usage = timing.and_then(ResponseTiming::usage).unwrap_or_default();
            c.timings = Timings {
                total_ms: Some(ms(now)),
                first_token_ms: timing.and_then(ResponseTiming::first_chunk).map(ms),
                prompt_tokens: usage.prompt_tokens,
                output_tokens: usage.completion_tokens,
                cached_tokens: usage.cached_tokens,
            };
        }
        c
    }
}

impl Drop for TicketGuard {
    fn drop(&mut self) {
        if self.detached {
            let now = self.shared.now();
            let result = self.shared.router.lock().detach(self.ticket, now);
            self.shared.holds.kick();
            match result {
                Ok(at) => tracing::warn!(
                    ticket = %self.ticket,
                    release_in_ms = at.as_millis().saturating_sub(now.as_millis()),
                    "ext_proc connection lost mid-request: its slot is held until its predicted end"
                ),
                Err(e) => {
                    self.shared.metrics.release_error();
                    tracing::error!(ticket = %self.ticket, error = %e, "ticket detach refused");
                }
            }
            return;
        }
        let completion = self.completion(Instant::now());
        // A successful 2xx response carries a total time.
        if let (Some(t), Some(_)) = (&self.timing, completion.timings.total_ms) {
            let had_body = t.first_chunk().is_some();
            if self.shared.metrics.timed_response_succeeded(had_body) {
                tracing::warn!(
                    "timed responses end without their body passing through kvroute: Envoy \
                     ignores the mode override; set allow_mode_override: true on its ext_proc \
                     filter, or [stream_timing] max_streams = 0 (shown once; see \
                     kvroute_timed_responses_without_body_total)"
                );
            }
        }
        if let Some(ms) = completion.timings.first_token_ms {
            let seconds = ms as f64 / 1_000.0;
            let metrics = &self.shared.metrics;
            metrics.observe_first_token(&self.model, &self.pod, seconds);
        }
        let now = self.shared.now();
        let mut router = self.shared.router.lock();
        let result = router.complete(self.ticket, completion, now);
        let health = match &result {
            Ok(r) => r.health.and_then(|event| {
                let name = router.pod_name(r.pod)?.to_owned();
                let address = router.pod_address(r.pod)?.to_owned();
                Some((event, name, address))
            }),
            Err(_) => None,
        };
        drop(router);
        // A slot freed: the requests admission holds are offered it.
        self.shared.holds.kick();
        if let Err(e) = result {
            self.shared.metrics.release_error();
            tracing::error!(ticket = %self.ticket, error = %e, "ticket release refused");
        }
        if let Some((event, name, address)) = health {
            crate::health::log_event(&name, &address, event, now.as_millis());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::{build, parse_toml, Overrides};
    use crate::env::EnvSnapshot;

    fn guard() -> TicketGuard {
        let text = "[models.m]\npods = [{ name = \"a\", address = \"10.0.0.1:80\" }]";
        let c = build(
            parse_toml(text, std::path::Path::new("t")).unwrap(),
            &EnvSnapshot::default(),
            &Overrides::default(),
            0,
        )
        .unwrap();
        let sh = Shared::new(&c, &mut prometheus_client::registry::Registry::default()).unwrap();
        let now = sh.now();
        let d = sh
            .router
            .lock()
            .route(kvroute_core::RouteRequest::new("m", &[]), now)
            .unwrap();
        TicketGuard::new(sh, d.ticket, Arc::from("m"), d.pod_name.clone())
    }

    #[test]
    fn a_timed_response_reports_its_first_chunk_and_usage() {
        use crate::stream_timing::{ResponseTiming, StreamBudget};
        let budget = Arc::new(StreamBudget::default());
        let mut g = guard();
        g.time_response(ResponseTiming::new(budget.try_acquire(1).unwrap()));
        let first = g_routed(&g, 40);
        g.timing_mut()
            .unwrap()
            .on_chunk(b"data: {\"text\":\"a\"}\n\n", first);
        let usage = b"data: {\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\n";
        let at = g_routed(&g, 90);
        g.timing_mut().unwrap().on_chunk(usage, at);
        g.on_response(status(Some(200)));
        let c = g.completion(g_routed(&g, 100));
        assert_eq!(
            c.timings,
            Timings {
                first_token_ms: Some(40),
                total_ms: Some(100),
                output_tokens: Some(3),
                cached_tokens: Some(8),
                prompt_tokens: Some(10),
            }
        );
        g.on_response(status(Some(503)));
        assert_eq!(g.completion(g_routed(&g, 100)).timings, Timings::default());
        drop(g);
        assert_eq!(budget.open(), 0);
    }

    #[test]
    fn timed_successes_without_a_body_are_counted_and_warned_of_once() {
        use crate::stream_timing::{ResponseTiming, StreamBudget};
        let budget = Arc::new(StreamBudget::default());
        let shared = Arc::clone(&guard().shared);
        let end = |status: u16, chunk: bool| {
            let d = shared
                .router
                .lock()
                .route(kvroute_core::RouteRequest::new("m", &[]), shared.now())
                .unwrap();
            let mut g = TicketGuard::new(Arc::clone(&shared), d.ticket, Arc::from("m"), d.pod_name);
            g.time_response(ResponseTiming::new(budget.try_acquire(4).unwrap()));
            if chunk {
                let at = g_routed(&g, 5);
                g.timing_mut().unwrap().on_chunk(b"data: {}\n\n", at);
            }
            g.on_response(super::tests::status(Some(status)));
        };
        end(200, false);
        end(503, false); // a failure is not counted
        end(200, false);
        assert_eq!(shared.metrics.timed_without_body(), 2);
        // The third without a body, none with one: the warning's turn, once.
        assert!(shared.metrics.timed_response_succeeded(false));
        assert!(!shared.metrics.timed_response_succeeded(false));
        end(200, true);
        assert_eq!(shared.metrics.timed_without_body(), 4);
        // Once a body has come through, Envoy honours the override: no warning.
        let other = guard();
        for _ in 0..5 {
            assert!(!other.shared.metrics.timed_response_succeeded(true));
        }
        assert!(!other.shared.metrics.timed_response_succeeded(false));
        drop(other);
        assert_eq!(budget.open(), 0);
    }

    fn status(status: Option<u16>) -> ResponseEnd {
        ResponseEnd {
            headers_seen: true,
            status,
            code_details: None,
        }
    }

    fn g_routed(g: &TicketGuard, ms: u64) -> Instant {
        g.routed_at + Duration::from_millis(ms)
    }

    #[test]
    fn only_successful_responses_report_a_total_and_untimed_ones_no_first_token() {
        let later = |g: &TicketGuard| g.routed_at + Duration::from_millis(250);
        let mut g = guard();
        let c = g.completion(later(&g));
        assert_eq!(c, Completion::new(Outcome::Cancelled), "no response seen");
        g.on_response(status(Some(200)));
        let c = g.completion(later(&g));
        assert_eq!(c.outcome, Outcome::Success);
        assert_eq!(c.timings.total_ms, Some(250));
        assert_eq!(c.timings.first_token_ms, None);
        for (status, outcome) in [
            (Some(503), Outcome::Failed),
            (None, Outcome::Failed),
            (Some(404), Outcome::Success),
        ] {
            let mut g = guard();
            g.on_response(super::tests::status(status));
            let c = g.completion(later(&g));
            assert_eq!(c, Completion::new(outcome), "{status:?}");
        }
    }
}
