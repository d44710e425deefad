//! Workloads: the seed study's four scenarios, exactly as the study describes them, two of the
//! simulator's own, and a JSONL trace format for user workloads.
//!
//! ## The study's phases
//! - 96 planned arrivals at 1.6 requests/s (one every 625 ms), 128 output tokens each.
//! - 8 prompt families. A family's prompt is a fresh 256-hex salt, `Document <n>`, the study
//!   sentence 300 times and `Question <six digits>: ...`; the salt is fixed within the family
//!   and new per phase, the question number is new per request.
//! - The family order of a scenario depends only on the round seed (102, 103), so every
//!   strategy of a round sees the same order. cold/warm: 8 × 12. hot50: the hot family
//!   (family 0) 48, the other 7 together 48. hot90: the hot family 86, the others 10.
//! - Initial state: cold = empty engines and index. warm = every family cached on every
//!   engine, the router index built by a bootstrap that placed families 4/4 (round 1) or
//!   6 on A / 2 on B (round 2). hot50/hot90 = each family cached on one engine only and the
//!   index recording that: the hot family and families 5–7 on B, families 1–4 on A.
//! - With `n` replicas instead of the study's two (pods A, B, C, ...), the initial states
//!   generalise as follows. hot50/hot90: the families, in the order 1, 2, ..., 7, 0, are cut
//!   into `n` contiguous runs of (as near as possible) equal length, one per pod, so the hot
//!   family 0 shares the last pod with the families just before it (two pods: 1–4 on A,
//!   5–7 and 0 on B, as in the study; four: 1–2 A, 3–4 B, 5–6 C, 7 and 0 D). warm 4/4 (the
//!   balanced bootstrap, a least-request pass over idle pods) indexes 8/n families per pod in
//!   contiguous runs; warm 6/2 (the lopsided one) indexes families 0–5 on A and spreads the
//!   rest in contiguous runs over the other pods. Engines are warm with every family on
//!   every pod, as in the study.
//! - Two phases of the simulator's own (`study --phases`, not `replay`): [`Scenario::Eviction`]
//!   sends cold's requests to engines too small to keep every family cached, and
//!   [`Scenario::Skewed`] warm's to [`SKEWED_REPLICAS`] warm replicas while the index places
//!   every family on A.
//!
//! ## Traces
//! User workloads as JSONL: [`trace`] ([`parse_trace`]).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

pub mod trace;
pub use trace::{parse_trace, TraceError};

/// The study's sentence, repeated 300 times in every prompt.
pub const SENTENCE: &str =
    "The service tracks request latency, token throughput, cache utilization, and healthy replicas.\n";
/// Planned arrivals per phase.
pub const STUDY_REQUESTS: usize = 96;
/// Arrival rate, requests per second.
pub const STUDY_RATE: f64 = 1.6;
/// Output tokens per request.
pub const STUDY_OUTPUT_TOKENS: u32 = 128;
/// Prompt families.
pub const STUDY_FAMILIES: usize = 8;
/// The round seeds.
pub const ROUND_SEEDS: [u64; 2] = [102, 103];

/// One of the study's scenarios.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scenario {
    /// Empty engines and index; 8 families × 12.
    Cold,
    /// Every family cached on both engines; the index places `on_a` families on A, the rest
    /// on B.
    Warm {
        /// Families the index places on A (4 in round 1, 6 in round 2).
        on_a: u8,
    },
    /// Each family cached on its home only; hot family 48, others 48.
    Hot50,
    /// Each family cached on its home only; hot family 86, others 10.
    Hot90,
    /// Not the study's: the cold phase's requests (empty engines and index, 8 families × 12,
    /// the round's cold family order) on engines of at most [`EVICTION_KV_BLOCKS`] blocks,
    /// too few to keep every family cached: they evict.
    Eviction,
    /// Not the study's: the warm phase's requests on [`SKEWED_REPLICAS`] replicas whose
    /// engines all hold every family, while the router's index places every family on A.
    Skewed,
}

/// [`Scenario::Eviction`]: the most KV blocks an engine has (`--kv-blocks`, if smaller, wins).
/// 24 blocks of 1,568 tokens hold six families' three-block prefixes, or two running
/// requests' blocks and five families', where the cold phase's traffic reaches every family
/// on every replica under least-request and random routing. The engine needs at least 21 (one
/// sequence of `max_model_len`).
pub const EVICTION_KV_BLOCKS: u32 = 24;

/// [`Scenario::Skewed`]: its replicas (whatever `--replicas` says).
pub const SKEWED_REPLICAS: usize = 4;

/// An unknown scenario name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown scenario {0:?} (expected cold, warm, warm-4-4, warm-6-2, hot50 or hot90)")]
pub struct UnknownScenario(pub String);

/// An unknown phase name ([`Scenario::parse_phase`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown phase {0:?} (expected cold, warm-4-4, warm-6-2, hot50, hot90, eviction or skewed4)"
)]
pub struct UnknownPhase(pub String);

impl Scenario {
    /// The study's scenario list for a round (1 or 2): warm's index split is 4/4 in round 1
    /// and 6/2 in round 2.
    pub fn study(round: u8) -> [Scenario; 4] {
        let on_a = if round == 2 { 6 } else { 4 };
        [
            Scenario::Cold,
            Scenario::Warm { on_a },
            Scenario::Hot50,
            Scenario::Hot90,
        ]
    }

    /// Parses `cold`, `warm` (4/4), `warm-4-4`, `warm-6-2`, `hot50`, `hot90`.
    pub fn parse(s: &str) -> Result<Scenario, UnknownScenario> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cold" | "cold-uniform" => Ok(Scenario::Cold),
            "warm" | "warm-uniform" | "warm-4-4" => Ok(Scenario::Warm { on_a: 4 }),
            "warm-6-2" => Ok(Scenario::Warm { on_a: 6 }),
            "hot50" => Ok(Scenario::Hot50),
            "hot90" => Ok(Scenario::Hot90),
            _ => Err(UnknownScenario(s.to_owned())),
        }
    }

    /// Parses a simulated phase: [`Scenario::parse`]'s names (the study's, which `replay` can
    /// send live), `eviction` and `skewed4` (simulator only).
    pub fn parse_phase(s: &str) -> Result<Scenario, UnknownPhase> {
        match s.trim().to_ascii_lowercase().as_str() {
            "eviction" => Ok(Scenario::Eviction),
            "skewed4" => Ok(Scenario::Skewed),
            _ => Scenario::parse(s).map_err(|_| UnknownPhase(s.to_owned())),
        }
    }

    /// The short name (`cold`, `warm`, `hot50`, `hot90`).
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Cold => "cold",
            Scenario::Warm { .. } => "warm",
            Scenario::Hot50 => "hot50",
            Scenario::Hot90 => "hot90",
            Scenario::Eviction => "eviction",
            Scenario::Skewed => "skewed4",
        }
    }

    /// The replicas the phase runs on: [`SKEWED_REPLICAS`] for [`Scenario::Skewed`],
    /// `configured` (`--replicas`) otherwise.
    pub fn replicas(self, configured: usize) -> usize {
        match self {
            Scenario::Skewed => SKEWED_REPLICAS,
            _ => configured,
        }
    }

    /// The KV capacity of the phase's engines: at most [`EVICTION_KV_BLOCKS`] for
    /// [`Scenario::Eviction`], `configured` (`--kv-blocks`) otherwise.
    pub fn kv_blocks(self, configured: u32) -> u32 {
        match self {
            Scenario::Eviction => configured.min(EVICTION_KV_BLOCKS),
            _ => configured,
        }
    }

    /// Requests per family, family 0 first.
    pub fn family_counts(self) -> [usize; STUDY_FAMILIES] {
        match self {
            Scenario::Cold | Scenario::Warm { .. } | Scenario::Eviction | Scenario::Skewed => {
                [12; 8]
            }
            Scenario::Hot50 => [48, 7, 7, 7, 7, 7, 7, 6],
            Scenario::Hot90 => [86, 2, 2, 2, 1, 1, 1, 1],
        }
    }

    /// Where each family is cached (and indexed) before the phase with `pods` replicas:
    /// `Some(i)` = pod `i` only, `None` = every engine (warm) or none (cold). See the module
    /// docs for how the study's two-pod homes generalise.
    pub fn engine_home(self, family: usize, pods: usize) -> Option<usize> {
        match self {
            Scenario::Cold | Scenario::Warm { .. } | Scenario::Eviction | Scenario::Skewed => None,
            Scenario::Hot50 | Scenario::Hot90 => Some(hot_home(family, pods)),
        }
    }

    /// Where the router's index places each family before the phase with `pods` replicas
    /// (`None` = nowhere).
    pub fn index_home(self, family: usize, pods: usize) -> Option<usize> {
        let pods = pods.max(1);
        match self {
            Scenario::Cold | Scenario::Eviction => None,
            Scenario::Skewed => Some(0),
            // The balanced bootstrap: 8 / pods families per pod, in order.
            Scenario::Warm { on_a } if usize::from(on_a) * 2 == STUDY_FAMILIES => {
                Some(family * pods / STUDY_FAMILIES)
            }
            // The lopsided one: the first `on_a` families on A, the rest spread over the others.
            Scenario::Warm { on_a } => {
                let on_a = usize::from(on_a).min(STUDY_FAMILIES);
                if family < on_a || pods == 1 {
                    Some(0)
                } else {
                    Some(1 + (family - on_a) * (pods - 1) / (STUDY_FAMILIES - on_a))
                }
            }
            Scenario::Hot50 | Scenario::Hot90 => Some(hot_home(family, pods)),
        }
    }

    /// Whether engines start with every family cached on every replica.
    pub fn warm_engines(self) -> bool {
        matches!(self, Scenario::Warm { .. } | Scenario::Skewed)
    }
}

// Families in the order 1..=7, 0, cut into `pods` contiguous runs: with two pods the hot family
// (0) and families 5–7 live on B (1), families 1–4 on A (0).
fn hot_home(family: usize, pods: usize) -> usize {
    let rank = (family + STUDY_FAMILIES - 1) % STUDY_FAMILIES;
    rank * pods.max(1) / STUDY_FAMILIES
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scenario::Warm { on_a } => write!(f, "warm-{on_a}-{}", 8 - on_a),
            s => f.write_str(s.name()),
        }
    }
}

/// A 256-hex-character salt from `rng`.
pub fn salt(rng: &mut fastrand::Rng) -> String {
    (0..256)
        .map(|_| char::from(b"0123456789abcdef"[rng.usize(..16)]))
        .collect()
}

/// The study's prompt for a family (salt, document number) and a question number.
pub fn study_prompt(salt: &str, document: usize, question: u32) -> String {
    let mut s = String::with_capacity(salt.len() + 40 + SENTENCE.len() * 300 + 70);
    s.push_str(salt);
    s.push_str(&format!("\nDocument {document}\n"));
    for _ in 0..300 {
        s.push_str(SENTENCE);
    }
    s.push_str(&format!(
        "Question {question:06}: Explain the operational tradeoffs in detail."
    ));
    s
}

/// Mixes seed material (SplitMix64 finaliser).
pub fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One planned request.
#[derive(Clone, Debug, PartialEq)]
pub struct Arrival {
    /// Planned send time, µs from the phase start.
    pub at_us: u64,
    /// The study family (`None` for trace requests).
    pub family: Option<usize>,
    /// The prompt text.
    pub prompt: Arc<str>,
    /// Output tokens the engine generates: the answer's length (`max_tokens` with
    /// `ignore_eos`, fewer for an answer that stops at EOS).
    pub output_tokens: u32,
    /// The request's `max_tokens` (at least `output_tokens`): the router is told it as the
    /// request's output limit, and the engine accepts or refuses the request on it.
    pub max_tokens: u32,
    /// Request headers, e.g. `routing-strategy`.
    pub headers: BTreeMap<String, String>,
    /// A conversation's later turn: sent after the previous turn's answer ends, not at
    /// `at_us` (closed loop).
    pub follows: Option<FollowUp>,
    /// The answer's text, when a later turn of its conversation sends it back: the engine
    /// caches the blocks of the prompt and answer when the answer ends
    /// ([`crate::engine::Engine::cache_answer`]).
    pub answer: Option<Arc<str>>,
}

/// When a conversation's later turn is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FollowUp {
    /// The index (among the run's arrivals) of the turn before it.
    pub previous: usize,
    /// The user's think time: it is sent this long after the previous turn's answer ends (or
    /// fails), µs.
    pub think_us: u64,
}

/// The family order of a scenario for a round seed: the same for every strategy of a round.
pub fn family_order(scenario: Scenario, seed: u64, requests: usize) -> Vec<usize> {
    let counts = scenario.family_counts();
    let mut order: Vec<usize> = counts
        .iter()
        .enumerate()
        .flat_map(|(f, &n)| std::iter::repeat_n(f, n))
        .collect();
    let mut rng = fastrand::Rng::with_seed(mix(seed ^ mix(scenario_tag(scenario))));
    rng.shuffle(&mut order);
    if requests <= order.len() {
        order.truncate(requests);
    } else {
        // Longer runs cycle through the same mix.
        let base = order.clone();
        while order.len() < requests {
            order.push(base[order.len() % base.len()]);
        }
    }
    order
}

fn scenario_tag(s: Scenario) -> u64 {
    match s {
        // The new phases send the requests of the study phase they start like.
        Scenario::Cold | Scenario::Eviction => 1,
        Scenario::Warm { .. } | Scenario::Skewed => 2,
        Scenario::Hot50 => 3,
        Scenario::Hot90 => 4,
    }
}

/// One phase's prompts: fresh salts (from `salt_seed`) and the round's family order.
#[derive(Clone, Debug)]
pub struct StudyPhase {
    /// The scenario.
    pub scenario: Scenario,
    /// One salt per family.
    pub salts: Vec<String>,
    /// The planned requests.
    pub arrivals: Vec<Arrival>,
}

impl StudyPhase {
    /// Builds a phase: `requests` arrivals at `rate` req/s with `output_tokens` each. The
    /// family order comes from `round_seed`, the salts from `salt_seed` (fresh per phase).
    pub fn new(
        scenario: Scenario,
        round_seed: u64,
        salt_seed: u64,
        requests: usize,
        rate: f64,
        process: ArrivalProcess,
        output_tokens: u32,
    ) -> Self {
        let mut rng = fastrand::Rng::with_seed(mix(salt_seed));
        let salts: Vec<String> = (0..STUDY_FAMILIES).map(|_| salt(&mut rng)).collect();
        let times = arrival_times(process, round_seed, requests, rate);
        let arrivals = family_order(scenario, round_seed, requests)
            .into_iter()
            .enumerate()
            .map(|(i, family)| Arrival {
                follows: None,
                answer: None,
                at_us: times[i],
                family: Some(family),
                prompt: study_prompt(&salts[family], family + 1, question_number(round_seed, i))
                    .into(),
                output_tokens,
                max_tokens: output_tokens,
                headers: BTreeMap::new(),
            })
            .collect();
        StudyPhase {
            scenario,
            salts,
            arrivals,
        }
    }

    /// The prompt used to warm (or index) a family before the phase.
    pub fn priming_prompt(&self, family: usize) -> String {
        study_prompt(&self.salts[family], family + 1, 999_999)
    }
}

/// How arrival times are spaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ArrivalProcess {
    /// Exponential inter-arrival times with mean `1 / rate` (a Poisson process), drawn from
    /// the round seed: the same for every strategy of a round.
    Poisson,
    /// Exactly `1 / rate` apart (the default: the study's facts are reproduced with it, not
    /// with Poisson arrivals, under which least-request queues far more than the study saw).
    #[default]
    Uniform,
}

impl ArrivalProcess {
    /// Parses `poisson` or `uniform`.
    pub fn parse(s: &str) -> Option<ArrivalProcess> {
        match s.trim().to_ascii_lowercase().as_str() {
            "poisson" => Some(ArrivalProcess::Poisson),
            "uniform" | "constant" => Some(ArrivalProcess::Uniform),
            _ => None,
        }
    }
}

/// `n` send times in µs (the first at 0) at `rate` per second.
pub fn arrival_times(process: ArrivalProcess, seed: u64, n: usize, rate: f64) -> Vec<u64> {
    let mean_us = if rate > 0.0 && rate.is_finite() {
        1e6 / rate
    } else {
        0.0
    };
    let mut rng = fastrand::Rng::with_seed(mix(seed ^ 0x6172_7269_7661_6c73));
    let mut t = 0.0f64;
    (0..n)
        .map(|i| {
            if i > 0 {
                t += match process {
                    ArrivalProcess::Uniform => mean_us,
                    // Inverse CDF of the exponential; 1 - u is in (0, 1].
                    ArrivalProcess::Poisson => -mean_us * (1.0 - rng.f64()).ln(),
                };
            }
            t.round() as u64
        })
        .collect()
}

/// The six-digit question number of request `i`.
pub fn question_number(seed: u64, i: usize) -> u32 {
    100_000 + (seed % 8) as u32 * 100_000 + (i % 100_000) as u32
}

/// A deterministic text of exactly `tokens` tokens (see [`crate::tokenizer`]) for an id.
pub fn synthetic_prompt(id: &str, tokens: usize) -> String {
    let mut rng = fastrand::Rng::with_seed(mix(xxhash_rust::xxh64::xxh64(id.as_bytes(), 7)));
    let mut s = String::with_capacity(tokens * 6);
    for _ in 0..tokens {
        // " w" + 1..=10 letters: always exactly one token.
        s.push(' ');
        for _ in 0..rng.usize(1..=10) {
            s.push(char::from(b'a' + rng.u8(..26)));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::count_tokens;

    #[test]
    fn study_prompt_is_about_5000_tokens_and_28000_chars() {
        let mut rng = fastrand::Rng::with_seed(1);
        let p = study_prompt(&salt(&mut rng), 3, 123_456);
        assert!((27_000..30_000).contains(&p.len()), "{}", p.len());
        let n = count_tokens(&p);
        assert!((4_700..=5_300).contains(&n), "{n}");
    }

    #[test]
    fn family_order_depends_on_the_seed_only() {
        let a = StudyPhase::new(
            Scenario::Hot50,
            102,
            1,
            96,
            1.6,
            ArrivalProcess::Uniform,
            128,
        );
        let b = StudyPhase::new(
            Scenario::Hot50,
            102,
            2,
            96,
            1.6,
            ArrivalProcess::Uniform,
            128,
        );
        let fa: Vec<_> = a.arrivals.iter().map(|x| x.family).collect();
        let fb: Vec<_> = b.arrivals.iter().map(|x| x.family).collect();
        assert_eq!(fa, fb);
        assert_ne!(a.salts, b.salts);
        assert_eq!(fa.iter().filter(|f| **f == Some(0)).count(), 48);
        assert_eq!(a.arrivals[1].at_us, 625_000);
        let c = StudyPhase::new(
            Scenario::Hot50,
            103,
            1,
            96,
            1.6,
            ArrivalProcess::Uniform,
            128,
        );
        assert_ne!(fa, c.arrivals.iter().map(|x| x.family).collect::<Vec<_>>());
    }

    #[test]
    fn scenario_counts_and_homes() {
        assert_eq!(Scenario::Hot90.family_counts().iter().sum::<usize>(), 96);
        assert_eq!(Scenario::Hot50.family_counts().iter().sum::<usize>(), 96);
        assert_eq!(Scenario::Hot50.engine_home(0, 2), Some(1));
        let homes = |s: Scenario, pods| (0..8).map(|f| s.index_home(f, pods)).collect::<Vec<_>>();
        let some = |v: [usize; 8]| v.map(Some).to_vec();
        // The study's two pods.
        assert_eq!(homes(Scenario::Hot90, 2), some([1, 0, 0, 0, 0, 1, 1, 1]));
        assert_eq!(
            homes(Scenario::Warm { on_a: 4 }, 2),
            some([0, 0, 0, 0, 1, 1, 1, 1])
        );
        assert_eq!(
            homes(Scenario::Warm { on_a: 6 }, 2),
            some([0, 0, 0, 0, 0, 0, 1, 1])
        );
        // Four pods: contiguous runs; the hot family shares the last pod with family 7.
        assert_eq!(homes(Scenario::Hot50, 4), some([3, 0, 0, 1, 1, 2, 2, 3]));
        assert_eq!(
            homes(Scenario::Warm { on_a: 4 }, 4),
            some([0, 0, 1, 1, 2, 2, 3, 3])
        );
        assert_eq!(
            homes(Scenario::Warm { on_a: 6 }, 4),
            some([0, 0, 0, 0, 0, 0, 1, 2])
        );
        assert_eq!(homes(Scenario::Warm { on_a: 6 }, 1), some([0; 8]));
        assert_eq!(homes(Scenario::Hot50, 1), some([0; 8]));
        assert_eq!(Scenario::Cold.index_home(3, 4), None);
        assert_eq!(Scenario::parse("warm-6-2"), Ok(Scenario::Warm { on_a: 6 }));
        assert!(Scenario::parse("tepid").is_err());
        assert!(
            Scenario::parse("eviction").is_err(),
            "replay sends the study's only"
        );
        assert_eq!(Scenario::parse_phase("eviction"), Ok(Scenario::Eviction));
        assert_eq!(Scenario::parse_phase("skewed4"), Ok(Scenario::Skewed));
        assert_eq!(
            Scenario::parse_phase("warm-6-2"),
            Ok(Scenario::Warm { on_a: 6 })
        );
        assert!(Scenario::parse_phase("tepid").is_err());
        assert_eq!(homes(Scenario::Skewed, 4), some([0; 8]));
        assert!(Scenario::Skewed.warm_engines() && !Scenario::Eviction.warm_engines());
        assert_eq!(Scenario::Skewed.replicas(2), SKEWED_REPLICAS);
        assert_eq!(Scenario::Eviction.kv_blocks(160), EVICTION_KV_BLOCKS);
        assert_eq!(Scenario::Eviction.kv_blocks(22), 22);
        assert_eq!(Scenario::Cold.kv_blocks(160), 160);
    }
}
