//! Property tests over random operation sequences: Σ in-flight = open tickets on live pods,
//! never a route to an unready or removed pod, index and LRU consistent, same seed + same
//! inputs → same decisions.

use kvroute_core::{
    BlockHash, Outcome, PodId, PodSpec, RouteRequest, Router, RouterConfig, Strategy as Routing,
    StrategySpec, Ticket, Timestamp,
};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    AddPod {
        pod: u8,
        ready: bool,
    },
    SetReady {
        pod: u8,
        ready: bool,
    },
    RemovePod {
        pod: u8,
    },
    Route {
        family: u8,
        len_blocks: u8,
        strategy: u8,
        dt: u16,
    },
    Complete {
        nth: u8,
        outcome: u8,
    },
    CompleteBogus {
        raw: u64,
    },
    /// A first-token report for the `nth` open ticket (or a bogus one), with arbitrary
    /// timings.
    FirstToken {
        nth: u8,
        bogus: bool,
        first_ms: Option<u32>,
        prompt: Option<u32>,
        cached: Option<u32>,
    },
    Tick {
        dt: u32,
    },
    /// An active health check of a pod.
    Check {
        pod: u8,
        passed: bool,
    },
    /// An engine snapshot of a pod (what the AIBrix metric strategies read).
    Engine {
        pod: u8,
        kv_quarters: Option<u8>,
        prefills: Option<u8>,
        seconds: Option<u8>,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0u8..6, any::<bool>()).prop_map(|(pod, ready)| Op::AddPod { pod, ready }),
        2 => (0u8..6, any::<bool>()).prop_map(|(pod, ready)| Op::SetReady { pod, ready }),
        1 => (0u8..6).prop_map(|pod| Op::RemovePod { pod }),
        8 => (0u8..5, 0u8..12, 0u8..12, 0u16..2_000).prop_map(|(family, len_blocks, strategy, dt)| Op::Route { family, len_blocks, strategy, dt }),
        5 => (any::<u8>(), 0u8..6).prop_map(|(nth, outcome)| Op::Complete { nth, outcome }),
        2 => (0u8..6, any::<bool>()).prop_map(|(pod, passed)| Op::Check { pod, passed }),
        1 => any::<u64>().prop_map(|raw| Op::CompleteBogus { raw }),
        3 => (any::<u8>(), any::<bool>(), any::<Option<u32>>(), any::<Option<u32>>(), any::<Option<u32>>())
            .prop_map(|(nth, bogus, first_ms, prompt, cached)| Op::FirstToken { nth, bogus, first_ms, prompt, cached }),
        1 => (0u32..400_000).prop_map(|dt| Op::Tick { dt }),
        2 => (0u8..6, any::<Option<u8>>(), any::<Option<u8>>(), any::<Option<u8>>())
            .prop_map(|(pod, kv, prefills, seconds)| Op::Engine { pod, kv_quarters: kv.map(|q| q % 5), prefills, seconds }),
    ]
}

fn hashes(family: u8, len_blocks: u8) -> Vec<BlockHash> {
    // Families share no prefix; longer prompts of a family extend shorter ones.
    (0..u64::from(len_blocks))
        .map(|i| BlockHash(u64::from(family) << 32 | i))
        .collect()
}

/// AIBrix's session id of a pod address: standard base64 of its `ip:port`.
fn session_id_of(address: &str) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in address.as_bytes().chunks(3) {
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

/// Runs the ops, checking invariants after each; returns the decisions as (pod, reason) text.
fn run(ops: &[Op], seed: u64) -> Vec<String> {
    let config = RouterConfig {
        seed,
        index_capacity: 40,
        index_ttl_ms: 60_000,
        ticket_ttl_ms: 300_000,
        imbalance_abs_count: 3,
        health: kvroute_core::HealthConfig {
            consecutive_5xx: 2,
            consecutive_gateway_failures: 1,
            base_ejection_ms: 5_000,
            max_ejection_percent: 50,
            unhealthy_threshold: 2,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut r = Router::new(config).unwrap();
    let specs = [
        StrategySpec::single(Routing::Random),
        StrategySpec::single(Routing::LeastRequest),
        StrategySpec::single(Routing::PrefixCache),
        StrategySpec::parse("prefix-cache:2,least-request,random").unwrap(),
        StrategySpec::single(Routing::LeastTtft),
        StrategySpec::parse("least-ttft:3,prefix-cache").unwrap(),
        StrategySpec::single(Routing::LeastKvCache),
        StrategySpec::single(Routing::LeastBusyTime),
        StrategySpec::single(Routing::LeastLatency),
        StrategySpec::single(Routing::PowerOfTwo),
        StrategySpec::single(Routing::SessionAffinity),
        StrategySpec::parse("throughput:2,session-affinity,least-utilization,least-gpu-cache")
            .unwrap(),
    ];
    let mut now = 0u64;
    let mut open: Vec<Ticket> = Vec::new();
    let mut ids: Vec<Option<PodId>> = vec![None; 6];
    let mut log = Vec::new();
    for op in ops {
        match *op {
            Op::AddPod { pod, ready } => {
                let name = format!("p{pod}");
                let addr = format!("10.0.0.{}:8000", pod + 1);
                ids[pod as usize] = Some(
                    r.add_pod(
                        "m",
                        PodSpec {
                            name: &name,
                            address: &addr,
                            ready,
                        },
                    )
                    .unwrap(),
                );
            }
            Op::SetReady { pod, ready } => {
                if let Some(id) = ids[pod as usize] {
                    r.set_pod_ready(id, ready).unwrap();
                }
            }
            Op::RemovePod { pod } => {
                if let Some(id) = ids[pod as usize].take() {
                    r.remove_pod(id).unwrap();
                    assert!(r.pod(id).is_none());
                }
            }
            Op::Route {
                family,
                len_blocks,
                strategy,
                dt,
            } => {
                now += u64::from(dt);
                let h = hashes(family, len_blocks);
                // A session id naming one of p0..p4 (live or not).
                let session = format!("10.0.0.{}:8000", family + 1);
                let session = session_id_of(&session);
                let req = RouteRequest::new("m", &h)
                    .with_strategy(&specs[strategy as usize])
                    .with_session_id(Some(&session));
                match r.route(req, Timestamp::from_millis(now)) {
                    Ok(d) => {
                        let info = r.pod(d.pod).expect("routed to a live pod");
                        assert!(info.ready, "routed to an unready pod");
                        assert!(
                            !info.health.checks_failing,
                            "routed to a pod failing checks"
                        );
                        assert!(
                            !info.health.ejected || d.health_probe,
                            "routed to an ejected pod, not as its probe"
                        );
                        assert!(d.matched_blocks <= d.total_blocks && d.match_percent <= 100);
                        open.push(d.ticket);
                        log.push(format!("{}:{}", d.pod_name, d.reason));
                    }
                    Err(e) => {
                        // Health may leave no candidate, but only through checks or probes
                        // already out: ejection alone always leaves a pod in service.
                        let any_ready = r
                            .pods()
                            .iter()
                            .any(|p| p.ready && !p.health.checks_failing && !p.health.ejected);
                        assert!(
                            !any_ready || matches!(e, kvroute_core::RouteError::UnknownModel),
                            "{e}"
                        );
                        log.push(format!("err:{e}"));
                    }
                }
            }
            Op::Complete { nth, outcome } => {
                if !open.is_empty() {
                    let t = open.remove(nth as usize % open.len());
                    let outcome = Outcome::ALL[outcome as usize];
                    // May have expired meanwhile. Open, it completes and frees exactly its
                    // slot (none if its pod was removed); closed, it is refused.
                    let was_open = r.is_open(t);
                    let in_flight = |r: &Router| r.pods().iter().map(|p| p.in_flight).sum::<u32>();
                    let before = in_flight(&r);
                    let first = r.complete(t, outcome.into(), Timestamp::from_millis(now));
                    match (was_open, first) {
                        (true, Ok(released)) => assert_eq!(
                            in_flight(&r) + u32::from(!released.orphaned),
                            before,
                            "one slot freed"
                        ),
                        (false, Err(_)) => assert_eq!(in_flight(&r), before),
                        (was_open, first) => panic!("open: {was_open}, completion: {first:?}"),
                    }
                    assert!(
                        r.complete(t, outcome.into(), Timestamp::from_millis(now))
                            .is_err(),
                        "second completion accepted"
                    );
                }
            }
            Op::Check { pod, passed } => {
                if let Some(id) = ids[pod as usize] {
                    r.report_health_check(id, passed, Timestamp::from_millis(now))
                        .unwrap();
                }
            }
            Op::Engine {
                pod,
                kv_quarters,
                prefills,
                seconds,
            } => {
                if let Some(id) = ids[pod as usize] {
                    let snapshot = kvroute_core::EngineSnapshot {
                        running: 1,
                        kv_usage: kv_quarters.map(|q| f64::from(q) / 4.0),
                        prefills: prefills.map(u64::from),
                        prefix_queries: prefills.map(|n| u64::from(n) * 300),
                        inter_tokens: prefills.map(|n| u64::from(n) * 40),
                        prefill_seconds: seconds.map(f64::from),
                        inter_token_seconds: seconds.map(|s| f64::from(s) * 3.0),
                        ..Default::default()
                    };
                    r.observe_engine(id, snapshot, Timestamp::from_millis(now))
                        .unwrap();
                }
            }
            Op::CompleteBogus { raw } => {
                let t = Ticket::from_u64(raw);
                if !open.contains(&t) {
                    let before: Vec<u32> = r.pods().iter().map(|p| p.in_flight).collect();
                    let _ = r.complete(t, Outcome::Success.into(), Timestamp::from_millis(now));
                    let after: Vec<u32> = r.pods().iter().map(|p| p.in_flight).collect();
                    assert_eq!(before, after, "a bogus completion changed a count");
                }
            }
            Op::FirstToken {
                nth,
                bogus,
                first_ms,
                prompt,
                cached,
            } => {
                let t = match (bogus, open.is_empty()) {
                    (false, false) => open[nth as usize % open.len()],
                    _ => Ticket::from_u64(u64::MAX - u64::from(nth)),
                };
                let timings = kvroute_core::Timings {
                    first_token_ms: first_ms.map(u64::from),
                    prompt_tokens: prompt,
                    cached_tokens: cached,
                    ..Default::default()
                };
                let before: Vec<u32> = r.pods().iter().map(|p| p.in_flight).collect();
                let res = r.first_token(t, timings, Timestamp::from_millis(now));
                let after: Vec<u32> = r.pods().iter().map(|p| p.in_flight).collect();
                assert_eq!(before, after, "a first-token report changed a count");
                assert!(res.is_ok() || !r.is_open(t), "{res:?} for an open ticket");
            }
            Op::Tick { dt } => {
                now += u64::from(dt);
                r.handle_timeout(Timestamp::from_millis(now));
                if let Some(next) = r.poll_timeout() {
                    assert!(next.as_millis() > now, "handle_timeout left due work");
                }
            }
        }
        r.check_invariants().unwrap();
        assert!(r.index().len() <= 40);
        let open_on_live = r.pods().iter().map(|p| u64::from(p.in_flight)).sum::<u64>();
        assert!(open_on_live <= r.open_tickets() as u64);
    }
    log
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_under_any_sequence(ops in proptest::collection::vec(op(), 1..120)) {
        run(&ops, 1);
    }

    #[test]
    fn same_seed_same_inputs_same_decisions(ops in proptest::collection::vec(op(), 1..80), seed in any::<u64>()) {
        prop_assert_eq!(run(&ops, seed), run(&ops, seed));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Hashing never panics and yields one hash per complete block for any bytes and block size.
    #[test]
    fn hashing_is_total(prompt in proptest::collection::vec(any::<u8>(), 0..2_000), block in 1usize..300, seed in any::<u64>()) {
        let cfg = kvroute_core::HashConfig::new(block, seed).unwrap();
        let h = cfg.hashes(&prompt);
        prop_assert_eq!(h.len(), prompt.len() / block);
        let longer = cfg.hashes(&[prompt.as_slice(), b"tail-bytes"].concat());
        prop_assert_eq!(&longer[..h.len()], &h[..]);
    }

    /// Strategy spec parsing never panics on arbitrary text.
    #[test]
    fn strategy_parsing_is_total(s in ".{0,40}") {
        let _ = StrategySpec::parse(&s);
    }
}
