//! What the TTFT model takes from engine snapshots: the engine's own load (see
//! [`super::estimate()`]) and, where completions do not report them, the pod's rates, cache
//! reuse and the bytes per token, learned from the engine's cumulative counters (module docs
//! of [`super`]).

use super::{PodModel, Reports, TtftConfig};
use crate::time::Timestamp;

/// An engine's own view of its load, as scraped from its metrics. An `Option` is `None` when
/// the engine does not export the series (or it was not scraped); a histogram's `_sum` and
/// `_count` come as two fields, each summed over the series' label sets.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EngineSnapshot {
    /// Sequences running (`vllm:num_requests_running`).
    pub running: u32,
    /// Requests waiting (`vllm:num_requests_waiting`).
    pub waiting: u32,
    /// KV cache usage in [0, 1] (`vllm:kv_cache_usage_perc`; with several engines behind one
    /// address, the fullest), when known. When the free share of `kv_cache_tokens` cannot
    /// hold a request's uncached prompt, the pod is taken to run no more sequences than the
    /// snapshot's `running`: the request waits for one of them to end.
    pub kv_usage: Option<f64>,
    /// The size of the engine's KV cache in tokens (`num_gpu_blocks` × `block_size`, labels of
    /// `vllm:cache_config_info`; with several engines behind one address, the smallest), when
    /// known. Without it the KV cache is never taken as full.
    pub kv_cache_tokens: Option<u64>,
    /// Prefix-cache queries in tokens, cumulative (`vllm:prefix_cache_queries_total`).
    pub prefix_queries: Option<u64>,
    /// Prefix-cache hits in tokens, cumulative (`vllm:prefix_cache_hits_total`).
    pub prefix_hits: Option<u64>,
    /// Seconds from scheduling to first token, summed over requests, cumulative
    /// (`vllm:request_prefill_time_seconds_sum`).
    pub prefill_seconds: Option<f64>,
    /// Requests counted in `prefill_seconds`, cumulative (`..._count`).
    pub prefills: Option<u64>,
    /// Seconds between consecutive output tokens, summed, cumulative
    /// (`vllm:time_per_output_token_seconds_sum`, or `vllm:inter_token_latency_seconds_sum`).
    pub inter_token_seconds: Option<f64>,
    /// Gaps counted in `inter_token_seconds`, cumulative (`..._count`).
    pub inter_tokens: Option<u64>,
    /// Seconds from the engine queueing a request to first scheduling it, summed over finished
    /// requests, cumulative (`vllm:request_queue_time_seconds_sum`). Read by `least-latency`.
    pub queue_seconds: Option<f64>,
    /// Requests counted in `queue_seconds`, cumulative (`..._count`).
    pub queue_requests: Option<u64>,
    /// Seconds from first to last output token, summed over finished requests, cumulative
    /// (`vllm:request_decode_time_seconds_sum`). Read by `least-latency`.
    pub decode_seconds: Option<f64>,
    /// Requests counted in `decode_seconds`, cumulative (`..._count`).
    pub decode_requests: Option<u64>,
    /// Prompt tokens of finished requests (whole prompts, cached or not), summed, cumulative
    /// (`vllm:request_prompt_tokens_sum`). Read by `throughput` and `least-latency`.
    pub request_prompt_tokens: Option<u64>,
    /// Requests counted in `request_prompt_tokens`, cumulative (`..._count`).
    pub prompt_requests: Option<u64>,
    /// Output tokens of finished requests, summed, cumulative
    /// (`vllm:request_generation_tokens_sum`). Read by `throughput` and `least-latency`.
    pub request_generation_tokens: Option<u64>,
    /// Requests counted in `request_generation_tokens`, cumulative (`..._count`).
    pub generation_requests: Option<u64>,
}

/// Prefills an engine must have finished since the last prefill-rate sample before the next
/// one is taken from its counters (the prompt tokens are counted when requests are scheduled
/// and the prefill time when their first token comes: over several prefills the requests
/// straddling the window's ends weigh less).
const MIN_ENGINE_PREFILLS: u64 = 4;

/// Where the last rate sample taken from an engine's counters left off.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct EngineRateBase {
    // (prefills, prefill seconds, prompt tokens computed = queries − hits)
    prefill: Option<(u64, f64, u64)>,
    // (token gaps, inter-token seconds)
    decode: Option<(u64, f64)>,
    // The engine's prefix-cache counters and the routed totals, when the engine last had no
    // waiting request.
    routed: Option<RoutedTotals>,
    fit: PrefillFit,
}

/// What was routed to a pod (cumulative, as the model saw it), beside its engine's
/// prefix-cache counters.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct RoutedTotals {
    /// The engine's `prefix_cache_queries` (prompt tokens scheduled).
    queries: u64,
    /// The engine's `prefix_cache_hits`.
    hits: u64,
    /// Prompt bytes routed (as estimated from the hash blocks).
    pub(crate) prompt_bytes: f64,
    /// Prompt tokens the index said the pod held, in whole engine blocks.
    pub(crate) indexed_tokens: f64,
    /// The other prompt tokens.
    pub(crate) unindexed_tokens: f64,
}

impl RoutedTotals {
    /// The prompt tokens routed, as the router estimated them (from bytes, at the bytes per
    /// token it had then).
    fn estimated_tokens(&self) -> f64 {
        self.indexed_tokens + self.unindexed_tokens
    }
}

/// One window of an engine's prefill counters.
#[derive(Clone, Copy, Debug, PartialEq)]
struct PrefillWindow {
    prefills: f64,
    tokens: f64,
    seconds: f64,
}

/// Decayed least-squares sums for `seconds = prefills × a + tokens × b` (no intercept).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct PrefillFit {
    pp: f64,
    pt: f64,
    tt: f64,
    py: f64,
    ty: f64,
}

impl PrefillFit {
    /// Adds a window, the older ones weighing `d` times what they weighed.
    fn add(&mut self, w: PrefillWindow, d: f64) {
        self.pp = d * self.pp + w.prefills * w.prefills;
        self.pt = d * self.pt + w.prefills * w.tokens;
        self.tt = d * self.tt + w.tokens * w.tokens;
        self.py = d * self.py + w.prefills * w.seconds;
        self.ty = d * self.ty + w.tokens * w.seconds;
    }

    /// `(a, b)` = (overhead seconds per prefill, seconds per token), when the windows separate
    /// them (the squared correlation of prefills and tokens below 0.99) and both are positive.
    fn solve(&self) -> Option<(f64, f64)> {
        let det = self.pp * self.tt - self.pt * self.pt;
        // Also false for NaN.
        let separable = det > 0.01 * self.pp * self.tt;
        if !separable {
            return None;
        }
        let a = (self.tt * self.py - self.pt * self.ty) / det;
        let b = (self.pp * self.ty - self.pt * self.py) / det;
        (a > 0.0 && b > 0.0 && a.is_finite() && b.is_finite()).then_some((a, b))
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct ObservedEngine {
    pub(crate) snapshot: EngineSnapshot,
    pub(crate) at: Timestamp,
    // the router's own open requests on the pod when the snapshot was recorded
    pub(crate) own_open: u32,
}

impl PodModel {
    /// Records a snapshot and learns the pod's rates from it; returns a sample of prompt bytes
    /// per engine token for the router-wide estimate, when one is due.
    pub(crate) fn observe(
        &mut self,
        snapshot: EngineSnapshot,
        at: Timestamp,
        cfg: &TtftConfig,
    ) -> Option<f64> {
        self.max_running_seen = self.max_running_seen.max(snapshot.running);
        self.learn_from_engine(&snapshot, cfg);
        let own_open = u32::try_from(self.open.len()).unwrap_or(u32::MAX);
        let bytes_per_token = self.learn_from_routed(&snapshot, own_open, cfg);
        self.engine = Some(ObservedEngine {
            snapshot,
            at,
            own_open,
        });
        bytes_per_token
    }

    /// Compares what was routed to the pod with what its engine scheduled, between two
    /// snapshots that show no waiting request (so every request routed before each of them
    /// had been scheduled, transit aside) and no more requests than this router has open
    /// there (`own_open`; a snapshot with more shows another sender, whose prompts the router
    /// never saw: the window is dropped without a sample and the next idle snapshot starts
    /// one; a completion that reached the router after the scrape, or a cancelled request the
    /// engine still runs, looks the same and only delays learning), over at least
    /// `MIN_ENGINE_PREFILLS` engine blocks of prompt tokens: learns `trust` (hits on the
    /// indexed tokens) and `extra` (hits beyond them) from the engine's prefix-cache hits as
    /// [`super::learn()`] does per request, where completions do not report cached tokens,
    /// and returns the prompt bytes per scheduled token for the router-wide estimate. While
    /// the pod's probe waits for its answer, a window of one engine block answers it
    /// (whatever completions report): the probe's usage may come a whole decode later.
    fn learn_from_routed(
        &mut self,
        s: &EngineSnapshot,
        own_open: u32,
        cfg: &TtftConfig,
    ) -> Option<f64> {
        let (queries, hits) = (s.prefix_queries?, s.prefix_hits?);
        if s.running.saturating_add(s.waiting) > own_open {
            self.engine_rates.routed = None;
            return None;
        }
        if s.waiting > 0 {
            return None;
        }
        let now = RoutedTotals {
            queries,
            hits,
            ..self.routed
        };
        let Some(base) = self.engine_rates.routed else {
            self.engine_rates.routed = Some(now);
            return None;
        };
        if queries < base.queries || hits < base.hits {
            self.engine_rates.routed = Some(now);
            return None;
        }
        let tokens = (queries - base.queries) as f64;
        let block = f64::from(cfg.engine_block_tokens);
        // A probe out whose answer has not come: the first window with a block of prompt
        // tokens answers it.
        let probing = self.probe.is_some() && !self.extra.sampled();
        let min_prefills = if probing { 1 } else { MIN_ENGINE_PREFILLS };
        if tokens < min_prefills as f64 * block {
            return None;
        }
        self.engine_rates.routed = Some(now);
        // The routed token counts came from bytes at the bytes per token the router had then;
        // the engine's count of the same prompts rescales them (the index's promise with them),
        // so a bytes-per-token estimate still far off does not read as a cache losing tokens.
        let routed_tokens = now.estimated_tokens() - base.estimated_tokens();
        if (self.cached_tokens == Reports::Missing || probing) && routed_tokens > 0.0 {
            let scale = tokens / routed_tokens;
            self.learn_reuse(
                (hits - base.hits) as f64,
                scale * (now.indexed_tokens - base.indexed_tokens),
                scale * (now.unindexed_tokens - base.unindexed_tokens),
                cfg,
            );
            if probing && self.extra.sampled() {
                self.probe = None;
            }
        }
        let bytes = now.prompt_bytes - base.prompt_bytes;
        (bytes > 0.0).then(|| bytes / tokens)
    }

    /// Learns the pod's prefill rate and TPOT from the engine's cumulative counters: prompt
    /// tokens computed (prefix-cache queries − hits) per second of prefill time, over at least
    /// [`MIN_ENGINE_PREFILLS`] prefills; inter-token seconds per gap, over every window with
    /// a gap (the mean of a window's gaps is a sample as a completion's TPOT is). A counter
    /// that went down (engine restart) starts a new window without a sample.
    fn learn_from_engine(&mut self, s: &EngineSnapshot, cfg: &TtftConfig) {
        if self.first_tokens != Reports::Missing {
            // Completions report first tokens: they teach the prefill rate and overhead.
        } else if let (Some(n), Some(secs), Some(q), Some(h)) = (
            s.prefills,
            s.prefill_seconds,
            s.prefix_queries,
            s.prefix_hits,
        ) {
            let now = (n, secs, q.saturating_sub(h));
            match self.engine_rates.prefill {
                Some((n0, s0, c0)) if n >= n0 && secs >= s0 && now.2 >= c0 => {
                    if n - n0 >= MIN_ENGINE_PREFILLS {
                        let window = PrefillWindow {
                            prefills: (n - n0) as f64,
                            tokens: (now.2 - c0) as f64,
                            seconds: secs - s0,
                        };
                        self.learn_prefill_window(window, cfg);
                        self.engine_rates.prefill = Some(now);
                    }
                }
                _ => self.engine_rates.prefill = Some(now),
            }
        }
        if self.decode_timings != Reports::Missing {
            // Completions report first tokens and output tokens: they teach TPOT.
        } else if let (Some(n), Some(secs)) = (s.inter_tokens, s.inter_token_seconds) {
            match self.engine_rates.decode {
                Some((n0, s0)) if n >= n0 && secs >= s0 => {
                    if n > n0 {
                        self.tpot_ms
                            .learn((secs - s0) * 1_000.0 / (n - n0) as f64, cfg);
                        self.engine_rates.decode = Some((n, secs));
                    }
                }
                _ => self.engine_rates.decode = Some((n, secs)),
            }
        }
    }

    /// Fits `seconds = prefills × overhead + tokens / rate` to the windows seen so far (least
    /// squares, each older window weighing `1 − learning_rate` times what it weighed, as an
    /// older sample does in every learned average) and learns the fitted rate and
    /// overhead. While the windows cannot separate the two (too few, or tokens proportional to
    /// prefills) or the fit is not positive, the window's plain ratio `tokens / seconds` is the
    /// rate sample (low by the overhead) and the overhead is left alone.
    fn learn_prefill_window(&mut self, w: PrefillWindow, cfg: &TtftConfig) {
        if !(w.seconds > 0.0 && w.seconds.is_finite()) {
            return;
        }
        let fit = &mut self.engine_rates.fit;
        fit.add(w, 1.0 - cfg.learning_rate);
        match fit.solve() {
            Some((overhead_s, s_per_token)) => {
                self.prefill_tps.learn(1.0 / s_per_token, cfg);
                self.overhead_ms.learn(overhead_s * 1_000.0, cfg);
            }
            None if w.tokens >= f64::from(cfg.engine_block_tokens) => {
                self.prefill_tps.learn(w.tokens / w.seconds, cfg);
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{cfg, t};
    use super::*;

    #[test]
    fn engine_counters_teach_prefill_rate_and_tpot_without_first_tokens() {
        let c = TtftConfig {
            prefill_tokens_per_s: 1_000.0, // truth below: 8,000
            tpot_ms: 100.0,                // truth below: 25
            ..cfg()
        };
        let mut pod = PodModel::new(&c);
        // Completions came without first-token times or cached tokens (behind Envoy).
        pod.first_tokens = Reports::Missing;
        pod.decode_timings = Reports::Missing;
        pod.cached_tokens = Reports::Missing;
        // Every second the engine finishes 4 prefills of 4,000 computed tokens (0.5 s each)
        // and 400 output-token gaps of 25 ms.
        let snap = |k: u64| EngineSnapshot {
            prefix_queries: Some(k * 20_000),
            prefix_hits: Some(k * 4_000),
            prefills: Some(k * 4),
            prefill_seconds: Some(k as f64 * 2.0),
            inter_tokens: Some(k * 400),
            inter_token_seconds: Some(k as f64 * 10.0),
            ..Default::default()
        };
        for k in 0..30 {
            pod.observe(snap(k), t(k * 1_000), &c);
        }
        assert!(
            (pod.prefill_tps.get() - 8_000.0).abs() < 100.0,
            "{:?}",
            pod.prefill_tps
        );
        assert!((pod.tpot_ms.get() - 25.0).abs() < 0.5, "{:?}", pod.tpot_ms);

        // A restart (counters back near zero) is a new window, not a sample.
        let before = (pod.prefill_tps.get(), pod.tpot_ms.get());
        pod.observe(snap(1), t(40_000), &c);
        assert_eq!((pod.prefill_tps.get(), pod.tpot_ms.get()), before);
        // Fewer than 4 prefills since the last sample, and no gap: no sample yet.
        let mut few = snap(1);
        few.prefills = Some(7);
        few.prefill_seconds = Some(100.0);
        few.inter_token_seconds = Some(100.0);
        pod.observe(few, t(41_000), &c);
        assert_eq!((pod.prefill_tps.get(), pod.tpot_ms.get()), before);
        // Snapshots without the timing counters teach nothing.
        let mut pod = PodModel::new(&c);
        pod.first_tokens = Reports::Missing;
        for k in 0..5 {
            pod.observe(
                EngineSnapshot {
                    running: 3,
                    prefix_queries: Some(k * 20_000),
                    ..Default::default()
                },
                t(k * 1_000),
                &c,
            );
        }
        assert_eq!(pod.prefill_tps.get(), 1_000.0);
        assert_eq!(pod.tpot_ms.get(), 100.0);
        // Where completions carry first-token times (or before any completion), the engine
        // counters teach nothing: the per-request samples are the source.
        for reports in [Reports::Unknown, Reports::Present] {
            let mut pod = PodModel::new(&c);
            pod.first_tokens = reports;
            pod.decode_timings = reports;
            for k in 0..30 {
                pod.observe(snap(k), t(k * 1_000), &c);
            }
            assert_eq!((pod.prefill_tps.get(), pod.tpot_ms.get()), (1_000.0, 100.0));
        }
        // First tokens without output tokens (behind Envoy, a timed response whose client did
        // not ask for usage) teach the prefill side only: TPOT still comes from the engine.
        let mut pod = PodModel::new(&c);
        pod.first_tokens = Reports::Present;
        pod.decode_timings = Reports::Missing;
        for k in 0..30 {
            pod.observe(snap(k), t(k * 1_000), &c);
        }
        assert_eq!(pod.prefill_tps.get(), 1_000.0);
        assert!((pod.tpot_ms.get() - 25.0).abs() < 0.5, "{:?}", pod.tpot_ms);
    }

    #[test]
    fn prefill_windows_of_different_mixes_separate_overhead_from_rate() {
        let c = TtftConfig {
            prefill_tokens_per_s: 1_000.0, // truth: 16,000 tokens/s
            overhead_ms: 100.0,            // truth: 10 ms per prefill
            ..cfg()
        };
        let mut pod = PodModel::new(&c);
        // Completions came without first-token times or cached tokens (behind Envoy).
        pod.first_tokens = Reports::Missing;
        pod.cached_tokens = Reports::Missing;
        let (mut n, mut secs, mut computed) = (0u64, 0.0f64, 0u64);
        for k in 0..60u64 {
            // Four prefills per window, alternately mostly cached and cold.
            let tokens = if k % 2 == 0 { 1_200 } else { 20_000 };
            n += 4;
            computed += tokens;
            secs += 4.0 * 0.010 + tokens as f64 / 16_000.0;
            let snap = EngineSnapshot {
                prefix_queries: Some(computed),
                prefix_hits: Some(0),
                prefills: Some(n),
                prefill_seconds: Some(secs),
                ..Default::default()
            };
            pod.observe(snap, t(k * 1_000), &c);
        }
        let rate = pod.prefill_tps.get();
        let overhead = pod.overhead_ms.get();
        assert!((rate - 16_000.0).abs() < 320.0, "{rate}");
        assert!((overhead - 10.0).abs() < 1.0, "{overhead}");
    }

    #[test]
    fn routed_totals_against_engine_counters_teach_bytes_per_token_and_trust() {
        let c = cfg(); // 1,568-token blocks: a sample needs 4 × 1,568 tokens
        let mut pod = PodModel::new(&c);
        // Completions came without first-token times or cached tokens (behind Envoy).
        pod.first_tokens = Reports::Missing;
        pod.cached_tokens = Reports::Missing;
        let snap = |queries, waiting| EngineSnapshot {
            waiting,
            prefix_queries: Some(queries),
            prefix_hits: Some(0),
            ..Default::default()
        };
        assert_eq!(pod.observe(snap(0, 0), t(0), &c), None); // the first window starts
        pod.routed.prompt_bytes += 56_000.0;
        // The index promised 6,272 of those tokens; the engine had none of them.
        pod.routed.indexed_tokens += 6_272.0;
        pod.routed.unindexed_tokens += 3_728.0;
        // Routed (two requests, open) but still queued on the engine: no sample, the window
        // stays open.
        pod.open = (1..=2)
            .map(|n| super::super::OpenRequest::new(crate::ids::Ticket(n), t(0), 5_000.0, None))
            .collect();
        assert_eq!(pod.observe(snap(5_000, 2), t(1), &c), None);
        // Scheduled: 56,000 bytes for 10,000 tokens.
        assert_eq!(pod.observe(snap(10_000, 0), t(2), &c), Some(5.6));
        assert_eq!(pod.trust.get(), 0.0, "the first window replaces the prior");
        assert_eq!(pod.extra.get(), 0.0);
        // Too few tokens since: no sample yet.
        pod.routed.prompt_bytes += 4_000.0;
        assert_eq!(pod.observe(snap(11_000, 0), t(3), &c), None);
        // A restart starts a new window.
        assert_eq!(pod.observe(snap(100, 0), t(4), &c), None);
        // An engine running more requests than this router has open there (another sender's
        // prompts, which it never saw) drops the window without a sample.
        pod.routed.prompt_bytes += 56_000.0;
        let shared = EngineSnapshot {
            running: 3,
            ..snap(10_100, 0)
        };
        assert_eq!(pod.observe(shared, t(5), &c), None);
        assert_eq!(pod.observe(snap(20_100, 0), t(6), &c), None, "a new window");
        // The same while the engine has a queue: another sender's requests seen only waiting.
        pod.routed.prompt_bytes += 56_000.0;
        assert_eq!(pod.observe(snap(25_100, 3), t(7), &c), None);
        assert_eq!(pod.observe(snap(30_100, 0), t(8), &c), None, "a new window");
        pod.routed.prompt_bytes += 56_000.0;
        assert_eq!(
            pod.observe(snap(40_100, 0), t(9), &c),
            Some(5.6),
            "ours alone"
        );
    }

    #[test]
    fn a_window_answers_a_probe_whose_completion_has_not_come() {
        let c = cfg();
        let snap = |running, queries, hits| EngineSnapshot {
            running,
            prefix_queries: Some(queries),
            prefix_hits: Some(hits),
            ..Default::default()
        };
        // A pod whose window starts idle, then gets one 5,000-token prompt (28,000 bytes) the
        // index placed nowhere, still decoding (ticket `n`).
        let routed_one = |reports, n| {
            let mut pod = PodModel::new(&c);
            pod.cached_tokens = reports;
            pod.observe(snap(0, 0, 0), t(0), &c);
            let ticket = crate::ids::Ticket(n);
            pod.open = vec![super::super::OpenRequest::new(ticket, t(1), 2_500.0, None)];
            pod.routed.prompt_bytes += 28_000.0;
            pod.routed.unindexed_tokens += 5_000.0;
            (pod, ticket)
        };
        // Completions carry cached tokens (timed responses behind Envoy), so windows teach
        // no reuse, except to answer a probe sent to find out whether the pod is warm.
        for reports in [Reports::Unknown, Reports::Present] {
            let (mut pod, probe) = routed_one(reports, 7);
            pod.probe = Some(probe);
            // Its prefill scheduled: 4,704 of the 5,000 tokens came from the cache. One block
            // of prompt tokens is enough (a sample otherwise needs four).
            pod.observe(snap(1, 5_000, 4_704), t(2), &c);
            assert!(pod.extra.sampled(), "{reports:?}");
            let extra = pod.extra.get();
            assert!((extra - 0.9408).abs() < 1e-9, "{extra}");
            assert_eq!(pod.probe, None, "answered: another may not go out");
            assert!(!pod.may_probe());
            // Answered, the pod is back to completions for its reuse: a further window with
            // less than four blocks teaches nothing.
            pod.routed.prompt_bytes += 28_000.0;
            pod.routed.unindexed_tokens += 5_000.0;
            pod.observe(snap(1, 10_000, 5_000), t(3), &c);
            assert_eq!(pod.extra.get(), extra);
        }
        // Without a probe out, the same window teaches nothing.
        let (mut pod, _) = routed_one(Reports::Present, 8);
        pod.observe(snap(1, 5_000, 4_704), t(2), &c);
        assert!(!pod.extra.sampled());
    }

    #[test]
    fn a_window_counts_the_indexed_tokens_at_the_engines_bytes_per_token() {
        let c = cfg();
        let mut pod = PodModel::new(&c);
        pod.cached_tokens = Reports::Missing;
        let snap = |queries, hits| EngineSnapshot {
            prefix_queries: Some(queries),
            prefix_hits: Some(hits),
            ..Default::default()
        };
        pod.observe(snap(0, 0), t(0), &c);
        // Two 5,000-token prompts of 28,000 bytes routed at the prior 4 bytes per token: the
        // router counted 7,000 tokens each, 6,272 of them (4 blocks) promised by the index. The
        // engine scheduled 5,000 each and served the 4,704 it can hold in whole blocks (3) from
        // cache: all that the index really promised.
        pod.routed.prompt_bytes += 56_000.0;
        pod.routed.indexed_tokens += 2.0 * 6_272.0;
        pod.routed.unindexed_tokens += 2.0 * 728.0;
        assert_eq!(pod.observe(snap(10_000, 9_408), t(1), &c), Some(5.6));
        // Counted at 4 bytes per token the engine would seem to have lost a quarter of them.
        assert_eq!(pod.trust.get(), 1.0);
        // The other 1,456 tokens rescale to 1,040, less than a block: no `extra` sample.
        assert!(!pod.extra.sampled());
    }

    #[test]
    fn snapshots_raise_capacity_but_never_lower_it() {
        let c = TtftConfig {
            max_seqs: 4,
            ..cfg()
        };
        let mut pod = PodModel::new(&c);
        pod.observe(
            EngineSnapshot {
                running: 1,
                waiting: 3,
                ..Default::default()
            },
            t(0),
            &c,
        );
        assert_eq!(pod.capacity(), 4);
        pod.observe(
            EngineSnapshot {
                running: 12,
                waiting: 0,
                ..Default::default()
            },
            t(1),
            &c,
        );
        assert_eq!(pod.capacity(), 12);
    }
}
