//! What `kvroute-sim run` traces and flags express, on the cluster (fast in debug builds):
//! TTFT from the planned arrival, uneven replicas, feedback modes and router files, warm
//! caches and index from directives, answers that stop before `max_tokens`, pods that come
//! and go.

use kvroute_core::{Strategy, StrategySpec};
use kvroute_sim::cluster::{Cluster, ClusterConfig};
use kvroute_sim::report::{within_slo_from_planned, Slo};
use kvroute_sim::workload::parse_trace;

fn spec(s: Strategy) -> StrategySpec {
    StrategySpec::single(s)
}

/// `n` lines of `prompt_tokens`-token prompts with distinct ids, all at `at` seconds.
fn burst(n: usize, at: f64, prompt_tokens: u32, output_tokens: u32) -> String {
    (0..n)
        .map(|i| {
            format!(
                "{{\"at\":{at},\"prompt_id\":\"p{i}\",\"prompt_tokens\":{prompt_tokens},\"output_tokens\":{output_tokens}}}\n"
            )
        })
        .collect()
}

#[test]
fn ttft_from_the_planned_arrival_counts_the_time_the_client_cap_held_a_request() {
    let trace = parse_trace(&burst(4, 1.0, 100, 40)).unwrap().arrivals;
    let run = |cap: usize| {
        let cfg = ClusterConfig {
            client_cap: cap,
            pods: vec!["A".into()],
            ..ClusterConfig::default()
        };
        Cluster::new(cfg)
            .unwrap()
            .run(&trace, &spec(Strategy::Random), "t")
            .unwrap()
    };
    // Without a cap every request is sent on time: both measures agree.
    for r in &run(48).records {
        assert_eq!(r.sent_s, Some(1.0));
        assert_eq!(r.planned_ttft_s, r.ttft_s);
    }
    // One in flight at a time: each waits for the previous answer before it is sent.
    let capped = run(1).records;
    let mut last_planned_ttft = 0.0;
    for (i, r) in capped.iter().enumerate() {
        let (ttft, planned_ttft) = (r.ttft_s.unwrap(), r.planned_ttft_s.unwrap());
        let hold = r.sent_s.unwrap() - r.planned_s;
        assert!((planned_ttft - (ttft + hold)).abs() < 1e-6, "{r:?}");
        assert!(ttft < 0.2, "alone on the engine: {r:?}");
        if i > 0 {
            assert!(hold > 1.0, "held back behind 40 decode steps: {r:?}");
            assert!(planned_ttft > last_planned_ttft + 1.0, "{capped:?}");
        }
        last_planned_ttft = planned_ttft;
    }
    let slo = Slo::default();
    assert!(capped.iter().all(|r| r.within_slo));
    let on_time = capped
        .iter()
        .filter(|r| within_slo_from_planned(r, &slo))
        .count();
    assert_eq!(on_time, 2, "{capped:?}");
}

#[test]
fn replicas_of_different_speeds_and_capacities() {
    use kvroute_sim::replicas::ReplicaSpec;
    // One request every 3 s, each alone on whichever pod random picks.
    let lines: String = (0..12)
        .map(|i| {
            format!(
                "{{\"at\":{},\"prompt_id\":\"p{i}\",\"prompt_tokens\":1000,\"output_tokens\":16}}\n",
                i * 3
            )
        })
        .collect();
    let trace = parse_trace(&lines).unwrap().arrivals;
    let base = ClusterConfig::default();
    let slow = ReplicaSpec::parse("B:speed=0.5,max-num-seqs=2,kv-blocks=21").unwrap();
    let cfg = ClusterConfig {
        pod_engines: [("B".to_owned(), slow.engine(&base.engine))].into(),
        ..ClusterConfig::default()
    };
    let mut c = Cluster::new(cfg).unwrap();
    let capacity: Vec<(String, u32)> = c
        .router()
        .pods()
        .iter()
        .map(|p| (p.name.to_string(), p.max_seqs))
        .collect();
    assert_eq!(capacity, [("A".to_owned(), 8), ("B".to_owned(), 2)]);
    let r = c.run(&trace, &spec(Strategy::Random), "t").unwrap();
    let on = |pod: &str| -> Vec<(f64, f64)> {
        r.records
            .iter()
            .filter(|x| x.pod.as_deref() == Some(pod))
            .map(|x| (x.ttft_s.unwrap(), x.tpot_ms.unwrap()))
            .collect()
    };
    let (a, b) = (on("A"), on("B"));
    assert!(a.len() >= 2 && b.len() >= 2, "{a:?} {b:?}");
    // Alone on a replica half as fast: every step twice as long.
    for &(ttft, tpot) in &b {
        assert!((ttft - 2.0 * a[0].0).abs() < 0.002, "{a:?} {b:?}");
        assert!((tpot - 2.0 * a[0].1).abs() < 0.01, "{a:?} {b:?}");
    }

    // One pod alone, as the flags describe it (A) or as `slow` (B).
    let alone = |pod: &str, trace: &str| {
        let cfg = ClusterConfig {
            pods: vec![pod.into()],
            pod_engines: [("B".to_owned(), slow.engine(&base.engine))]
                .into_iter()
                .filter(|(p, _)| p == pod)
                .collect(),
            ..ClusterConfig::default()
        };
        let trace = parse_trace(trace).unwrap().arrivals;
        let mut c = Cluster::new(cfg).unwrap();
        c.run(&trace, &spec(Strategy::Random), "t").unwrap()
    };
    // Three at once on B, two slots: the third waits for a slot.
    let r = alone("B", &burst(3, 0.0, 100, 16));
    let e2e0 = r.records[0].e2e_s.unwrap();
    assert!(r.records[1].ttft_s.unwrap() < e2e0 / 4.0, "{:?}", r.records);
    assert!(r.records[2].ttft_s.unwrap() > e2e0, "{:?}", r.records);
    // 30 prompts of one whole block each: 21 blocks evict, 160 do not.
    let thirty = burst(30, 0.0, 2_000, 4);
    assert!(alone("B", &thirty).engines[0].evictions > 0);
    assert_eq!(alone("A", &thirty).engines[0].evictions, 0);

    // Engine settings must name a pod, with the cluster's block size.
    let bad = |pod: &str, block_size| ClusterConfig {
        pod_engines: [(
            pod.to_owned(),
            kvroute_sim::engine::EngineConfig {
                block_size,
                ..base.engine
            },
        )]
        .into(),
        ..ClusterConfig::default()
    };
    assert!(Cluster::new(bad("C", 1568)).is_err());
    assert!(Cluster::new(bad("B", 16)).is_err());
    assert!(Cluster::new(bad("B", 1568)).is_ok());
}

#[test]
fn warm_and_index_lines_set_caches_and_the_index_before_the_first_request() {
    // A 3,000-token system prompt (one whole block of 1,568 reusable) and four questions on it,
    // one every 5 s (each alone).
    let questions: String = (0..4)
        .map(|i| {
            format!(
                "{{\"at\":{},\"prompt_id\":\"sys\",\"prompt_tokens\":3000,\"suffix\":\" Q{i}\",\"output_tokens\":4}}\n",
                i * 5
            )
        })
        .collect();
    let sys = "{\"pod\":\"B\",\"prompt_id\":\"sys\",\"prompt_tokens\":3000}";
    let first = |head: &str| {
        let trace = parse_trace(&format!("{head}{questions}")).unwrap();
        let mut c = Cluster::new(ClusterConfig::default()).unwrap();
        c.place(&trace.placements).unwrap();
        let r = c
            .run(&trace.arrivals, &spec(Strategy::PrefixCache), "t")
            .unwrap();
        let x = &r.records[0];
        (
            x.pod.clone().unwrap(),
            x.reason.clone().unwrap(),
            x.cached_tokens.unwrap(),
            r.token_hit.unwrap(),
        )
    };
    let warm = format!("{{\"warm\":{sys}}}\n");
    let index = format!("{{\"index\":{sys}}}\n");
    // Cold: the first request computes the prefix, the other three reuse it.
    let (_, reason, cached, _) = first("");
    assert_eq!((reason.as_str(), cached), ("least_request_fallback", 0));
    // Warm on B and indexed there: the first request already hits.
    let (pod, reason, cached, hit) = first(&format!("{warm}{index}"));
    assert_eq!(
        (pod.as_str(), reason.as_str(), cached),
        ("B", "prefix_match", 1568)
    );
    let hit_warm = hit;
    // Indexed on B but cold there: routed to B, computed there.
    let (pod, reason, cached, _) = first(&index);
    assert_eq!(
        (pod.as_str(), reason.as_str(), cached),
        ("B", "prefix_match", 0)
    );
    // Warm on every engine, indexed nowhere: a hit wherever it goes, and no warm-up traffic
    // counts in the run (the priming moved no counter).
    let every = "{\"warm\":{\"pod\":\"*\",\"prompt_id\":\"sys\",\"prompt_tokens\":3000}}\n";
    let (_, reason, cached, hit) = first(every);
    assert_eq!((reason.as_str(), cached), ("least_request_fallback", 1568));
    assert_eq!(hit, hit_warm);
    // A pod the cluster does not have.
    let trace = parse_trace(&format!(
        "{{\"index\":{{\"pod\":\"C\",\"prompt\":\"x\"}}}}\n{questions}"
    ))
    .unwrap();
    let mut c = Cluster::new(ClusterConfig::default()).unwrap();
    let e = c.place(&trace.placements).unwrap_err().to_string();
    assert_eq!(e, "trace line 1: no pod \"C\" in the cluster at the start");
}

#[test]
fn answers_may_stop_before_max_tokens_and_the_router_is_told_max_tokens() {
    // One slot: the second request waits for the first, and least-ttft predicts how long from
    // the first one's output limit (its max_tokens), not from what it will generate.
    let run = |first_max: u32| {
        let trace = format!(
            "{{\"at\":0,\"prompt_id\":\"a\",\"prompt_tokens\":100,\"max_tokens\":{first_max},\"output_tokens\":16}}\n\
             {{\"at\":0.1,\"prompt_id\":\"b\",\"prompt_tokens\":100,\"max_tokens\":64}}\n"
        );
        let cfg = ClusterConfig {
            pods: vec!["A".into()],
            engine: kvroute_sim::engine::EngineConfig {
                max_num_seqs: 1,
                ..Default::default()
            },
            ..ClusterConfig::default()
        };
        let trace = parse_trace(&trace).unwrap().arrivals;
        Cluster::new(cfg)
            .unwrap()
            .run(&trace, &spec(Strategy::LeastTtft), "t")
            .unwrap()
    };
    let queue_ms = |r: &kvroute_sim::cluster::RunResult| -> u64 {
        let d = r.records[1].decision.as_deref().unwrap();
        let v = d.split("pred_queue_ms=").nth(1).unwrap();
        v.split_whitespace().next().unwrap().parse().unwrap()
    };
    let (short, long) = (run(16), run(2_000));
    for r in [&short, &long] {
        // The answers are what they are, whatever was asked for.
        let out: Vec<u32> = r.records.iter().map(|x| x.output_tokens.unwrap()).collect();
        assert_eq!(out, [16, 64]);
        assert!(r.records.iter().all(|x| x.success));
    }
    assert_eq!(short.records[1].ttft_s, long.records[1].ttft_s);
    // The prior's 128 tokens at most, cut to the limit: ~16 decode steps against ~128.
    let (q_short, q_long) = (queue_ms(&short), queue_ms(&long));
    assert!(q_short > 0 && q_long > 4 * q_short, "{q_short} {q_long}");

    // Refused on max_tokens: 32,000 prompt tokens + 1,000 asked for exceed max-model-len,
    // though the 10 it would generate fit.
    let trace = parse_trace(
        "{\"at\":0,\"prompt_id\":\"x\",\"prompt_tokens\":32000,\"max_tokens\":1000,\"output_tokens\":10}\n\
         {\"at\":0,\"prompt_id\":\"y\",\"prompt_tokens\":32000,\"output_tokens\":10}\n",
    )
    .unwrap()
    .arrivals;
    let r = Cluster::new(ClusterConfig::default())
        .unwrap()
        .run(&trace, &spec(Strategy::Random), "t")
        .unwrap();
    assert_eq!(r.records[0].status, Some(400));
    assert!(r.records[1].success);
}

/// One request every 0.5 s for 20 s, each its own 1,000-token prompt, 60 output tokens (about
/// 2.5 s each): several in flight on every pod at any time.
fn steady() -> String {
    (0..40)
        .map(|i| {
            format!(
                "{{\"at\":{},\"prompt_id\":\"s{i}\",\"prompt_tokens\":1000,\"output_tokens\":60}}\n",
                f64::from(i) * 0.5
            )
        })
        .collect()
}

/// `steady()` with pod lines inserted before the first request at or after their time.
fn with_pod_lines(lines: &[(f64, &str, &str)]) -> kvroute_sim::workload::trace::Trace {
    let mut text = String::new();
    let mut pending = lines.iter().peekable();
    for (i, request) in steady().lines().enumerate() {
        let at = i as f64 * 0.5;
        while let Some((t, kind, pod)) = pending.next_if(|(t, _, _)| *t <= at) {
            text += &format!("{{\"at\":{t},\"{kind}\":\"{pod}\"}}\n");
        }
        text += request;
        text.push('\n');
    }
    parse_trace(&text).unwrap()
}

fn run_with_pods(
    pods: &[&str],
    lines: &[(f64, &str, &str)],
    strategy: Strategy,
) -> (Cluster, kvroute_sim::cluster::RunResult) {
    let trace = with_pod_lines(lines);
    let cfg = ClusterConfig {
        pods: pods.iter().map(|p| p.to_string()).collect(),
        pod_events: trace.pod_events.clone(),
        ..ClusterConfig::default()
    };
    let mut c = Cluster::new(cfg).unwrap();
    let r = c.run(&trace.arrivals, &spec(strategy), "t").unwrap();
    (c, r)
}

#[test]
fn a_pod_added_later_gets_requests_only_from_then_on() {
    let (c, r) = run_with_pods(
        &["A", "B", "C"],
        &[(10.0, "pod_add", "C")],
        Strategy::LeastRequest,
    );
    let on_c: Vec<f64> = r
        .records
        .iter()
        .filter(|x| x.pod.as_deref() == Some("C"))
        .map(|x| x.sent_s.unwrap())
        .collect();
    assert!(on_c.len() >= 5, "{on_c:?}");
    assert!(on_c.iter().all(|&t| t >= 10.0), "{on_c:?}");
    assert!(r.records.iter().all(|x| x.success));
    assert_eq!(c.router().open_tickets(), 0);
    assert_eq!(c.router().pods().len(), 3);
}

#[test]
fn a_removed_pod_finishes_what_it_has_and_gets_nothing_new() {
    let (c, r) = run_with_pods(
        &["A", "B"],
        &[(8.0, "pod_remove", "B")],
        Strategy::LeastRequest,
    );
    let on_b: Vec<&kvroute_sim::report::RequestRecord> = r
        .records
        .iter()
        .filter(|x| x.pod.as_deref() == Some("B"))
        .collect();
    assert!(on_b.iter().all(|x| x.sent_s.unwrap() < 8.0));
    // Some were still running at 8 s: they finished on B.
    assert!(on_b
        .iter()
        .any(|x| x.sent_s.unwrap() + x.e2e_s.unwrap() > 8.5));
    assert!(r.records.iter().all(|x| x.success));
    assert_eq!(c.router().pods().len(), 1);
    assert_eq!(c.router().open_tickets(), 0);
    // Added back: listed again, and it gets requests again.
    let (_, r) = run_with_pods(
        &["A", "B"],
        &[(8.0, "pod_remove", "B"), (12.0, "pod_add", "B")],
        Strategy::LeastRequest,
    );
    assert!(r
        .records
        .iter()
        .any(|x| x.pod.as_deref() == Some("B") && x.sent_s.unwrap() >= 12.0));
    assert!(r.records.iter().all(|x| x.success));
}

#[test]
fn a_failing_pod_fails_what_it_holds_and_what_reaches_it() {
    let (c, r) = run_with_pods(&["A", "B"], &[(8.0, "pod_fail", "B")], Strategy::Random);
    let failed: Vec<&kvroute_sim::report::RequestRecord> =
        r.records.iter().filter(|x| !x.success).collect();
    assert!(failed.iter().all(|x| x.pod.as_deref() == Some("B")));
    // Held by B at 8 s: reset.
    let reset: Vec<_> = failed.iter().filter(|x| x.status == Some(502)).collect();
    assert!(!reset.is_empty(), "{failed:?}");
    for x in &reset {
        assert_eq!(x.error.as_deref(), Some("pod B failed"));
        assert!(x.sent_s.unwrap() < 8.0);
    }
    // Sent to B after it died (the router is not told; random picks it until B's health
    // tracking ejects it): connection refused.
    let refused: Vec<_> = failed.iter().filter(|x| x.status == Some(503)).collect();
    assert!(!refused.is_empty(), "{failed:?}");
    for x in &refused {
        assert_eq!(
            x.error.as_deref(),
            Some("pod B is down (connection refused)")
        );
        assert!(x.sent_s.unwrap() >= 8.0);
    }
    assert_eq!(reset.len() + refused.len(), failed.len());
    assert_eq!(c.router().open_tickets(), 0);
    assert_eq!(c.router().pods().len(), 2, "still listed");
    // Every token generated is counted, the failed engine's included.
    let generated: u64 = r.engines.iter().map(|e| e.generation_tokens).sum();
    let answered = r.records.iter().filter(|x| x.success).count() as u64 * 60;
    assert!(generated > answered, "{generated} {answered}");

    // Dropped from discovery and started again: it serves again, from an empty cache.
    let lines = [
        (8.0, "pod_fail", "B"),
        (9.0, "pod_remove", "B"),
        (12.0, "pod_add", "B"),
    ];
    let (_, r) = run_with_pods(&["A", "B"], &lines, Strategy::LeastRequest);
    let later = |x: &&kvroute_sim::report::RequestRecord| x.sent_s.unwrap() >= 12.0;
    let back: Vec<_> = r
        .records
        .iter()
        .filter(|x| x.pod.as_deref() == Some("B"))
        .filter(later)
        .collect();
    assert!(
        back.len() >= 5 && back.iter().all(|x| x.success),
        "{back:?}"
    );
    assert!(r.records.iter().filter(later).all(|x| x.success));
}

#[test]
fn pod_lines_that_cannot_happen_are_errors_naming_the_line() {
    let cluster = |pods: &[&str], lines: &[(f64, &str, &str)], kv_events: bool| {
        let trace = with_pod_lines(lines);
        Cluster::new(ClusterConfig {
            pods: pods.iter().map(|p| p.to_string()).collect(),
            pod_events: trace.pod_events,
            kv_events,
            ..ClusterConfig::default()
        })
        .err()
        .map(|e| e.to_string())
    };
    for (lines, expect) in [
        (
            &[
                (1.0, "pod_fail", "A"),
                (2.0, "pod_add", "A"),
                (3.0, "pod_add", "A"),
            ][..],
            "pod_add \"A\": the pod is already serving",
        ),
        (
            &[(1.0, "pod_remove", "B"), (2.0, "pod_remove", "B")],
            "pod_remove \"B\": the pod is not listed",
        ),
        (
            &[(1.0, "pod_fail", "B"), (2.0, "pod_fail", "B")],
            "pod_fail \"B\": the pod is not running",
        ),
        (&[(1.0, "pod_fail", "C")], "no pod \"C\" in the cluster"),
    ] {
        let e = cluster(&["A", "B"], lines, false).expect("refused");
        assert!(e.starts_with("trace line ") && e.contains(expect), "{e}");
    }
    assert!(cluster(&["A", "B"], &[(1.0, "pod_fail", "B")], true)
        .is_some_and(|e| e.contains("KV events")));
    assert_eq!(
        cluster(
            &["A", "B"],
            &[(1.0, "pod_fail", "B"), (2.0, "pod_add", "B")],
            false
        ),
        None
    );
    // A pod a line adds later is not there for `warm` and `index` lines.
    let trace = parse_trace(
        "{\"warm\":{\"pod\":\"C\",\"prompt\":\"x\"}}\n{\"at\":0,\"prompt\":\"x\"}\n{\"at\":1,\"pod_add\":\"C\"}\n",
    )
    .unwrap();
    let mut c = Cluster::new(ClusterConfig {
        pods: vec!["A".into(), "C".into()],
        pod_events: trace.pod_events.clone(),
        ..ClusterConfig::default()
    })
    .unwrap();
    assert!(c.place(&trace.placements).is_err());
}

/// Each run reports, per pod, least-ttft's predictions against the first tokens the router was
/// told of: every answered request once, as a wait when one was predicted; the second run on
/// the same cluster counts only its own requests.
#[test]
fn a_run_reports_the_ttft_model_calibration_per_pod() {
    // One slot: of four requests sent at once, the first starts at once and three wait.
    let trace = parse_trace(&burst(4, 0.5, 3_000, 20)).unwrap().arrivals;
    let cfg = ClusterConfig {
        pods: vec!["A".into()],
        ..ClusterConfig::default()
    };
    let mut cluster = Cluster::new(ClusterConfig {
        router_max_seqs: Some(1),
        ..cfg
    })
    .unwrap();
    for _ in 0..2 {
        let run = cluster
            .run(&trace, &spec(Strategy::LeastTtft), "t")
            .unwrap();
        let [a] = &run.ttft_calibration[..] else {
            panic!("{:?}", run.ttft_calibration);
        };
        assert_eq!(a.pod, "A");
        assert_eq!((a.at_once.samples, a.waited.samples), (1, 3), "{a:?}");
        let mae = a.waited.mean_abs_error_s.unwrap();
        assert!(mae + 1e-9 >= a.waited.mean_error_s.unwrap().abs(), "{a:?}");
    }
}
