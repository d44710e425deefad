//! Parity of the AIBrix v0.7.0 strategies kvroute implements with a small model of AIBrix's Go
//! code (`pkg/plugins/gateway/algorithms/*.go` at tag v0.7.0), over random scenarios: pods
//! with in-flight requests, histories of busy time, engine snapshots (fresh, stale or none;
//! counters present or not) and session ids. For each strategy the model gives the set of
//! pods AIBrix could pick (its pod list is shuffled, so a tie rule such as "the last pod seen"
//! allows any tied pod); kvroute's pick must be in it, and its reason must say whether the
//! metric decided or the random fallback did.
//!
//! The model reads AIBrix's metrics as kvroute maps them (see each strategy's docs):
//! `gpu_cache_usage_perc` and `kv_cache_usage_perc` := the fresh snapshot's `kv_usage`;
//! `cpu_cache_usage_perc` := 0; `gpu_busy_time_ratio` and `engine_utilization` := the busy-time
//! ratio; `request_queue_time_seconds` := the mean of the snapshot's queue-time histogram
//! (`queue_seconds`, `queue_requests`; kvroute's fix of AIBrix reading it as a plain value),
//! 0 without it (what AIBrix reads); the prefill histogram := `(prefill_seconds, prefills)`;
//! the decode histogram := `(decode_seconds, decode_requests)`, or without it
//! `(inter_token_seconds, prefills)`; `avg_prompt_toks_per_req` := the mean of
//! `(request_prompt_tokens, prompt_requests)`, or without it `prefix_queries / prefills`;
//! `avg_generation_toks_per_req` := the mean of `(request_generation_tokens,
//! generation_requests)`, or without it `1 + inter_tokens / prefills` (a mean over no request
//! is 0: kvroute's fix of AIBrix's not-a-number); `realtime_num_requests_running` := the
//! in-flight count. The snapshots' histograms are each present, absent, or half there (a sum
//! without its count, or the reverse: no histogram).

use std::cell::Cell;

use kvroute_core::{
    EngineSnapshot, PodSpec, Reason, RouteRequest, Router, RouterConfig, Strategy, StrategySpec,
    Timestamp,
};
use proptest::prelude::*;
use proptest::strategy::Strategy as _;
use proptest::test_runner::{Config, TestRunner};

const NOW: u64 = 200_000;
const MAX_AGE: u64 = 2_000;

#[derive(Clone, Debug)]
struct Snap {
    age_ms: u64,
    kv_quarters: Option<u8>,
    prefills: Option<u8>,
    queries: Option<u8>,
    gaps: Option<u8>,
    prefill_s: Option<u8>,
    decode_s: Option<u8>,
    /// The per-request histograms (sum, count), each half possibly missing: queue time
    /// (quarter seconds), decode time (seconds), prompt tokens (hundreds), generation tokens
    /// (tens).
    queue: Half,
    decode: Half,
    prompt: Half,
    generation: Half,
}

/// A histogram's (sum, count) as a snapshot may carry it.
type Half = (Option<u8>, Option<u8>);

#[derive(Clone, Debug)]
struct Pod {
    ready: bool,
    /// Requests: (start, duration; `None` = still open at NOW).
    requests: Vec<(u64, Option<u64>)>,
    snap: Option<Snap>,
}

#[derive(Clone, Debug)]
enum Session {
    None,
    Garbage,
    Pod(usize),
    Unknown,
}

#[derive(Clone, Debug)]
struct Scenario {
    pods: Vec<Pod>,
    session: Session,
}

fn snap() -> impl proptest::strategy::Strategy<Value = Snap> {
    let small = || proptest::option::weighted(0.85, 0u8..5);
    // Exported (both halves, mostly), not exported, or half there.
    let histogram = || {
        prop_oneof![
            3 => (0u8..9, 0u8..4).prop_map(|(sum, n)| (Some(sum), Some(n))),
            2 => Just((None, None)),
            1 => (small(), small()),
        ]
    };
    (
        prop_oneof![3 => 0u64..=MAX_AGE, 1 => MAX_AGE + 1..5_000],
        proptest::option::weighted(0.85, 0u8..=4),
        (small(), small(), small(), small(), small()),
        // An engine that exports none of them (older vLLM, another server), or each as drawn.
        prop_oneof![
            1 => Just([(None, None); 4]),
            2 => [histogram(), histogram(), histogram(), histogram()],
        ],
    )
        .prop_map(
            |(
                age_ms,
                kv_quarters,
                (prefills, queries, gaps, prefill_s, decode_s),
                [queue, decode, prompt, generation],
            )| Snap {
                age_ms,
                kv_quarters,
                prefills,
                queries,
                gaps,
                prefill_s,
                decode_s,
                queue,
                decode,
                prompt,
                generation,
            },
        )
}

fn pod() -> impl proptest::strategy::Strategy<Value = Pod> {
    let request = (
        100_000u64..NOW,
        proptest::option::weighted(0.7, 1u64..80_000),
    );
    (
        proptest::bool::weighted(0.85),
        proptest::collection::vec(request, 0..5),
        proptest::option::weighted(0.8, snap()),
    )
        .prop_map(|(ready, requests, snap)| Pod {
            ready,
            requests,
            snap,
        })
}

fn scenario() -> impl proptest::strategy::Strategy<Value = Scenario> {
    (proptest::collection::vec(pod(), 1..7), 0u8..4, 0usize..7).prop_map(|(mut pods, s, i)| {
        if !pods.iter().any(|p| p.ready) {
            pods[0].ready = true;
        }
        let session = match s {
            0 => Session::None,
            1 => Session::Garbage,
            2 => Session::Pod(i % pods.len()),
            _ => Session::Unknown,
        };
        Scenario { pods, session }
    })
}

fn addr(i: usize) -> String {
    format!("10.0.0.{}:8000", i + 1)
}

fn t(ms: u64) -> Timestamp {
    Timestamp::from_millis(ms)
}

/// Standard base64, written here independently of kvroute's.
fn base64(bytes: &[u8]) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let v = (0..3).fold(0u32, |v, k| v << 8 | u32::from(*c.get(k).unwrap_or(&0)));
        for k in 0..4 {
            out.push(if k <= c.len() {
                char::from(A[(v >> (18 - 6 * k) & 63) as usize])
            } else {
                '='
            });
        }
    }
    out
}

fn session_header(s: &Scenario) -> Option<String> {
    match s.session {
        Session::None => None,
        Session::Garbage => Some("not*base64".into()),
        Session::Pod(i) => Some(base64(addr(i).as_bytes())),
        Session::Unknown => Some(base64(b"10.9.9.9:8000")),
    }
}

fn engine(s: &Snap) -> EngineSnapshot {
    EngineSnapshot {
        kv_usage: s.kv_quarters.map(|q| f64::from(q) / 4.0),
        prefills: s.prefills.map(u64::from),
        prefix_queries: s.queries.map(|q| u64::from(q) * 100),
        inter_tokens: s.gaps.map(|g| u64::from(g) * 50),
        prefill_seconds: s.prefill_s.map(f64::from),
        inter_token_seconds: s.decode_s.map(f64::from),
        queue_seconds: s.queue.0.map(|q| f64::from(q) / 4.0),
        queue_requests: s.queue.1.map(u64::from),
        decode_seconds: s.decode.0.map(f64::from),
        decode_requests: s.decode.1.map(u64::from),
        request_prompt_tokens: s.prompt.0.map(|p| u64::from(p) * 100),
        prompt_requests: s.prompt.1.map(u64::from),
        request_generation_tokens: s.generation.0.map(|g| u64::from(g) * 10),
        generation_requests: s.generation.1.map(u64::from),
        ..EngineSnapshot::default()
    }
}

/// The router after the scenario's history, at NOW.
fn build(s: &Scenario) -> Router {
    let mut r = Router::new(RouterConfig {
        seed: 7,
        ..Default::default()
    })
    .unwrap();
    let ids: Vec<_> = (0..s.pods.len())
        .map(|i| {
            r.add_pod(
                "m",
                PodSpec {
                    name: &format!("p{i}"),
                    address: &addr(i),
                    ready: true,
                },
            )
            .unwrap()
        })
        .collect();
    // Routes (to the pod, through an endpoint subset) and completions, in time order.
    let mut events: Vec<(u64, bool, usize, usize)> = Vec::new();
    for (p, pod) in s.pods.iter().enumerate() {
        for (k, &(start, dur)) in pod.requests.iter().enumerate() {
            events.push((start, true, p, k));
            if let Some(end) = dur.map(|d| start + d).filter(|&e| e < NOW) {
                events.push((end, false, p, k));
            }
        }
    }
    events.sort_unstable();
    let mut tickets = std::collections::BTreeMap::new();
    let random = StrategySpec::single(Strategy::Random);
    for (at, route, p, k) in events {
        if route {
            let a = addr(p);
            let subset = [a.as_str()];
            let req = RouteRequest::new("m", &[])
                .with_strategy(&random)
                .with_endpoint_subset(&subset);
            tickets.insert((p, k), r.route(req, t(at)).unwrap().ticket);
        } else {
            let ticket = tickets[&(p, k)];
            r.complete(ticket, kvroute_core::Outcome::Success.into(), t(at))
                .unwrap();
        }
    }
    for (i, pod) in s.pods.iter().enumerate() {
        if let Some(snap) = &pod.snap {
            r.observe_engine(ids[i], engine(snap), t(NOW - snap.age_ms))
                .unwrap();
        }
        r.set_pod_ready(ids[i], pod.ready).unwrap();
    }
    r
}

/// `request_queue_time_seconds` as the model reads it (module docs), and the prefill and
/// decode histograms (sum, count), the decode one possibly missing.
type Latency = (f64, (f64, f64), Option<(f64, f64)>);

/// One ready pod as AIBrix's code sees it, through kvroute's mapping.
#[derive(Clone, Debug)]
struct Seen {
    index: usize,
    running: f64,
    kv: Option<f64>,
    busy: f64,
    /// `avg_prompt_toks_per_req` and `avg_generation_toks_per_req` (present with a fresh
    /// snapshot; 0 where its counters are missing).
    averages: Option<(f64, f64)>,
    /// (queue, prefill (sum, count), decode (sum, count)).
    latency: Option<Latency>,
    /// (avg prompt, avg generation), for throughput.
    tokens: Option<(f64, f64)>,
}

/// The busy-time ratio at NOW, computed from the request intervals.
fn busy_ratio(pod: &Pod) -> f64 {
    let Some(since) = pod.requests.iter().map(|r| r.0).min() else {
        return 0.0;
    };
    let window_start = (NOW / 1_000 + 1 - 60) * 1_000;
    let start = window_start.max(since);
    let mut spans: Vec<(u64, u64)> = pod
        .requests
        .iter()
        .map(|&(s, d)| (s, d.map_or(NOW, |d| (s + d).min(NOW))))
        .collect();
    spans.sort_unstable();
    let (mut busy, mut reach) = (0u64, start);
    for (s, e) in spans {
        let (s, e) = (s.max(reach), e);
        if e > s {
            busy += e - s;
            reach = e;
        }
    }
    if NOW == start {
        0.0
    } else {
        busy as f64 / (NOW - start) as f64
    }
}

fn seen(s: &Scenario) -> Vec<Seen> {
    s.pods
        .iter()
        .enumerate()
        .filter(|(_, p)| p.ready)
        .map(|(index, p)| {
            let open = p
                .requests
                .iter()
                .filter(|&&(st, d)| d.is_none_or(|d| st + d >= NOW))
                .count();
            let fresh = p.snap.as_ref().filter(|s| s.age_ms <= MAX_AGE).map(engine);
            // A histogram's (sum, count) when both halves are there.
            let both = |sum: Option<f64>, n: Option<u64>| Some((sum?, n? as f64));
            let tokens = |v: Option<u64>| v.map(|v| v as f64);
            let mean = |(sum, count): (f64, f64)| if count == 0.0 { 0.0 } else { sum / count };
            let per_request = |e: &EngineSnapshot| {
                let prompt = match both(tokens(e.request_prompt_tokens), e.prompt_requests) {
                    Some(h) => mean(h),
                    None => mean(both(tokens(e.prefix_queries), e.prefills)?),
                };
                let gen = match both(tokens(e.request_generation_tokens), e.generation_requests) {
                    Some(h) => mean(h),
                    None => match (e.prefills?, e.inter_tokens?) {
                        (0, _) => 0.0,
                        (n, g) => 1.0 + g as f64 / n as f64,
                    },
                };
                Some((prompt, gen))
            };
            Seen {
                index,
                running: open as f64,
                kv: fresh.and_then(|e| e.kv_usage),
                busy: busy_ratio(p),
                averages: fresh.map(|e| per_request(&e).unwrap_or((0.0, 0.0))),
                latency: fresh.and_then(|e| {
                    let prefill = both(e.prefill_seconds, e.prefills)?;
                    let decode = both(e.decode_seconds, e.decode_requests)
                        .or(both(e.inter_token_seconds, e.prefills));
                    let queue = both(e.queue_seconds, e.queue_requests).map_or(0.0, mean);
                    Some((queue, prefill, decode))
                }),
                tokens: fresh.and_then(|e| per_request(&e)),
            }
        })
        .collect()
}

/// AIBrix's `ScoreAll` of each strategy: (score, scored).
fn score_all(strategy: Strategy, pods: &[Seen], session: Option<&str>) -> Vec<Option<f64>> {
    match strategy {
        Strategy::LeastRequest => pods.iter().map(|p| Some(p.running)).collect(),
        // gpu + cpu (cpu := 0).
        Strategy::LeastKvCache => pods.iter().map(|p| p.kv.map(|g| g + 0.0)).collect(),
        Strategy::LeastGpuCache => pods.iter().map(|p| p.kv).collect(),
        Strategy::LeastBusyTime | Strategy::LeastUtilization => {
            pods.iter().map(|p| Some(p.busy)).collect()
        }
        Strategy::Throughput => pods
            .iter()
            .map(|p| p.tokens.map(|(prompt, gen)| 2.0 * prompt + gen))
            .collect(),
        Strategy::LeastLatency => {
            // AIBrix's first loop: every pod's averages above 0, whatever else it has.
            let guess = |f: &dyn Fn(&(f64, f64)) -> f64, default: f64| {
                let v: Vec<f64> = pods
                    .iter()
                    .filter_map(|p| p.averages.as_ref())
                    .map(f)
                    .filter(|&v| v > 0.0)
                    .collect();
                if v.is_empty() {
                    default
                } else {
                    v.iter().sum::<f64>() / v.len() as f64
                }
            };
            let gp = guess(&|a| a.0, 10.0);
            let gg = guess(&|a| a.1, 100.0);
            let mean = |(sum, count): (f64, f64)| if count == 0.0 { 0.0 } else { sum / count };
            pods.iter()
                .map(|p| {
                    let (queue, prefill, decode) = p.latency?;
                    let (prompt, gen) = p.averages?;
                    let prompt = if prompt > 0.0 { prompt } else { gp };
                    let gen = if gen > 0.0 { gen } else { gg };
                    Some(queue + mean(prefill) / prompt * gp + mean(decode?) / gen * gg)
                })
                .collect()
        }
        Strategy::SessionAffinity => {
            let target = session.and_then(decode64);
            pods.iter()
                .map(|p| {
                    Some(f64::from(u8::from(
                        target.as_deref() == Some(addr(p.index).as_bytes()),
                    )))
                })
                .collect()
        }
        other => panic!("{other} is not modelled"),
    }
}

/// Go's `base64.StdEncoding.DecodeString` on the inputs the scenarios make.
fn decode64(s: &str) -> Option<Vec<u8>> {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    if !s.len().is_multiple_of(4) {
        return None;
    }
    let body = s.trim_end_matches('=');
    let mut bits = Vec::new();
    for c in body.bytes() {
        let v = A.iter().position(|&a| a == c)? as u8;
        bits.extend((0..6).rev().map(|k| v >> k & 1));
    }
    Some(
        bits.chunks_exact(8)
            .map(|b| b.iter().fold(0, |v, &x| v << 1 | x))
            .collect(),
    )
}

/// The pods AIBrix could pick (pod indices) under a single strategy, and whether it fell back
/// to random.
fn aibrix_single(strategy: Strategy, pods: &[Seen], session: Option<&str>) -> (Vec<usize>, bool) {
    let all: Vec<usize> = pods.iter().map(|p| p.index).collect();
    match strategy {
        Strategy::PowerOfTwo => {
            // Any pod with another at least as loaded could be drawn against it and win.
            if pods.len() == 1 {
                return (all, false);
            }
            let can = pods
                .iter()
                .filter(|p| {
                    pods.iter()
                        .any(|q| q.index != p.index && p.running <= q.running)
                })
                .map(|p| p.index)
                .collect();
            (can, false)
        }
        Strategy::SessionAffinity => {
            let scores = score_all(strategy, pods, session);
            match pods.iter().zip(&scores).find(|(_, s)| **s == Some(1.0)) {
                Some((p, _)) => (vec![p.index], false),
                None => (all, true),
            }
        }
        _ => {
            let scores = score_all(strategy, pods, session);
            let min = scores
                .iter()
                .flatten()
                .filter(|v| v.is_finite())
                .fold(f64::MAX, |m, &v| m.min(v));
            let best: Vec<usize> = pods
                .iter()
                .zip(&scores)
                .filter(|(_, s)| s.is_some_and(|v| v.is_finite() && v == min))
                .map(|(p, _)| p.index)
                .collect();
            if best.is_empty() {
                (all, true)
            } else {
                (best, false)
            }
        }
    }
}

/// The pods AIBrix could pick under a weighted spec.
fn aibrix_weighted(spec: &[(Strategy, u32)], pods: &[Seen], session: Option<&str>) -> Vec<usize> {
    let total_weight: f64 = spec.iter().map(|(_, w)| f64::from(*w)).sum();
    let mut totals = vec![0.0; pods.len()];
    for &(strategy, w) in spec {
        let scores = score_all(strategy, pods, session);
        let finite: Vec<f64> = scores
            .iter()
            .flatten()
            .copied()
            .filter(|v| v.is_finite())
            .collect();
        let (min, max) = finite
            .iter()
            .fold((f64::MAX, -f64::MAX), |(a, b), &v| (a.min(v), b.max(v)));
        let most = strategy == Strategy::SessionAffinity;
        for (total, s) in totals.iter_mut().zip(&scores) {
            let norm = match s.filter(|v| v.is_finite()) {
                None => 0.0,
                Some(_) if max == min => 1.0,
                Some(v) if most => (v - min) / (max - min),
                Some(v) => (max - v) / (max - min),
            };
            *total += norm * f64::from(w) / total_weight;
        }
    }
    let best = totals.iter().copied().fold(-1.0, f64::max);
    pods.iter()
        .zip(&totals)
        .filter(|(_, &v)| v >= best - 1e-9)
        .map(|(p, _)| p.index)
        .collect()
}

const SINGLE: [Strategy; 8] = [
    Strategy::LeastKvCache,
    Strategy::LeastGpuCache,
    Strategy::LeastBusyTime,
    Strategy::LeastLatency,
    Strategy::Throughput,
    Strategy::LeastUtilization,
    Strategy::PowerOfTwo,
    Strategy::SessionAffinity,
];

const MIXES: [&str; 3] = [
    "least-kv-cache:2,least-request",
    "least-latency,throughput:3,least-busy-time",
    "session-affinity:2,least-gpu-cache,least-utilization,least-request",
];

/// Checks every strategy on the scenario; returns the mismatches (strategy, pick, allowed).
fn check(s: &Scenario) -> Vec<String> {
    let pods = seen(s);
    let header = session_header(s);
    let mut bad = Vec::new();
    let index_of = |name: &str| name[1..].parse::<usize>().unwrap();
    for strategy in SINGLE {
        let spec = StrategySpec::single(strategy);
        let mut r = build(s);
        let req = RouteRequest::new("m", &[])
            .with_strategy(&spec)
            .with_session_id(header.as_deref());
        let d = r.route(req, t(NOW)).unwrap();
        let pick = index_of(&d.pod_name);
        let (allowed, fallback) = aibrix_single(strategy, &pods, header.as_deref());
        let reason_ok = (d.reason == Reason::Random) == fallback
            && d.strategy == Some(strategy)
            && (strategy != Strategy::SessionAffinity
                || d.session_id.as_deref() == Some(base64(addr(pick).as_bytes()).as_str()));
        if !allowed.contains(&pick) || !reason_ok {
            bad.push(format!(
                "{strategy}: picked {pick} ({}), AIBrix {allowed:?} fallback={fallback}",
                d.reason
            ));
        }
    }
    for mix in MIXES {
        let spec = StrategySpec::parse(mix).unwrap();
        let mut r = build(s);
        let req = RouteRequest::new("m", &[])
            .with_strategy(&spec)
            .with_session_id(header.as_deref());
        let d = r.route(req, t(NOW)).unwrap();
        let pick = index_of(&d.pod_name);
        let allowed = aibrix_weighted(spec.entries(), &pods, header.as_deref());
        if !allowed.contains(&pick) || d.reason != Reason::Weighted {
            bad.push(format!("{mix}: picked {pick}, AIBrix {allowed:?}"));
        }
    }
    bad
}

/// 2,000 random scenarios × (8 strategies + 3 weighted mixes); prints the counts (run with
/// `--nocapture` to see them): for each strategy, in how many scenarios AIBrix would fall back
/// to random, and in how many its rule narrows the ready pods down (the check is decisive).
#[test]
fn kvroute_picks_what_aibrix_could_pick() {
    let scenarios = Cell::new(0u32);
    let counts = Cell::new([(0u32, 0u32); SINGLE.len()]);
    // Fresh snapshots of ready pods by how many of the four per-request histograms they carry
    // whole (0 to 4).
    let histograms = Cell::new([0u32; 5]);
    let mut runner = TestRunner::new(Config {
        cases: 2_000,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&scenario(), |s| {
            scenarios.set(scenarios.get() + 1);
            let pods = seen(&s);
            let header = session_header(&s);
            let mut c = counts.get();
            for (k, st) in SINGLE.iter().enumerate() {
                let (allowed, fallback) = aibrix_single(*st, &pods, header.as_deref());
                c[k].0 += u32::from(fallback);
                c[k].1 += u32::from(allowed.len() < pods.len());
            }
            counts.set(c);
            let mut h = histograms.get();
            for snap in s
                .pods
                .iter()
                .filter(|p| p.ready)
                .filter_map(|p| p.snap.as_ref())
            {
                let whole = [snap.queue, snap.decode, snap.prompt, snap.generation]
                    .iter()
                    .filter(|(sum, n)| sum.is_some() && n.is_some())
                    .count();
                h[whole] += u32::from(snap.age_ms <= MAX_AGE);
            }
            histograms.set(h);
            let bad = check(&s);
            prop_assert!(bad.is_empty(), "{bad:#?}");
            Ok(())
        })
        .unwrap();
    eprintln!(
        "{} scenarios × ({} strategies + {} weighted mixes): 0 mismatches",
        scenarios.get(),
        SINGLE.len(),
        MIXES.len()
    );
    eprintln!(
        "  fresh snapshots with 0, 1, 2, 3, 4 of the per-request histograms whole: {:?}",
        histograms.get()
    );
    let h = histograms.get();
    assert!(
        h[0] > 100 && h[4] > 100 && h[1..4].iter().all(|&n| n > 100),
        "the generator covers histograms present and absent: {h:?}"
    );
    for (st, (fallback, decisive)) in SINGLE.iter().zip(counts.get()) {
        eprintln!(
            "  {st}: random fallback in {fallback}, fewer pods allowed than ready in {decisive}"
        );
    }
}

#[test]
fn a_stale_snapshot_is_no_metric() {
    let pod = |age_ms, q| Pod {
        ready: true,
        requests: vec![],
        snap: Some(Snap {
            age_ms,
            kv_quarters: Some(q),
            prefills: None,
            queries: None,
            gaps: None,
            prefill_s: None,
            decode_s: None,
            queue: (None, None),
            decode: (None, None),
            prompt: (None, None),
            generation: (None, None),
        }),
    };
    // The stale pod's lower usage does not count: the fresh one wins.
    let s = Scenario {
        pods: vec![pod(MAX_AGE + 1, 0), pod(0, 3)],
        session: Session::None,
    };
    let spec = StrategySpec::single(Strategy::LeastGpuCache);
    for _ in 0..5 {
        let d = build(&s)
            .route(RouteRequest::new("m", &[]).with_strategy(&spec), t(NOW))
            .unwrap();
        assert_eq!((&*d.pod_name, d.reason), ("p1", Reason::LeastGpuCache));
    }
}

#[test]
fn session_ids_stick_and_survive_a_lost_pod() {
    let s = Scenario {
        pods: vec![
            Pod {
                ready: true,
                requests: vec![],
                snap: None,
            };
            4
        ],
        session: Session::None,
    };
    let spec = StrategySpec::single(Strategy::SessionAffinity);
    let mut r = build(&s);
    let first = r
        .route(RouteRequest::new("m", &[]).with_strategy(&spec), t(NOW))
        .unwrap();
    assert_eq!(first.reason, Reason::Random, "no session yet");
    let id = first.session_id.clone().unwrap();
    for k in 1..10 {
        let d = r
            .route(
                RouteRequest::new("m", &[])
                    .with_strategy(&spec)
                    .with_session_id(Some(&id)),
                t(NOW + k),
            )
            .unwrap();
        assert_eq!((d.pod, d.reason), (first.pod, Reason::SessionAffinity));
        assert_eq!(d.session_id.as_deref(), Some(id.as_str()));
    }
    // The pod goes away: a new one is chosen and the response says which.
    r.set_pod_ready(first.pod, false).unwrap();
    let d = r
        .route(
            RouteRequest::new("m", &[])
                .with_strategy(&spec)
                .with_session_id(Some(&id)),
            t(NOW + 20),
        )
        .unwrap();
    assert_ne!(d.pod, first.pod);
    assert_eq!(d.reason, Reason::Random);
    assert_eq!(d.session_id, Some(base64(d.address.as_bytes())));
    assert!(d
        .to_string()
        .starts_with("strategy=session-affinity reason=random "));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    /// Same scenario, same seed: same decisions, for every new strategy.
    #[test]
    fn decisions_are_deterministic(s in scenario()) {
        for st in SINGLE {
            let spec = StrategySpec::single(st);
            let header = session_header(&s);
            let pick = |mut r: Router| {
                let req = RouteRequest::new("m", &[]).with_strategy(&spec).with_session_id(header.as_deref());
                r.route(req, t(NOW)).unwrap().to_string()
            };
            prop_assert_eq!(pick(build(&s)), pick(build(&s)));
        }
    }
}
