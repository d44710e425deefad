//! Routing decisions and their one-line explanation.

use core::fmt;
use std::sync::Arc;

use crate::ids::{ModelId, PodId, Ticket};
use crate::strategy::Strategy;

/// Why the chosen pod was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// `random`: uniform choice.
    Random,
    /// `least-request`: fewest in-flight requests.
    LeastRequest,
    /// `prefix-cache`: the best-matching pod within `μ + k·σ` load.
    PrefixMatch,
    /// `prefix-cache`: some pod matched but none passed the load filter; least-loaded instead.
    PrefixMatchSkipped,
    /// `prefix-cache`: no pod matched; least-loaded instead.
    LeastRequestFallback,
    /// A weighted multi-strategy spec: highest combined score.
    Weighted,
    /// `least-ttft`: the smallest predicted time to first token plus prefill stall charge.
    LeastTtft,
    /// `least-ttft`: sent to a pod not yet probed, because the cheapest pod would have made it
    /// wait at least `explore_wait_ms` ([`crate::TtftConfig::explore_wait_ms`]).
    LeastTtftProbe,
    /// `least-kv-cache`: the least KV-cache usage.
    LeastKvCache,
    /// `least-gpu-cache`: the least GPU KV-cache usage.
    LeastGpuCache,
    /// `least-busy-time`: the least busy-time ratio.
    LeastBusyTime,
    /// `least-latency`: the least expected latency.
    LeastLatency,
    /// `throughput`: the fewest weighted tokens per request served.
    Throughput,
    /// `least-utilization`: the least utilization.
    LeastUtilization,
    /// `power-of-two`: the less loaded of two random pods.
    PowerOfTwo,
    /// `session-affinity`: the pod the request's session id names. A request without a
    /// usable session id goes to a random pod ([`Reason::Random`]), as do the AIBrix metric
    /// strategies when no pod has their metric.
    SessionAffinity,
}

impl Reason {
    /// Every reason, in a stable order (the order of [`crate::ModelStats::routed_by_reason`]).
    /// The order is append-only: new reasons are added at the end, so positions are stable
    /// codes (the C ABI relies on it).
    pub const ALL: [Reason; 16] = [
        Reason::Random,
        Reason::LeastRequest,
        Reason::PrefixMatch,
        Reason::PrefixMatchSkipped,
        Reason::LeastRequestFallback,
        Reason::Weighted,
        Reason::LeastTtft,
        Reason::LeastTtftProbe,
        Reason::LeastKvCache,
        Reason::LeastGpuCache,
        Reason::LeastBusyTime,
        Reason::LeastLatency,
        Reason::Throughput,
        Reason::LeastUtilization,
        Reason::PowerOfTwo,
        Reason::SessionAffinity,
    ];

    /// The label; for prefix-cache reasons it is AIBrix's `selection` label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::Random => "random",
            Reason::LeastRequest => "least_request",
            Reason::PrefixMatch => "prefix_match",
            Reason::PrefixMatchSkipped => "prefix_match_skipped",
            Reason::LeastRequestFallback => "least_request_fallback",
            Reason::Weighted => "weighted",
            Reason::LeastTtft => "least_ttft",
            Reason::LeastTtftProbe => "least_ttft_probe",
            Reason::LeastKvCache => "least_kv_cache",
            Reason::LeastGpuCache => "least_gpu_cache",
            Reason::LeastBusyTime => "least_busy_time",
            Reason::LeastLatency => "least_latency",
            Reason::Throughput => "throughput",
            Reason::LeastUtilization => "least_utilization",
            Reason::PowerOfTwo => "power_of_two",
            Reason::SessionAffinity => "session_affinity",
        }
    }

    /// The strategy that gives this reason (`random` for [`Reason::Random`], which the AIBrix
    /// strategies' random fallbacks give too: [`Decision::strategy`] says which ran).
    pub const fn strategy_name(self) -> &'static str {
        match self {
            Reason::Random => "random",
            Reason::LeastRequest => "least-request",
            Reason::PrefixMatch | Reason::PrefixMatchSkipped | Reason::LeastRequestFallback => {
                "prefix-cache"
            }
            Reason::Weighted => "weighted",
            Reason::LeastTtft | Reason::LeastTtftProbe => "least-ttft",
            Reason::LeastKvCache => "least-kv-cache",
            Reason::LeastGpuCache => "least-gpu-cache",
            Reason::LeastBusyTime => "least-busy-time",
            Reason::LeastLatency => "least-latency",
            Reason::Throughput => "throughput",
            Reason::LeastUtilization => "least-utilization",
            Reason::PowerOfTwo => "power-of-two",
            Reason::SessionAffinity => "session-affinity",
        }
    }

    /// Whether this is one of prefix-cache's three selections.
    pub const fn is_prefix_cache(self) -> bool {
        matches!(
            self,
            Reason::PrefixMatch | Reason::PrefixMatchSkipped | Reason::LeastRequestFallback
        )
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where the chosen pod's prefix match came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MatchView {
    /// The router-side index: the prompts the router sent there (AIBrix's view).
    #[default]
    Index,
    /// The engine's own record of its cache (its KV events), complete and current.
    Engine,
}

impl MatchView {
    /// `index` or `engine`.
    pub const fn as_str(self) -> &'static str {
        match self {
            MatchView::Index => "index",
            MatchView::Engine => "engine",
        }
    }
}

/// The in-flight loads the router saw over the model's ready pods, before this request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadSnapshot {
    /// The chosen pod's load.
    pub chosen: u32,
    /// The smallest load.
    pub min: u32,
    /// The largest load.
    pub max: u32,
    /// The mean load.
    pub mean: f64,
    /// How many pods were ready.
    pub ready: u32,
}

/// The TTFT model's prediction for the chosen pod (every strategy gets one; see
/// [`crate::TtftConfig`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prediction {
    /// Predicted time to first token, ms.
    pub ttft_ms: u32,
    /// Predicted wait before prefill starts (slot and prefill backlog), ms.
    pub queue_ms: u32,
    /// What `least-ttft` charged for the stall this prefill imposes on the pod's running
    /// decodes, ms (it ranks pods by `ttft_ms + stall_ms`).
    pub stall_ms: u32,
    /// Prompt tokens predicted to be served from the engine's prefix cache.
    pub cached_tokens: u32,
    /// Estimated prompt tokens.
    pub prompt_tokens: u32,
    /// `least-ttft` only: the predicted TTFT of the runner-up (the other pod of lowest
    /// `ttft_ms + stall_ms`), ms.
    pub runner_up_ttft_ms: Option<u32>,
}

impl Prediction {
    /// How many responses a shell that times few at once should time by default (the `max`
    /// of [`Prediction::timing_budget`]; kvroute-ext-proc's `[stream_timing] max_streams`):
    /// enough to keep learning under load while the timed streams' cost stays small.
    pub const DEFAULT_TIMED_STREAMS: usize = 4;

    /// Whether the request is predicted to start prefilling at once with at least
    /// `engine_block_tokens` not cached: a request whose first token measures the pod's prefill
    /// rate. A shell that can time only a few responses (kvroute-ext-proc) times these first.
    ///
    /// ```
    /// use kvroute_core::Prediction;
    /// let p = Prediction {
    ///     ttft_ms: 1_600,
    ///     queue_ms: 0,
    ///     stall_ms: 0,
    ///     cached_tokens: 3_136,
    ///     prompt_tokens: 5_000,
    ///     runner_up_ttft_ms: None,
    /// };
    /// assert!(p.is_cold_prefill(1_568)); // 1,864 tokens to prefill, at once
    /// assert!(!p.is_cold_prefill(2_048)); // less than a block
    /// assert!(!Prediction { queue_ms: 1, ..p }.is_cold_prefill(1_568)); // waits first
    /// ```
    pub fn is_cold_prefill(&self, engine_block_tokens: u32) -> bool {
        self.queue_ms == 0
            && self.prompt_tokens.saturating_sub(self.cached_tokens) >= engine_block_tokens
    }

    /// For a shell that can time at most `max` responses at once: how many timed responses may
    /// be open for this request's to be timed too. The whole `max` for a
    /// [cold prefill](Prediction::is_cold_prefill) (the only kind that measures a pod's prefill
    /// rate, the rate whose prior can be off by a GPU's whole speed), half of it (rounded up)
    /// for any other (the overhead, TPOT and cache reuse they teach, many requests show).
    ///
    /// ```
    /// # use kvroute_core::Prediction;
    /// let cold = Prediction { ttft_ms: 1_600, queue_ms: 0, stall_ms: 0, cached_tokens: 0,
    ///     prompt_tokens: 5_000, runner_up_ttft_ms: None };
    /// assert_eq!(cold.timing_budget(4, 1_568), 4);
    /// assert_eq!(Prediction { queue_ms: 9, ..cold }.timing_budget(4, 1_568), 2);
    /// assert_eq!(Prediction { queue_ms: 9, ..cold }.timing_budget(1, 1_568), 1);
    /// assert_eq!(cold.timing_budget(0, 1_568), 0);
    /// ```
    pub fn timing_budget(&self, max: usize, engine_block_tokens: u32) -> usize {
        if self.is_cold_prefill(engine_block_tokens) {
            max
        } else {
            max.div_ceil(2)
        }
    }
}

/// One routing decision. The request holds an in-flight slot on `pod` until
/// [`crate::Router::complete`] is called with `ticket`.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Decision {
    /// The chosen pod.
    pub pod: PodId,
    /// Its name (the `target-pod` response header).
    pub pod_name: Arc<str>,
    /// Its `ip:port` (the `target-pod` request header, `x-gateway-destination-endpoint`).
    pub address: Arc<str>,
    /// The model routed for.
    pub model: ModelId,
    /// The in-flight ticket to complete exactly once.
    pub ticket: Ticket,
    /// The strategy that chose it, `None` for a weighted multi-strategy spec.
    pub strategy: Option<Strategy>,
    /// Why this pod.
    pub reason: Reason,
    /// Whether prefix-cache's imbalance guard (`max − min > abs_count`) fired.
    pub imbalance: bool,
    /// The chosen pod's match: ⌊matched × 100 / total⌋, 0 when the prompt has no complete block.
    pub match_percent: u8,
    /// Leading blocks of the prompt the chosen pod held.
    pub matched_blocks: u32,
    /// Whose record `matched_blocks` comes from.
    pub view: MatchView,
    /// Complete blocks in the prompt.
    pub total_blocks: u32,
    /// Loads seen.
    pub loads: LoadSnapshot,
    /// The TTFT model's view of the chosen pod.
    pub prediction: Prediction,
    /// Pods of the model that were no candidates because of their health (ejected, one probe
    /// already out, or failing active checks); configured-unready pods are not counted.
    pub excluded: u32,
    /// The request is the probe of a pod whose ejection is over: its outcome decides whether
    /// the pod is back in service.
    pub health_probe: bool,
    /// When the strategy includes `session-affinity` or `least-ttft`: the session id of the
    /// chosen pod (standard base64 of its `ip:port`, as AIBrix encodes it), for the
    /// `x-session-id` response header. The client's next request with it comes back here
    /// under `session-affinity`; under `least-ttft` it tells the model that this pod holds the
    /// conversation's previous answer, which the index never saw.
    pub session_id: Option<String>,
    /// The chosen pod's engine rank when it is one engine of a data-parallel server
    /// ([`crate::Router::set_pod_data_parallel_rank`]): the shell pins the request to it.
    pub data_parallel_rank: Option<u32>,
}

/// Renders the decision as one ASCII line with no commas or quotes, fit for a response header
/// (`x-kvroute-decision`) and a log line, for example
/// `strategy=prefix-cache reason=prefix_match pod=vllm-b match=100% blocks=218/218 imbalance=0
/// load=12 min=3 max=12 mean=5.00 ready=3 ticket=17` (on one line).
impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "strategy={} reason={} pod={} match={}% blocks={}/{} imbalance={} load={} min={} max={} mean={:.2} ready={} ticket={}",
            self.strategy.map_or("weighted", Strategy::name),
            self.reason,
            HeaderSafe(&self.pod_name),
            self.match_percent,
            self.matched_blocks,
            self.total_blocks,
            u8::from(self.imbalance),
            self.loads.chosen,
            self.loads.min,
            self.loads.max,
            self.loads.mean,
            self.loads.ready,
            self.ticket,
        )?;
        let p = &self.prediction;
        write!(
            f,
            " pred_ttft_ms={} pred_queue_ms={} pred_stall_ms={} pred_cached_tokens={}/{}",
            p.ttft_ms, p.queue_ms, p.stall_ms, p.cached_tokens, p.prompt_tokens
        )?;
        if let Some(r) = p.runner_up_ttft_ms {
            write!(f, " runner_up_ttft_ms={r}")?;
        }
        if self.view == MatchView::Engine {
            f.write_str(" view=engine")?;
        }
        if self.excluded > 0 {
            write!(f, " excluded={}", self.excluded)?;
        }
        if self.health_probe {
            f.write_str(" health_probe=1")?;
        }
        Ok(())
    }
}

/// Writes a caller-supplied name with anything outside visible ASCII replaced by `?`.
struct HeaderSafe<'a>(&'a str);

impl fmt::Display for HeaderSafe<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use fmt::Write;
        for c in self.0.chars() {
            f.write_char(if c.is_ascii_graphic() && c != ',' && c != '"' {
                c
            } else {
                '?'
            })?;
        }
        Ok(())
    }
}
