//! Strategy names and weighted multi-strategy specs, parsed as AIBrix v0.7.0 parses them
//! (`pkg/plugins/gateway/algorithms/router.go`): comma-separated `name[:weight]`, names
//! case-insensitive and trimmed, integer weights in `0..=1_000_000` defaulting to 1, weight 0
//! drops an entry (whatever its name).
//!
//! Every strategy name AIBrix v0.7.0 registers is either a [`Strategy`] (same name, same
//! rule: see each variant) or a [`StrategyError::Unsupported`] naming what kvroute lacks for
//! it. As in AIBrix, `pd` and any name starting with `slo` take a spec over alone (the other
//! entries are ignored), and a spec of several strategies may only name strategies that score
//! every pod (not `power-of-two`).

use core::fmt;
use core::str::FromStr;

/// The largest weight accepted in a multi-strategy spec.
pub const MAX_WEIGHT: u32 = 1_000_000;

/// One selection strategy. The AIBrix ones read what kvroute has of the metric AIBrix reads
/// (listed per variant); a pod without it is skipped, and when no pod has it the choice is
/// uniform over the ready pods, as in AIBrix. Engine snapshots older than
/// [`crate::TtftConfig::snapshot_max_age_ms`] count as missing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// Uniform choice over the ready pods.
    Random,
    /// The ready pod with the fewest in-flight requests; ties uniformly at random.
    LeastRequest,
    /// AIBrix's prefix-cache procedure (`routeOriginal` in `algorithms/prefix_cache.go`).
    PrefixCache,
    /// kvroute's predicted-time-to-first-token minimum (see [`crate::TtftConfig`]).
    LeastTtft,
    /// AIBrix's `least-kv-cache`: the least GPU plus CPU KV-cache usage. kvroute reads the
    /// GPU part from [`crate::EngineSnapshot::kv_usage`] and takes the CPU part as 0 (vLLM V1
    /// exports no `cpu_cache_usage_perc`; AIBrix skips every pod without it, so on vLLM V1
    /// it always fell back to random). Ties uniformly at random.
    LeastKvCache,
    /// AIBrix's `least-gpu-cache`: the least GPU KV-cache usage
    /// ([`crate::EngineSnapshot::kv_usage`]). Ties uniformly at random.
    LeastGpuCache,
    /// AIBrix's `least-busy-time`: the least busy-time ratio. AIBrix never collects its
    /// `gpu_busy_time_ratio` (so it always fell back to random); kvroute measures the share of
    /// the last minute the pod had requests from this router in flight. Ties uniformly at
    /// random.
    LeastBusyTime,
    /// AIBrix's `least-latency`: the least expected latency, queue time + mean prefill time ×
    /// (cluster-average prompt tokens / the pod's) + mean decode time × (cluster-average
    /// generation tokens / the pod's), from the engine's cumulative counters (see
    /// [`crate::EngineSnapshot`]; the queue term is the engine's mean queue time, which AIBrix
    /// reads as 0). Ties uniformly at random.
    LeastLatency,
    /// AIBrix's `throughput`: the least 2 × average prompt tokens + average generation tokens
    /// per request the pod has served (engine counters; a pod that has served none scores 0).
    /// Ties uniformly at random.
    Throughput,
    /// AIBrix's `least-utilization`: the least engine utilization, which AIBrix describes as
    /// the GPU busy-time ratio (xLLM's `engine_utilization`; vLLM exports none, so AIBrix fell
    /// back to random there). kvroute reads the same busy-time ratio as `least-busy-time`.
    /// Ties uniformly at random.
    LeastUtilization,
    /// AIBrix's `power-of-two`: two distinct pods drawn at random, the one with fewer
    /// in-flight requests (the first drawn on a tie). kvroute counts with its own in-flight
    /// counts; AIBrix needs Redis for them.
    PowerOfTwo,
    /// AIBrix's `session-affinity`: the pod whose `ip:port` the request's `x-session-id`
    /// carries (base64), if it is a candidate; otherwise a uniformly random pod. The decision
    /// carries the session id of the chosen pod for the response
    /// ([`crate::Decision::session_id`]).
    SessionAffinity,
}

/// AIBrix v0.7.0 strategy names kvroute does not implement, with what each needs.
const UNSUPPORTED: [(&str, &str); 7] = [
    (
        "pd",
        "needs prefill and decode pods and a KV-cache transfer between them",
    ),
    (
        "slo",
        "needs AIBrix's SLO request queue and GPU-optimizer load profiles",
    ),
    (
        "slo-pack-load",
        "needs AIBrix's SLO request queue and GPU-optimizer load profiles",
    ),
    (
        "slo-least-load",
        "needs AIBrix's SLO request queue and GPU-optimizer load profiles",
    ),
    (
        "slo-least-load-pulling",
        "needs AIBrix's SLO request queue and GPU-optimizer load profiles",
    ),
    (
        "vtc-basic",
        "needs per-user token accounting (AIBrix's `user` header, users in Redis and a \
         sliding-window token tracker)",
    ),
    (
        "prefix-cache-preble",
        "needs a token radix tree and Preble's GPU cost model (AIBrix hard-codes one for \
         Mistral-7B on A6000 and V100)",
    ),
];

impl Strategy {
    /// Every strategy, in a stable order.
    pub const ALL: [Strategy; 12] = [
        Strategy::Random,
        Strategy::LeastRequest,
        Strategy::PrefixCache,
        Strategy::LeastTtft,
        Strategy::LeastKvCache,
        Strategy::LeastGpuCache,
        Strategy::LeastBusyTime,
        Strategy::LeastLatency,
        Strategy::Throughput,
        Strategy::LeastUtilization,
        Strategy::PowerOfTwo,
        Strategy::SessionAffinity,
    ];

    /// The name used in the `routing-strategy` header.
    pub const fn name(self) -> &'static str {
        match self {
            Strategy::Random => "random",
            Strategy::LeastRequest => "least-request",
            Strategy::PrefixCache => "prefix-cache",
            Strategy::LeastTtft => "least-ttft",
            Strategy::LeastKvCache => "least-kv-cache",
            Strategy::LeastGpuCache => "least-gpu-cache",
            Strategy::LeastBusyTime => "least-busy-time",
            Strategy::LeastLatency => "least-latency",
            Strategy::Throughput => "throughput",
            Strategy::LeastUtilization => "least-utilization",
            Strategy::PowerOfTwo => "power-of-two",
            Strategy::SessionAffinity => "session-affinity",
        }
    }

    /// Whether the strategy scores every pod, so that it can be weighted against others (AIBrix
    /// requires a scorer of every entry of a multi-strategy spec). `random` is kvroute's
    /// extension (a uniform draw per pod); `power-of-two` compares two pods only.
    pub const fn is_weightable(self) -> bool {
        !matches!(self, Strategy::PowerOfTwo)
    }

    /// Parses one name: case-insensitive, surrounding whitespace ignored. AIBrix names kvroute
    /// does not implement are [`StrategyError::Unsupported`].
    pub fn from_name(name: &str) -> Result<Strategy, StrategyError> {
        let trimmed = name.trim();
        if let Some(s) = Strategy::ALL
            .into_iter()
            .find(|s| s.name().eq_ignore_ascii_case(trimmed))
        {
            return Ok(s);
        }
        match UNSUPPORTED
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(trimmed))
        {
            Some(&(n, reason)) => Err(StrategyError::Unsupported {
                name: n.to_owned(),
                reason,
            }),
            None => Err(StrategyError::UnknownName(trimmed.to_owned())),
        }
    }
}

/// Whether AIBrix lets this name take a multi-strategy spec over alone: `pd` and `slo*`.
fn is_exclusive(name: &str) -> bool {
    let name = name.trim();
    name.eq_ignore_ascii_case("pd") || name.get(..3).is_some_and(|p| p.eq_ignore_ascii_case("slo"))
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A parsed strategy spec: one strategy, or several with weights.
///
/// A spec whose only non-zero entry is one strategy behaves exactly as that strategy alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StrategySpec {
    // invariant: non-empty, every weight in 1..=MAX_WEIGHT, no strategy twice; with more than
    // one entry, every strategy is weightable.
    entries: Vec<(Strategy, u32)>,
}

/// Why a strategy spec was rejected. The Envoy service turns every variant into a 400.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StrategyError {
    /// The spec is empty or blank.
    #[error("empty routing strategy")]
    Empty,
    /// A name is not a known strategy.
    #[error("unknown routing strategy {0:?}")]
    UnknownName(String),
    /// An AIBrix strategy kvroute does not implement.
    #[error("routing strategy {name:?} is not supported by kvroute: {reason}")]
    Unsupported {
        /// The strategy's name.
        name: String,
        /// What it needs that kvroute lacks.
        reason: &'static str,
    },
    /// A strategy that scores no pods (`power-of-two`) in a spec of several.
    #[error(
        "routing strategy {0:?} cannot be weighted against others: it does not score every pod"
    )]
    NotWeightable(String),
    /// A weight is not an integer in `0..=1_000_000`.
    #[error("invalid weight {weight:?} for routing strategy {name:?}")]
    InvalidWeight {
        /// The strategy the weight belongs to.
        name: String,
        /// The weight as written.
        weight: String,
    },
    /// Every entry has weight 0.
    #[error("every routing strategy has weight 0")]
    AllWeightsZero,
    /// The same strategy appears twice.
    #[error("routing strategy {0:?} appears twice")]
    Duplicate(String),
}

impl StrategySpec {
    /// A spec of one strategy.
    pub fn single(strategy: Strategy) -> Self {
        StrategySpec {
            entries: vec![(strategy, 1)],
        }
    }

    /// Parses `name[:weight][,name[:weight]...]` in AIBrix's order: the syntax and weights of
    /// every entry first, entries of weight 0 dropped unread, then `pd` or an `slo*` name
    /// (the first) alone if there is one, then the names.
    pub fn parse(spec: &str) -> Result<Self, StrategyError> {
        if spec.trim().is_empty() {
            return Err(StrategyError::Empty);
        }
        let mut named: Vec<&str> = Vec::new();
        let mut weights: Vec<u32> = Vec::new();
        for part in spec.split(',') {
            let (name, weight) = match part.split_once(':') {
                Some((n, w)) => (n, Some(w)),
                None => (part, None),
            };
            if name.trim().is_empty() {
                return Err(StrategyError::Empty);
            }
            let weight = match weight {
                None => 1,
                Some(w) => match w.trim().parse::<u32>() {
                    Ok(v) if v <= MAX_WEIGHT => v,
                    _ => {
                        return Err(StrategyError::InvalidWeight {
                            name: name.trim().to_owned(),
                            weight: w.to_owned(),
                        })
                    }
                },
            };
            if weight > 0 {
                named.push(name);
                weights.push(weight);
            }
        }
        if named.is_empty() {
            return Err(StrategyError::AllWeightsZero);
        }
        if let Some(name) = named.iter().find(|n| is_exclusive(n)) {
            return Strategy::from_name(name).map(StrategySpec::single);
        }
        let mut entries: Vec<(Strategy, u32)> = Vec::with_capacity(named.len());
        for (name, weight) in named.into_iter().zip(weights) {
            let strategy = Strategy::from_name(name)?;
            if entries.iter().any(|(s, _)| *s == strategy) {
                return Err(StrategyError::Duplicate(strategy.name().to_owned()));
            }
            entries.push((strategy, weight));
        }
        if entries.len() > 1 {
            if let Some((s, _)) = entries.iter().find(|(s, _)| !s.is_weightable()) {
                return Err(StrategyError::NotWeightable(s.name().to_owned()));
            }
        }
        Ok(StrategySpec { entries })
    }

    /// The strategy, when the spec names exactly one (with non-zero weight).
    pub fn as_single(&self) -> Option<Strategy> {
        match self.entries.as_slice() {
            [(s, _)] => Some(*s),
            _ => None,
        }
    }

    /// The weighted entries (weight ≥ 1), in the order written.
    pub fn entries(&self) -> &[(Strategy, u32)] {
        &self.entries
    }

    /// Whether the spec includes `strategy`.
    pub fn contains(&self, strategy: Strategy) -> bool {
        self.entries.iter().any(|(s, _)| *s == strategy)
    }
}

impl Default for StrategySpec {
    /// `prefix-cache`, the strategy kvroute exists for.
    fn default() -> Self {
        StrategySpec::single(Strategy::PrefixCache)
    }
}

impl From<Strategy> for StrategySpec {
    fn from(s: Strategy) -> Self {
        StrategySpec::single(s)
    }
}

impl FromStr for StrategySpec {
    type Err = StrategyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        StrategySpec::parse(s)
    }
}

impl fmt::Display for StrategySpec {
    /// The canonical form: lower-case names, `:weight` only where it is not 1.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (s, w)) in self.entries.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(s.name())?;
            if *w != 1 {
                write!(f, ":{w}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_case_insensitive_and_trimmed() {
        assert_eq!(
            Strategy::from_name(" Prefix-Cache "),
            Ok(Strategy::PrefixCache)
        );
        assert_eq!(
            Strategy::from_name("LEAST-REQUEST"),
            Ok(Strategy::LeastRequest)
        );
        assert_eq!(
            Strategy::from_name("round-robin"),
            Err(StrategyError::UnknownName("round-robin".into()))
        );
    }

    #[test]
    fn weighted_specs_parse() {
        let s = StrategySpec::parse("prefix-cache:2, least-request").unwrap();
        assert_eq!(
            s.entries(),
            &[(Strategy::PrefixCache, 2), (Strategy::LeastRequest, 1)]
        );
        assert_eq!(s.to_string(), "prefix-cache:2,least-request");
        assert_eq!(s.as_single(), None);
    }

    #[test]
    fn zero_weights_drop_entries() {
        let s = StrategySpec::parse("prefix-cache:0,random:3").unwrap();
        assert_eq!(s.as_single(), Some(Strategy::Random));
        assert_eq!(
            StrategySpec::parse("random:0"),
            Err(StrategyError::AllWeightsZero)
        );
    }

    #[test]
    fn bad_specs_are_typed_errors() {
        assert_eq!(StrategySpec::parse("  "), Err(StrategyError::Empty));
        assert_eq!(StrategySpec::parse("random,"), Err(StrategyError::Empty));
        assert!(matches!(
            StrategySpec::parse("random:x"),
            Err(StrategyError::InvalidWeight { .. })
        ));
        assert!(matches!(
            StrategySpec::parse("random:1000001"),
            Err(StrategyError::InvalidWeight { .. })
        ));
        assert!(matches!(
            StrategySpec::parse("random:-1"),
            Err(StrategyError::InvalidWeight { .. })
        ));
        assert_eq!(
            StrategySpec::parse("random,RANDOM"),
            Err(StrategyError::Duplicate("random".into()))
        );
        assert!(matches!(
            StrategySpec::parse("foo"),
            Err(StrategyError::UnknownName(_))
        ));
    }

    #[test]
    fn every_aibrix_name_is_a_strategy_or_unsupported() {
        // AIBrix v0.7.0's registered names (`Register`/`RegisterProvider` calls).
        let aibrix = [
            "random",
            "least-request",
            "throughput",
            "prefix-cache",
            "prefix-cache-preble",
            "least-kv-cache",
            "least-gpu-cache",
            "least-busy-time",
            "least-latency",
            "least-utilization",
            "vtc-basic",
            "pd",
            "session-affinity",
            "power-of-two",
            "slo",
            "slo-pack-load",
            "slo-least-load",
            "slo-least-load-pulling",
        ];
        for name in aibrix {
            match Strategy::from_name(name) {
                Ok(s) => assert_eq!(s.name(), name),
                Err(StrategyError::Unsupported { name: n, reason }) => {
                    assert_eq!(n, name);
                    assert!(reason.starts_with("needs "), "{reason}");
                }
                Err(e) => panic!("{name}: {e}"),
            }
        }
        // Every kvroute strategy but least-ttft is an AIBrix name.
        for s in Strategy::ALL {
            assert!(
                s == Strategy::LeastTtft || aibrix.contains(&s.name()),
                "{s}"
            );
        }
        // Names AIBrix does not register stay unknown (its slo routers' inner names too).
        for name in ["least-load", "pack-load", "round-robin"] {
            assert_eq!(
                Strategy::from_name(name),
                Err(StrategyError::UnknownName(name.into()))
            );
        }
    }

    #[test]
    fn unsupported_names_say_why() {
        let e = Strategy::from_name(" PD ").unwrap_err();
        assert_eq!(
            e.to_string(),
            "routing strategy \"pd\" is not supported by kvroute: needs prefill and decode pods \
             and a KV-cache transfer between them"
        );
        assert!(matches!(
            StrategySpec::parse("least-request,vtc-basic"),
            Err(StrategyError::Unsupported { name, .. }) if name == "vtc-basic"
        ));
    }

    #[test]
    fn pd_and_slo_take_a_spec_over_alone() {
        // AIBrix keeps only the first of them, whatever else the spec names.
        for spec in ["random,pd", "nonsense,pd:3", "pd,slo", "least-request:2,PD"] {
            assert!(
                matches!(StrategySpec::parse(spec), Err(StrategyError::Unsupported { name, .. }) if name == "pd"),
                "{spec}"
            );
        }
        assert!(matches!(
            StrategySpec::parse("random,slo-pack-load,pd"),
            Err(StrategyError::Unsupported { name, .. }) if name == "slo-pack-load"
        ));
        // An slo* name AIBrix does not register: its 400 too.
        assert_eq!(
            StrategySpec::parse("random,slowest"),
            Err(StrategyError::UnknownName("slowest".into()))
        );
        // Weight 0 drops pd before the check.
        assert_eq!(
            StrategySpec::parse("pd:0,random").unwrap().as_single(),
            Some(Strategy::Random)
        );
        // Weights are checked first.
        assert!(matches!(
            StrategySpec::parse("pd,random:x"),
            Err(StrategyError::InvalidWeight { .. })
        ));
    }

    #[test]
    fn zero_weight_entries_are_not_looked_up() {
        // AIBrix drops them before it looks the names up.
        assert_eq!(
            StrategySpec::parse("nonsense:0,least-kv-cache").unwrap(),
            StrategySpec::single(Strategy::LeastKvCache)
        );
        assert_eq!(
            StrategySpec::parse("random:0,random").unwrap(),
            StrategySpec::single(Strategy::Random)
        );
    }

    #[test]
    fn new_strategies_weight_except_power_of_two() {
        let s = StrategySpec::parse(
            "least-kv-cache:3,least-gpu-cache,least-busy-time,least-latency,throughput,\
             least-utilization,session-affinity:2,prefix-cache",
        )
        .unwrap();
        assert_eq!(s.entries().len(), 8);
        assert_eq!(
            s.to_string(),
            "least-kv-cache:3,least-gpu-cache,least-busy-time,least-latency,throughput,\
             least-utilization,session-affinity:2,prefix-cache"
        );
        assert_eq!(
            StrategySpec::parse("power-of-two,least-request"),
            Err(StrategyError::NotWeightable("power-of-two".into()))
        );
        // Alone, or with every other entry at weight 0, it is a single strategy.
        assert_eq!(
            StrategySpec::parse("power-of-two:5,least-request:0")
                .unwrap()
                .as_single(),
            Some(Strategy::PowerOfTwo)
        );
    }
}
