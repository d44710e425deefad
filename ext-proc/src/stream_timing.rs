//! Timing streaming responses through kvroute.
//!
//! Envoy tells kvroute when a response starts (its headers) and ends (the side stream closes),
//! not when its first token came nor how many tokens it had: vLLM and `kvroute-sim serve` send
//! a streaming response's headers before the first token is computed, and the body is not sent
//! to kvroute (`response_body_mode: NONE`). For a few server-sent-event responses at a time,
//! kvroute therefore asks Envoy, in its reply to the response headers, to pass that response's
//! body through it chunk by chunk (`mode_override` with `response_body_mode: STREAMED`, which
//! Envoy honours when the filter has `allow_mode_override: true` and ignores otherwise). From
//! the body it reads:
//! - the first token's time: the first non-empty body chunk (vLLM and `kvroute-sim serve`
//!   send the first event when the first token is out);
//! - the usage the last event carries when the client asked for it
//!   (`stream_options.include_usage`): prompt, output and cached
//!   (`prompt_tokens_details.cached_tokens`) tokens.
//!
//! The ticket's completion reports them beside its total (the ticket guard), so
//! least-ttft learns the pod's prefill rate, time per output token, bytes per token and cache
//! reuse per request, as it does behind a streaming C or Go proxy, instead of from the
//! engines' cumulative counters (which count a prompt's tokens when it is scheduled and its
//! prefill time at its first token, and so are hard to read; see the README).
//!
//! Cost: Envoy holds each chunk of a timed response until kvroute answers it (one gRPC round
//! trip per chunk), so at most `[stream_timing] max_streams` responses are timed at once: a
//! [`TimingPermit`] from the [`StreamBudget`] is held until the response's stream ends. The
//! responses that teach the most get the whole budget ([`kvroute_core::Prediction::timing_budget`]): a cold prefill started
//! at once is the only kind that measures a pod's prefill rate, the one rate whose prior can be
//! off by the GPU's whole speed; other responses (cached prefills, queued requests) teach the
//! overhead, TPOT and cache reuse, which many requests show, and get half of it.
//!
//! With `FULL_DUPLEX_STREAMED` response bodies ([`crate::duplex`]) every chunk passes through
//! kvroute whether timed or not, so every 2xx event stream is timed
//! ([`ResponseTiming::unbudgeted`]: no permit, no mode override); what timing adds there is
//! reading the chunks. `max_streams = 0` still turns timing off.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// The longest SSE line kept while looking for the usage (a usage event is a few hundred
/// bytes; a longer line is a content event and is skipped).
const MAX_LINE_BYTES: usize = 64 * 1024;

/// How many responses are being timed, across streams.
#[derive(Debug, Default)]
pub struct StreamBudget {
    open: AtomicUsize,
}

impl StreamBudget {
    /// A permit to time one more response, unless `max` are already timed.
    pub fn try_acquire(self: &Arc<Self>, max: usize) -> Option<TimingPermit> {
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| TimingPermit {
                budget: self.clone(),
            })
    }

    /// Responses being timed now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }
}

/// One timed response's share of the [`StreamBudget`], given back on drop.
#[derive(Debug)]
pub struct TimingPermit {
    budget: Arc<StreamBudget>,
}

impl Drop for TimingPermit {
    fn drop(&mut self) {
        self.budget.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a streaming response's usage event said (each field when present).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// `usage.prompt_tokens`
    pub prompt_tokens: Option<u32>,
    /// `usage.completion_tokens`
    pub completion_tokens: Option<u32>,
    /// `usage.prompt_tokens_details.cached_tokens`
    pub cached_tokens: Option<u32>,
}

/// Whether response headers announce server-sent events (`content-type: text/event-stream`).
pub fn is_event_stream(content_type: &str) -> bool {
    content_type
        .trim_start()
        .get(..17)
        .is_some_and(|t| t.eq_ignore_ascii_case("text/event-stream"))
}

/// What is read from one timed response's body.
#[derive(Debug)]
pub struct ResponseTiming {
    /// The budget share held, absent for a response whose body kvroute sees anyway
    /// (`FULL_DUPLEX_STREAMED` response bodies).
    _permit: Option<TimingPermit>,
    first_chunk: Option<Instant>,
    usage: Option<Usage>,
    /// The current line's bytes so far (it continues in the next chunk).
    line: Vec<u8>,
    /// The current line outgrew [`MAX_LINE_BYTES`]: skip to its end.
    skipping: bool,
}

impl ResponseTiming {
    /// Starts timing a response under `permit`.
    pub fn new(permit: TimingPermit) -> Self {
        ResponseTiming {
            _permit: Some(permit),
            ..ResponseTiming::unbudgeted()
        }
    }

    /// Starts timing a response outside the budget: one whose body passes through kvroute
    /// whether timed or not (`FULL_DUPLEX_STREAMED` response bodies), so that timing adds
    /// only the reading of its chunks (a scan for line ends, and JSON parsing of the lines
    /// that mention `"usage"`).
    pub fn unbudgeted() -> Self {
        ResponseTiming {
            _permit: None,
            first_chunk: None,
            usage: None,
            line: Vec::new(),
            skipping: false,
        }
    }

    /// When the first non-empty body chunk came.
    pub fn first_chunk(&self) -> Option<Instant> {
        self.first_chunk
    }

    /// The last usage event's numbers, if one came.
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// Reads one body chunk, received at `at`. Events may be split across chunks anyhow.
    pub fn on_chunk(&mut self, chunk: &[u8], at: Instant) {
        if chunk.is_empty() {
            return;
        }
        self.first_chunk.get_or_insert(at);
        let mut rest = chunk;
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            let (head, tail) = (&rest[..i], &rest[i + 1..]);
            if !self.skipping {
                if self.line.is_empty() {
                    self.read_line(head);
                } else {
                    let mut line = std::mem::take(&mut self.line);
                    line.extend_from_slice(head);
                    self.read_line(&line);
                    line.clear();
                    self.line = line;
                }
            }
            self.skipping = false;
            rest = tail;
        }
        if !self.skipping {
            if self.line.len() + rest.len() > MAX_LINE_BYTES {
                self.line.clear();
                self.skipping = true;
            } else {
                self.line.extend_from_slice(rest);
            }
        }
    }

    /// One complete line: a `data:` event with a usage object updates [`Self::usage`].
    fn read_line(&mut self, line: &[u8]) {
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        if !contains(data, b"\"usage\"") {
            return;
        }
        let Ok(event) = serde_json::from_slice::<serde_json::Value>(data.trim_ascii()) else {
            return;
        };
        let Some(u) = event.get("usage").filter(|u| u.is_object()) else {
            return;
        };
        let count = |v: Option<&serde_json::Value>| {
            v.and_then(serde_json::Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
        };
        self.usage = Some(Usage {
            prompt_tokens: count(u.get("prompt_tokens")),
            completion_tokens: count(u.get("completion_tokens")),
            cached_tokens: count(u.pointer("/prompt_tokens_details/cached_tokens")),
        });
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn timing(budget: &Arc<StreamBudget>) -> ResponseTiming {
        ResponseTiming::new(budget.try_acquire(1).expect("a free permit"))
    }

    const EVENTS: &str = "data: {\"choices\":[{\"text\":\"a\"}],\"usage\":null}\n\n\
        data: {\"choices\":[{\"text\":\"b\"}],\"usage\":null}\n\n\
        data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5040,\"completion_tokens\":128,\
        \"total_tokens\":5168,\"prompt_tokens_details\":{\"cached_tokens\":4704}}}\n\n\
        data: [DONE]\n\n";

    #[test]
    fn the_first_chunk_and_the_usage_are_read_however_the_events_are_split() {
        let want = Usage {
            prompt_tokens: Some(5_040),
            completion_tokens: Some(128),
            cached_tokens: Some(4_704),
        };
        let t0 = Instant::now();
        for size in [1, 2, 7, 64, EVENTS.len()] {
            let budget = Arc::new(StreamBudget::default());
            let mut t = timing(&budget);
            t.on_chunk(b"", t0);
            assert_eq!(t.first_chunk(), None, "an empty chunk is not a token");
            for (i, chunk) in EVENTS.as_bytes().chunks(size).enumerate() {
                t.on_chunk(chunk, t0 + Duration::from_millis(i as u64 + 1));
            }
            assert_eq!(t.first_chunk(), Some(t0 + Duration::from_millis(1)));
            assert_eq!(t.usage(), Some(want), "chunks of {size} bytes");
        }
    }

    #[test]
    fn malformed_or_missing_usage_reads_as_none_and_long_lines_are_skipped() {
        let budget = Arc::new(StreamBudget::default());
        let mut t = timing(&budget);
        let now = Instant::now();
        t.on_chunk(b"data: {\"usage\": {\"prompt_tokens\": \n", now);
        t.on_chunk(b"data: {\"usage\": null}\n: comment \"usage\"\n", now);
        t.on_chunk(b"event: x\ndata: {\"usage\":{\"prompt_tokens\":-1}}\n", now);
        assert_eq!(
            t.usage(),
            Some(Usage::default()),
            "negative counts are absent"
        );
        let mut t = timing(&Arc::new(StreamBudget::default()));
        let long = format!("data: {{\"x\":\"{}\",", "y".repeat(MAX_LINE_BYTES));
        t.on_chunk(long.as_bytes(), now);
        t.on_chunk(b"\"usage\":{\"prompt_tokens\":1}}\n", now);
        assert_eq!(t.usage(), None, "the overlong line is skipped whole");
        t.on_chunk(b"data: {\"usage\":{\"prompt_tokens\":2}}\n", now);
        assert_eq!(t.usage().and_then(|u| u.prompt_tokens), Some(2));
    }

    #[test]
    fn the_budget_bounds_timed_responses_and_permits_come_back_on_drop() {
        let budget = Arc::new(StreamBudget::default());
        assert!(budget.try_acquire(0).is_none(), "max 0 turns timing off");
        let a = budget.try_acquire(2).unwrap();
        let b = budget.try_acquire(2).unwrap();
        assert!(budget.try_acquire(2).is_none());
        assert_eq!(budget.open(), 2);
        drop(a);
        let c = budget.try_acquire(2);
        assert!(c.is_some());
        drop((b, c));
        assert_eq!(budget.open(), 0);
    }

    #[test]
    fn only_event_streams_are_timed() {
        assert!(is_event_stream("text/event-stream"));
        assert!(is_event_stream("Text/Event-Stream; charset=utf-8"));
        assert!(!is_event_stream("application/json"));
        assert!(!is_event_stream("text/event"));
        assert!(!is_event_stream(""));
    }
}
