//! The suite's workloads: each a generator from a seed to a trace (the JSONL `kvroute-sim run`
//! reads) and the replicas it runs on.
//!
//! The seed draws everything that varies between draws of one workload: arrival times, which
//! conversation or family each request belongs to, prompt and answer lengths, think times and
//! the prompts' text (so prefixes hash differently every draw). The shape (replicas, request
//! counts, rates, the mix) is the workload's. Rates are set so that the two replicas' (or four's)
//! prefill capacity is busy but not overrun for a strategy that places work well: a workload
//! every strategy passes or every strategy fails says nothing.
//!
//! Validation families ([`Workload::family`]): `chat` (closed-loop conversations), `sharing`
//! (prefix sharing of different shapes), `fleet` (replicas of different speeds, bursts),
//! `stale` (warm engines behind an index that does not know what they hold: one that places
//! every prefix on one replica, or a restarted router's empty one).

use serde_json::{json, Value};

use crate::workload::synthetic_prompt;

/// One workload of the suite.
#[derive(Clone, Copy, Debug)]
pub struct Workload {
    /// Its name (the table's row label, `--workload`).
    pub name: &'static str,
    /// Its validation family (see the module docs).
    pub family: &'static str,
    /// What it is, in a sentence.
    pub about: &'static str,
    build: fn(&mut Gen),
}

/// A workload drawn for one seed.
#[derive(Clone, Debug)]
pub struct Drawn {
    /// The replicas, as `--pod` values of `kvroute-sim run` (`NAME` or `NAME:SETTINGS`).
    pub pods: Vec<String>,
    /// The trace, one JSON object per line.
    pub trace: String,
}

impl Workload {
    /// The workload drawn for `seed`.
    pub fn draw(&self, seed: u64) -> Drawn {
        let mut g = Gen {
            rng: fastrand::Rng::with_seed(crate::workload::mix(
                seed ^ crate::workload::mix(xxhash_rust::xxh64::xxh64(self.name.as_bytes(), 0)),
            )),
            salt: format!("{}-{seed}", self.name),
            pods: Vec::new(),
            lines: Vec::new(),
        };
        (self.build)(&mut g);
        let mut trace = String::new();
        for line in &g.lines {
            trace.push_str(&line.to_string());
            trace.push('\n');
        }
        Drawn {
            pods: g.pods,
            trace,
        }
    }
}

/// The suite, in table order.
pub const WORKLOADS: [Workload; 9] = [
    Workload {
        name: "chat-2",
        family: "chat",
        about: "20 multi-turn conversations (3-6 turns, a shared system prompt, think 2-8 s) on 2 replicas",
        build: |g| chat(g, 2, 20, 0.5),
    },
    Workload {
        name: "chat-4",
        family: "chat",
        about: "40 multi-turn conversations on 4 replicas",
        build: |g| chat(g, 4, 40, 1.0),
    },
    Workload {
        name: "mixed-lengths",
        family: "sharing",
        about: "short questions on a shared system prompt among long documents asked about repeatedly, 2 replicas",
        build: mixed_lengths,
    },
    Workload {
        name: "hot-4",
        family: "sharing",
        about: "one hot document family (60% of requests) and 15 cold ones on 4 replicas",
        build: hot_family,
    },
    Workload {
        name: "many-prefixes",
        family: "sharing",
        about: "48 documents asked about 2-3 times each, replicas with a small KV cache (evictions)",
        build: many_prefixes,
    },
    Workload {
        name: "uneven-3",
        family: "fleet",
        about: "8 document families on 3 replicas, one half as fast with half the slots",
        build: uneven,
    },
    Workload {
        name: "bursts-4",
        family: "fleet",
        about: "bursts of 12 requests in a second every 10 s over 8 families on 4 replicas",
        build: bursts,
    },
    Workload {
        name: "warm-skewed",
        family: "stale",
        about: "engines warm with all 8 families, the router's index placing all on A, 2 replicas",
        build: warm_skewed,
    },
    Workload {
        name: "warm-split",
        family: "stale",
        about: "a restarted router: A's engine warm with 4 of 8 families, B's with the other 4, the index empty, 2 replicas",
        build: warm_split,
    },
];

/// The generator's state while a workload draws itself.
struct Gen {
    rng: fastrand::Rng,
    /// Makes this draw's prompts its own.
    salt: String,
    pods: Vec<String>,
    lines: Vec<Value>,
}

impl Gen {
    fn pods(&mut self, pods: &[&str]) {
        self.pods = pods.iter().map(|p| (*p).to_owned()).collect();
    }

    fn id(&self, what: &str) -> String {
        format!("{}/{what}", self.salt)
    }

    /// Poisson arrival times: `n` of them at `rate` per second, from 0.
    fn poisson(&mut self, n: usize, rate: f64) -> Vec<f64> {
        let mut t = 0.0;
        (0..n)
            .map(|_| {
                let at = t;
                t += -(1.0 - self.rng.f64()).ln() / rate;
                at
            })
            .collect()
    }

    fn between(&mut self, lo: u32, hi: u32) -> u32 {
        self.rng.u32(lo..=hi)
    }

    /// A request on document `doc` (a `prompt_id` of `tokens` tokens) with a question.
    fn ask(&mut self, at: f64, doc: &str, tokens: u32, output: u32, max_tokens: u32) {
        let q = self.rng.u32(..1_000_000);
        self.lines.push(json!({
            "at": round_ms(at),
            "prompt_id": self.id(doc),
            "prompt_tokens": tokens,
            "suffix": format!(" Question {q}: what does it say?"),
            "output_tokens": output,
            "max_tokens": max_tokens,
        }));
    }
}

fn round_ms(s: f64) -> f64 {
    (s * 1000.0).round() / 1000.0
}

/// Conversations: each opens with a shared 1,000-token system prompt and a document of its own
/// (1,000-3,000 tokens), then 2-5 follow-up questions, each sent 2-8 s after the previous
/// answer (100-400 tokens, asked with `max_tokens` 512).
fn chat(g: &mut Gen, replicas: usize, conversations: usize, rate: f64) {
    let names: Vec<String> = crate::study::pod_names(replicas);
    g.pods = names;
    let system = synthetic_prompt(&g.id("system"), 1_000);
    let starts = g.poisson(conversations, rate);
    let mut turns_left = Vec::new();
    for (c, at) in starts.into_iter().enumerate() {
        let doc_tokens = g.between(1_000, 3_000) as usize;
        let doc = synthetic_prompt(&g.id(&format!("doc-{c}")), doc_tokens);
        let output = g.between(100, 400);
        g.lines.push(json!({
            "at": round_ms(at),
            "session": format!("chat-{c}"),
            "prompt": format!("{system}{doc} User: what is this about?"),
            "output_tokens": output,
            "max_tokens": 512,
        }));
        turns_left.push((c, g.between(2, 5)));
    }
    // Later turns in rounds: every conversation's second turn, then every third, ... (a
    // conversation's turns keep their order; the trace's line order between conversations
    // does not matter).
    for turn in 1.. {
        let mut any = false;
        for &(c, later) in &turns_left {
            if turn > later {
                continue;
            }
            any = true;
            let think = f64::from(g.between(2_000, 8_000)) / 1000.0;
            let output = g.between(100, 400);
            g.lines.push(json!({
                "session": format!("chat-{c}"),
                "think_s": think,
                "suffix": format!(" User: and question {turn}, how does that follow?"),
                "output_tokens": output,
                "max_tokens": 512,
            }));
        }
        if !any {
            break;
        }
    }
}

/// 120 requests at 0.8/s on 2 replicas: 70% short questions (a shared 600-token system prompt
/// and a 100-500-token question of their own), 30% questions about one of 6 long documents
/// (6,000-10,000 tokens).
fn mixed_lengths(g: &mut Gen) {
    g.pods(&["A", "B"]);
    let docs: Vec<u32> = (0..6).map(|_| g.between(6_000, 10_000)).collect();
    let system = synthetic_prompt(&g.id("system"), 600);
    for (i, at) in g.poisson(120, 0.8).into_iter().enumerate() {
        let output = g.between(32, 256);
        if g.rng.f64() < 0.7 {
            let own = synthetic_prompt(&g.id(&format!("q-{i}")), g.between(100, 500) as usize);
            g.lines.push(json!({
                "at": round_ms(at),
                "prompt": format!("{system}{own}"),
                "output_tokens": output,
                "max_tokens": 256,
            }));
        } else {
            let d = g.rng.usize(..docs.len());
            g.ask(at, &format!("doc-{d}"), docs[d], output, 256);
        }
    }
}

/// 160 requests at 2.4/s on 4 replicas: 60% about one hot 5,000-token document, the rest about
/// 15 others of 3,000-6,000 tokens.
fn hot_family(g: &mut Gen) {
    g.pods(&["A", "B", "C", "D"]);
    let docs: Vec<u32> = (0..16)
        .map(|d| {
            if d == 0 {
                5_000
            } else {
                g.between(3_000, 6_000)
            }
        })
        .collect();
    for at in g.poisson(160, 2.4) {
        let d = if g.rng.f64() < 0.6 {
            0
        } else {
            g.rng.usize(1..16)
        };
        g.ask(at, &format!("doc-{d}"), docs[d], 128, 128);
    }
}

/// 120 requests at 0.6/s on 2 replicas with 40 KV blocks each (about 63,000 tokens, 12-15
/// documents): 48 documents of 3,000-6,000 tokens, each asked about 2 or 3 times at random
/// moments.
fn many_prefixes(g: &mut Gen) {
    g.pods(&["A:kv-blocks=40", "B:kv-blocks=40"]);
    let docs: Vec<u32> = (0..48).map(|_| g.between(3_000, 6_000)).collect();
    let mut asks: Vec<usize> = (0..48).flat_map(|d| [d, d]).collect();
    while asks.len() < 120 {
        asks.push(g.rng.usize(..48));
    }
    g.rng.shuffle(&mut asks);
    for (at, d) in g.poisson(120, 0.6).into_iter().zip(asks) {
        g.ask(at, &format!("doc-{d}"), docs[d], 128, 128);
    }
}

/// 120 requests at 1.5/s over 8 families of 4,000-token documents, on A, B and a C half as fast
/// with 4 slots.
fn uneven(g: &mut Gen) {
    g.pods(&["A", "B", "C:speed=0.5,max-num-seqs=4"]);
    for at in g.poisson(120, 1.5) {
        let d = g.rng.usize(..8);
        g.ask(at, &format!("doc-{d}"), 4_000, 128, 128);
    }
}

/// 10 bursts of 12 requests within a second, one every 10 s, over 8 families of
/// 3,000-5,000-token documents, on 4 replicas.
fn bursts(g: &mut Gen) {
    g.pods(&["A", "B", "C", "D"]);
    let docs: Vec<u32> = (0..8).map(|_| g.between(3_000, 5_000)).collect();
    for burst in 0..10 {
        let mut times: Vec<f64> = (0..12)
            .map(|_| f64::from(burst) * 10.0 + g.rng.f64())
            .collect();
        times.sort_by(f64::total_cmp);
        for at in times {
            let d = g.rng.usize(..8);
            g.ask(at, &format!("doc-{d}"), docs[d], 128, 128);
        }
    }
}

/// The study's warm 6/2 in general form: both engines hold all 8 families (5,000 tokens), the
/// router's index places them all on A; 96 requests at 1.6/s.
fn warm_skewed(g: &mut Gen) {
    g.pods(&["A", "B"]);
    for d in 0..8 {
        for (kind, pod) in [("warm", "*"), ("index", "A")] {
            g.lines.push(json!({
                kind: {"pod": pod, "prompt_id": g.id(&format!("doc-{d}")), "prompt_tokens": 5_000}
            }));
        }
    }
    for at in g.poisson(96, 1.6) {
        let d = g.rng.usize(..8);
        g.ask(at, &format!("doc-{d}"), 5_000, 128, 128);
    }
}

/// A router restarted in front of warm engines: its index is empty, A's engine holds families
/// 0-3 (5,000 tokens each) and B's families 4-7; 96 requests at 1.5/s.
fn warm_split(g: &mut Gen) {
    g.pods(&["A", "B"]);
    for d in 0..8 {
        let pod = if d < 4 { "A" } else { "B" };
        g.lines.push(json!({
            "warm": {"pod": pod, "prompt_id": g.id(&format!("doc-{d}")), "prompt_tokens": 5_000}
        }));
    }
    for at in g.poisson(96, 1.5) {
        let d = g.rng.usize(..8);
        g.ask(at, &format!("doc-{d}"), 5_000, 128, 128);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::parse_trace;

    #[test]
    fn every_workload_draws_a_valid_trace_that_depends_on_its_seed() {
        for w in WORKLOADS {
            let a = w.draw(1);
            let trace = parse_trace(&a.trace).unwrap_or_else(|e| panic!("{}: {e}", w.name));
            assert!(trace.arrivals.len() >= 90, "{}", w.name);
            assert!(!a.pods.is_empty());
            assert_eq!(w.draw(1).trace, a.trace, "{}: deterministic", w.name);
            assert_ne!(w.draw(2).trace, a.trace, "{}: the seed matters", w.name);
        }
        let names: std::collections::BTreeSet<_> = WORKLOADS.iter().map(|w| w.name).collect();
        assert_eq!(names.len(), WORKLOADS.len());
    }
}
