//! The discrete-event cluster on small workloads (fast in debug builds).

use std::collections::BTreeMap;

use kvroute_core::{Strategy, StrategySpec};
use kvroute_sim::cluster::{Cluster, ClusterConfig, Feedback, ENVOY_TIMED_STREAMS};
use kvroute_sim::workload::{parse_trace, synthetic_prompt, Arrival};

fn arrival(at_s: f64, prompt: String, out: u32) -> Arrival {
    Arrival {
        at_us: (at_s * 1e6) as u64,
        family: None,
        prompt: prompt.into(),
        output_tokens: out,
        max_tokens: out,
        headers: BTreeMap::new(),
        follows: None,
        answer: None,
    }
}

#[test]
fn every_request_is_routed_by_the_core_and_completed() {
    let arrivals: Vec<Arrival> = (0..20)
        .map(|i| {
            arrival(
                f64::from(i) * 0.2,
                synthetic_prompt(if i % 2 == 0 { "a" } else { "b" }, 2_000) + &format!(" q{i}"),
                8,
            )
        })
        .collect();
    let mut c = Cluster::new(ClusterConfig::default()).unwrap();
    let r = c
        .run(&arrivals, &StrategySpec::single(Strategy::PrefixCache), "t")
        .unwrap();
    assert_eq!(r.records.len(), 20);
    assert!(r
        .records
        .iter()
        .all(|x| x.success && x.output_tokens == Some(8) && x.decision.is_some()));
    assert_eq!(c.router().open_tickets(), 0, "every ticket completed");
    // Two prefixes, each kept on one pod by prefix-cache: 2 misses, 18 hits of one block.
    let hits = r
        .records
        .iter()
        .filter(|x| x.cached_tokens == Some(1568))
        .count();
    assert_eq!(hits, 18);
    assert_eq!(r.reasons.get("least_request_fallback"), Some(&2));
    assert!(r.samples.len() >= 2 && r.samples[0].t_s == 0.0);
}

#[test]
fn the_client_cap_holds_requests_back_and_ttft_counts_from_the_send() {
    let arrivals: Vec<Arrival> = (0..6)
        .map(|i| arrival(0.0, synthetic_prompt(&format!("p{i}"), 100), 20))
        .collect();
    let cfg = ClusterConfig {
        client_cap: 2,
        pods: vec!["A".into()],
        ..ClusterConfig::default()
    };
    let r = Cluster::new(cfg)
        .unwrap()
        .run(&arrivals, &StrategySpec::single(Strategy::Random), "t")
        .unwrap();
    let sent: Vec<f64> = r.records.iter().map(|x| x.sent_s.unwrap()).collect();
    assert_eq!(&sent[..2], &[0.0, 0.0]);
    assert!(sent[2] > 0.5 && sent[4] > sent[2], "{sent:?}");
    assert!(
        r.records.iter().all(|x| x.ttft_s.unwrap() < 0.5),
        "the engine never queues behind the cap"
    );
}

#[test]
fn trace_headers_override_the_strategy_and_bad_requests_fail_cleanly() {
    let trace = "{\"at\":0,\"prompt\":\"hello\",\"output_tokens\":2,\"headers\":{\"routing-strategy\":\"least-request\"}}\n\
                 {\"at\":0.1,\"prompt_id\":\"x\",\"prompt_tokens\":33000,\"output_tokens\":2}\n\
                 {\"at\":0.2,\"prompt\":\"bye\",\"output_tokens\":2}\n";
    let arrivals = parse_trace(trace).unwrap().arrivals;
    let mut c = Cluster::new(ClusterConfig::default()).unwrap();
    let r = c
        .run(&arrivals, &StrategySpec::single(Strategy::Random), "t")
        .unwrap();
    assert_eq!(r.records[0].reason.as_deref(), Some("least_request"));
    assert_eq!(r.records[2].reason.as_deref(), Some("random"));
    assert!(
        !r.records[1].success
            && r.records[1]
                .error
                .as_deref()
                .is_some_and(|e| e.contains("max-model-len"))
    );
    assert!(r.records[0].success && r.records[2].success);
    assert_eq!(c.router().open_tickets(), 0);

    let bad = parse_trace(
        "{\"at\":0,\"prompt\":\"x\",\"headers\":{\"routing-strategy\":\"round-robin\"}}",
    )
    .unwrap()
    .arrivals;
    let mut c = Cluster::new(ClusterConfig::default()).unwrap();
    assert!(c.run(&bad, &StrategySpec::default(), "t").is_err());
    assert!(Cluster::new(ClusterConfig {
        pods: vec![],
        ..ClusterConfig::default()
    })
    .is_err());
    assert!(Cluster::new(ClusterConfig {
        client_cap: 0,
        ..ClusterConfig::default()
    })
    .is_err());
}

/// Behind Envoy at most 4 responses at once are timed; the others complete with the total time
/// only, and every ticket is completed either way. Without timing none is.
#[test]
fn behind_envoy_a_few_responses_at_once_are_timed() {
    // 30 cold prompts, one every 0.5 s over two pods: each prefills at once (a cold prefill,
    // which may take the whole budget) and decodes for seconds, so many more are open than the
    // budget.
    let arrivals: Vec<Arrival> = (0..30)
        .map(|i| {
            arrival(
                f64::from(i) * 0.5,
                synthetic_prompt(&format!("p{i}"), 3_000),
                80,
            )
        })
        .collect();
    let run = |feedback| {
        let mut c = Cluster::new(ClusterConfig {
            feedback,
            ..ClusterConfig::default()
        })
        .unwrap();
        let r = c
            .run(&arrivals, &StrategySpec::single(Strategy::LeastTtft), "t")
            .unwrap();
        assert!(r.records.iter().all(|x| x.success));
        assert_eq!(c.router().open_tickets(), 0, "every ticket completed");
        r
    };
    let envoy = run(Feedback::Envoy);
    assert_eq!(envoy.peak_timed_responses, ENVOY_TIMED_STREAMS);
    assert!(
        envoy.timed_responses > ENVOY_TIMED_STREAMS as u64 && envoy.timed_responses < 30,
        "{}",
        envoy.timed_responses
    );
    let untimed = run(Feedback::TotalOnly);
    assert_eq!(
        (untimed.timed_responses, untimed.peak_timed_responses),
        (0, 0)
    );
}
