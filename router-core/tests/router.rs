//! Behaviour of the router façade: registry, tickets, timers, strategies end to end.

mod common;

use common::{router_with_pods, salt, study_prompt, t, MODEL};
use kvroute_core::{
    Completion, Outcome, PodSpec, Reason, RegistryError, RouteError, RouteRequest, Router,
    RouterConfig, Strategy, StrategySpec, TicketError,
};

fn cfg() -> RouterConfig {
    RouterConfig {
        seed: 11,
        ..Default::default()
    }
}

#[test]
fn unknown_model_and_no_ready_pod_are_typed_errors() {
    let (mut r, pods) = router_with_pods(2, cfg());
    assert_eq!(
        r.route(RouteRequest::new("other", &[]), t(0)).unwrap_err(),
        RouteError::UnknownModel
    );
    assert_eq!(
        r.route(RouteRequest::new("", &[]), t(0)).unwrap_err(),
        RouteError::UnknownModel
    );
    for p in &pods {
        r.set_pod_ready(*p, false).unwrap();
    }
    assert_eq!(
        r.route(RouteRequest::new(MODEL, &[]), t(0)).unwrap_err(),
        RouteError::NoReadyPod
    );
    let st = r.stats();
    assert_eq!(st.unknown_model, 2);
    assert_eq!(st.models[0].no_ready_pod, 1);
}

#[test]
fn registry_rejects_bad_input() {
    let mut r = Router::new(cfg()).unwrap();
    let spec = |name, address| PodSpec {
        name,
        address,
        ready: true,
    };
    assert_eq!(
        r.add_pod(MODEL, spec("", "1.2.3.4:80")),
        Err(RegistryError::EmptyPodName)
    );
    assert_eq!(
        r.add_pod("", spec("a", "1.2.3.4:80")),
        Err(RegistryError::EmptyModelName)
    );
    assert!(matches!(
        r.add_pod(MODEL, spec("a", "pod-a:80")),
        Err(RegistryError::InvalidAddress(_))
    ));
    assert!(matches!(
        r.add_pod(MODEL, spec("a", "1.2.3.4")),
        Err(RegistryError::InvalidAddress(_))
    ));
    assert!(r.add_pod(MODEL, spec("a", "[::1]:8000")).is_ok());
    let ghost = kvroute_core::PodId::from_u32(99);
    assert_eq!(
        r.set_pod_ready(ghost, true),
        Err(RegistryError::UnknownPod(ghost))
    );
    assert_eq!(r.remove_pod(ghost), Err(RegistryError::UnknownPod(ghost)));
}

#[test]
fn pod_updates_keep_in_flight_counts() {
    let (mut r, pods) = router_with_pods(1, cfg());
    let d = r.route(RouteRequest::new(MODEL, &[]), t(0)).unwrap();
    assert_eq!(r.in_flight(pods[0]), Some(1));
    // New address, not ready, then ready again: the count survives (AIBrix resets it).
    let id = r
        .upsert_pod(PodSpec {
            name: "pod-0",
            address: "10.9.9.9:9000",
            ready: false,
        })
        .unwrap();
    assert_eq!(id, pods[0]);
    r.set_pod_ready(id, true).unwrap();
    assert_eq!(r.in_flight(id), Some(1));
    assert_eq!(&*r.pod(id).unwrap().address, "10.9.9.9:9000");
    r.set_pod_address(id, "10.9.9.8:9000").unwrap();
    assert_eq!(
        (r.pod_name(id), r.pod_address(id)),
        (Some("pod-0"), Some("10.9.9.8:9000"))
    );
    assert!(matches!(
        r.set_pod_address(id, "nope"),
        Err(RegistryError::InvalidAddress(_))
    ));
    assert!(r.is_open(d.ticket));
    r.complete(d.ticket, Outcome::Success.into(), t(1)).unwrap();
    assert_eq!(r.in_flight(id), Some(0));
    assert!(!r.is_open(d.ticket));
}

#[test]
fn tickets_complete_exactly_once() {
    let (mut r, pods) = router_with_pods(2, cfg());
    let d = r.route(RouteRequest::new(MODEL, &[]), t(0)).unwrap();
    assert_eq!(r.open_tickets(), 1);
    let released = r
        .complete(d.ticket, Completion::new(Outcome::Cancelled), t(5))
        .unwrap();
    assert_eq!(
        (released.pod, released.orphaned, released.age_ms),
        (d.pod, false, 5)
    );
    assert_eq!(
        r.complete(d.ticket, Outcome::Success.into(), t(6)),
        Err(TicketError::NotOpen(d.ticket))
    );
    let never = kvroute_core::Ticket::from_u64(1_000);
    assert_eq!(
        r.complete(never, Outcome::Success.into(), t(6)),
        Err(TicketError::NeverIssued(never))
    );
    assert!(pods.iter().all(|p| r.in_flight(*p) == Some(0)));
    let st = r.stats().tickets;
    assert_eq!(
        (st.issued, st.completed, st.rejected, st.open),
        (1, [0, 1, 0, 0, 0, 0], 2, 0)
    );
}

#[test]
fn removed_pods_orphan_their_tickets_and_leave_the_index() {
    let (mut r, pods) = router_with_pods(2, cfg());
    let h = r.hash_config().hashes(&[b'x'; 1024]);
    let d = r.route(RouteRequest::new(MODEL, &h), t(0)).unwrap();
    let blocks_before = r.index().len();
    assert_eq!(blocks_before, 8);
    r.remove_pod(d.pod).unwrap();
    assert_eq!(r.index().len(), 0);
    assert_eq!(r.pod(d.pod), None);
    let released = r.complete(d.ticket, Outcome::Success.into(), t(1)).unwrap();
    assert!(released.orphaned);
    // Re-adding the name yields a new id with a fresh count; the old ticket cannot touch it.
    let again = r
        .add_pod(
            MODEL,
            PodSpec {
                name: &d.pod_name,
                address: "10.0.0.99:8000",
                ready: true,
            },
        )
        .unwrap();
    assert_ne!(again, d.pod);
    assert_eq!(r.in_flight(again), Some(0));
    let other = pods.iter().find(|p| **p != d.pod).unwrap();
    for i in 0..20 {
        let d2 = r.route(RouteRequest::new(MODEL, &h), t(2 + i)).unwrap();
        assert!(d2.pod == again || d2.pod == *other);
    }
    r.check_invariants().unwrap();
}

#[test]
fn expired_tickets_release_their_slots_and_late_completions_are_rejected() {
    let (mut r, pods) = router_with_pods(
        1,
        RouterConfig {
            ticket_ttl_ms: 1_000,
            ..cfg()
        },
    );
    let d = r.route(RouteRequest::new(MODEL, &[]), t(100)).unwrap();
    assert_eq!(r.poll_timeout(), Some(t(1_100)));
    r.handle_timeout(t(1_099));
    assert_eq!(r.in_flight(pods[0]), Some(1));
    r.handle_timeout(t(1_100));
    assert_eq!(r.in_flight(pods[0]), Some(0));
    assert_eq!(r.stats().tickets.expired, 1);
    assert_eq!(
        r.complete(d.ticket, Outcome::Success.into(), t(1_200)),
        Err(TicketError::NotOpen(d.ticket))
    );
    assert_eq!(r.poll_timeout(), None);
}

#[test]
fn index_ttl_is_driven_by_poll_timeout() {
    let (mut r, _) = router_with_pods(
        2,
        RouterConfig {
            index_ttl_ms: 500,
            ..cfg()
        },
    );
    let h = r.hash_config().hashes(&[b'y'; 512]);
    let d = r.route(RouteRequest::new(MODEL, &h), t(0)).unwrap();
    r.complete(d.ticket, Outcome::Success.into(), t(10))
        .unwrap();
    assert_eq!(r.poll_timeout(), Some(t(500)));
    r.handle_timeout(t(500));
    assert_eq!(r.index().len(), 0);
    assert_eq!(r.poll_timeout(), None);
}

#[test]
fn a_clock_that_steps_back_cannot_reorder_state() {
    let (mut r, _) = router_with_pods(
        1,
        RouterConfig {
            ticket_ttl_ms: 100,
            ..cfg()
        },
    );
    r.route(RouteRequest::new(MODEL, &[]), t(1_000)).unwrap();
    r.route(RouteRequest::new(MODEL, &[]), t(10)).unwrap(); // treated as t(1000)
    assert_eq!(r.poll_timeout(), Some(t(1_100)));
    r.handle_timeout(t(1_100));
    assert_eq!(r.open_tickets(), 0);
}

#[test]
fn one_ready_pod_is_still_indexed() {
    let (mut r, pods) = router_with_pods(1, cfg());
    let h = r.hash_config().hashes(&[b'z'; 300]);
    let d = r.route(RouteRequest::new(MODEL, &h), t(0)).unwrap();
    assert_eq!(
        (d.pod, d.reason, d.total_blocks),
        (pods[0], Reason::LeastRequestFallback, 2)
    );
    let d = r.route(RouteRequest::new(MODEL, &h), t(1)).unwrap();
    assert_eq!(
        (d.reason, d.match_percent, d.matched_blocks),
        (Reason::PrefixMatch, 100, 2)
    );
}

#[test]
fn explanation_is_one_header_safe_line() {
    let (mut r, _) = router_with_pods(2, cfg());
    let h = r.hash_config().hashes(&[b'q'; 1000]);
    r.route(RouteRequest::new(MODEL, &h), t(0)).unwrap();
    let d = r.route(RouteRequest::new(MODEL, &h), t(1)).unwrap();
    let line = d.to_string();
    assert!(
        line.starts_with("strategy=prefix-cache reason=prefix_match pod=pod-"),
        "{line}"
    );
    assert!(
        line.contains("match=100% blocks=7/7 imbalance=0 load=1"),
        "{line}"
    );
    assert!(
        line.bytes().all(|b| (0x20..0x7f).contains(&b)) && !line.contains(','),
        "{line}"
    );
}

#[test]
fn request_strategy_overrides_the_default_and_weighted_specs_route() {
    let (mut r, _) = router_with_pods(
        3,
        RouterConfig {
            default_strategy: Strategy::LeastRequest.into(),
            ..cfg()
        },
    );
    let d = r.route(RouteRequest::new(MODEL, &[]), t(0)).unwrap();
    assert_eq!(d.reason, Reason::LeastRequest);
    let random = StrategySpec::single(Strategy::Random);
    assert_eq!(
        r.route(RouteRequest::new(MODEL, &[]).with_strategy(&random), t(0))
            .unwrap()
            .reason,
        Reason::Random
    );
    let mixed = StrategySpec::parse("prefix-cache:2,least-request").unwrap();
    let h = r.hash_config().hashes(&[b'w'; 1280]);
    let first = r
        .route(RouteRequest::new(MODEL, &h).with_strategy(&mixed), t(0))
        .unwrap();
    assert_eq!(first.reason, Reason::Weighted);
    // The matching pod has load 1 against 0/1 elsewhere: prefix weight 2 keeps it.
    let second = r
        .route(RouteRequest::new(MODEL, &h).with_strategy(&mixed), t(1))
        .unwrap();
    assert_eq!(second.pod, first.pod);
}

#[test]
fn reconfigure_keeps_state_and_clears_the_index_only_when_hashing_changes() {
    let (mut r, pods) = router_with_pods(2, cfg());
    let h = r.hash_config().hashes(&[b'r'; 1280]);
    let d = r.route(RouteRequest::new(MODEL, &h), t(0)).unwrap();
    r.reconfigure(RouterConfig {
        imbalance_abs_count: 4,
        ..cfg()
    })
    .unwrap();
    assert_eq!(r.index().len(), 10);
    r.reconfigure(RouterConfig {
        block_size: 64,
        ..cfg()
    })
    .unwrap();
    assert_eq!(r.index().len(), 0);
    assert_eq!(r.hash_config().block_size(), 64);
    assert_eq!(
        pods.iter().map(|p| r.in_flight(*p).unwrap()).sum::<u32>(),
        1
    );
    assert!(r
        .reconfigure(RouterConfig {
            index_capacity: 0,
            ..cfg()
        })
        .is_err());
    assert_eq!(
        r.config().block_size,
        64,
        "a rejected config leaves the old one in force"
    );
    r.complete(d.ticket, Outcome::Success.into(), t(1)).unwrap();
}

#[test]
fn detach_stops_routing_a_model_to_the_pod() {
    let (mut r, pods) = router_with_pods(2, cfg());
    r.detach_pod(MODEL, pods[0]).unwrap();
    for i in 0..10 {
        assert_eq!(
            r.route(RouteRequest::new(MODEL, &[]), t(i)).unwrap().pod,
            pods[1]
        );
    }
    assert!(matches!(
        r.detach_pod("nope", pods[0]),
        Err(RegistryError::UnknownModel(_))
    ));
}

#[test]
fn a_removed_model_is_unknown_and_its_pods_and_tickets_carry_on() {
    let (mut r, pods) = router_with_pods(2, cfg());
    r.add_pod(
        "other",
        PodSpec {
            name: "pod-0",
            address: "10.0.0.1:8000",
            ready: true,
        },
    )
    .unwrap();
    let h = r.hash_config().hashes(&[b'x'; 1024]);
    let open = r.route(RouteRequest::new(MODEL, &h), t(0)).unwrap();
    let other = r.hash_config().hashes(&[b'y'; 1024]);
    r.route(RouteRequest::new("other", &other), t(1)).unwrap();
    assert_eq!(r.index().len(), 16, "8 blocks for each model");

    r.remove_model(MODEL).unwrap();
    assert!(matches!(
        r.route(RouteRequest::new(MODEL, &h), t(2)),
        Err(RouteError::UnknownModel)
    ));
    assert_eq!(r.index().len(), 8, "only the other model's blocks are left");
    assert_eq!(r.pod(pods[0]).unwrap().models, vec!["other".into()]);
    assert!(r.pod(pods[1]).unwrap().models.is_empty());
    assert!(r.model_pods(MODEL).is_empty());
    assert_eq!(r.model_pods("other"), vec![pods[0]]);
    // The open ticket still releases its slot, once.
    assert_eq!(
        r.in_flight(open.pod),
        Some(if open.pod == pods[0] { 2 } else { 1 })
    );
    let released = r
        .complete(open.ticket, Outcome::Success.into(), t(3))
        .unwrap();
    assert!(!released.orphaned);
    r.check_invariants().unwrap();
    assert!(matches!(
        r.remove_model(MODEL),
        Err(RegistryError::UnknownModel(_))
    ));
    assert_eq!(r.models(), vec!["other".into()]);
    // Added again, it routes again, with the same statistics (one series per name).
    r.add_pod(
        MODEL,
        PodSpec {
            name: "pod-1",
            address: "10.0.0.2:8000",
            ready: true,
        },
    )
    .unwrap();
    let again = r.route(RouteRequest::new(MODEL, &h), t(4)).unwrap();
    assert_eq!(
        (again.pod, again.match_percent),
        (pods[1], 0),
        "nothing is remembered"
    );
    let stats = r.stats();
    let names: Vec<&str> = stats.models.iter().map(|m| &*m.model).collect();
    assert_eq!(names, [MODEL, "other"]);
    let routed: u64 = stats.models[0].routed_by_reason.iter().sum();
    assert_eq!(routed, 2, "before and after the removal");
    assert_eq!(r.models(), vec![MODEL.into(), "other".into()]);
}

/// The study's hot50 shape: two pods, the hot family's prefix already indexed on B, 48 hot and
/// 48 other requests, loads kept below the guard (each request completes before the next few).
#[test]
fn hot50_prefix_cache_pins_the_hot_family_while_least_request_splits() {
    let mut rng = fastrand::Rng::with_seed(102);
    let salts: Vec<String> = (0..8).map(|_| salt(&mut rng)).collect();
    let mut families: Vec<usize> = std::iter::repeat_n(0, 48)
        .chain((0..48).map(|i| 1 + i % 7))
        .collect();
    rng.shuffle(&mut families);

    let run = |strategy: Strategy| {
        let (mut r, pods) = router_with_pods(
            2,
            RouterConfig {
                seed: 5,
                default_strategy: strategy.into(),
                ..Default::default()
            },
        );
        let (a, b) = (pods[0], pods[1]);
        // Initial placement: the hot family (0) and families 1..=3 live on B, 4..=7 on A.
        for (f, s) in salts.iter().enumerate() {
            let h = r.hash_config().hashes(study_prompt(s, f, 0).as_bytes());
            let home = if f == 0 || f <= 3 { b } else { a };
            let only = StrategySpec::single(Strategy::PrefixCache);
            r.set_pod_ready(if home == a { b } else { a }, false)
                .unwrap();
            let d = r
                .route(RouteRequest::new(MODEL, &h).with_strategy(&only), t(0))
                .unwrap();
            r.complete(d.ticket, Outcome::Success.into(), t(0)).unwrap();
            r.set_pod_ready(a, true).unwrap();
            r.set_pod_ready(b, true).unwrap();
        }
        let mut open = std::collections::VecDeque::new();
        let mut hot_on_b = 0;
        let mut total_on_b = 0;
        for (i, &f) in families.iter().enumerate() {
            let now = t(1_000 + i as u64 * 625);
            if open.len() >= 8 {
                let ticket = open.pop_front().unwrap();
                r.complete(ticket, Outcome::Success.into(), now).unwrap();
            }
            let h = r
                .hash_config()
                .hashes(study_prompt(&salts[f], f, 100_000 + i as u32).as_bytes());
            let d = r.route(RouteRequest::new(MODEL, &h), now).unwrap();
            assert!(!d.imbalance, "loads stay below the guard");
            open.push_back(d.ticket);
            if d.pod == b {
                total_on_b += 1;
                if f == 0 {
                    hot_on_b += 1;
                }
            }
        }
        r.check_invariants().unwrap();
        (hot_on_b, total_on_b, r.stats().models[0].clone())
    };

    let (hot_on_b, _, stats) = run(Strategy::PrefixCache);
    assert_eq!(hot_on_b, 48, "prefix-cache sends every hot request to B");
    assert_eq!(
        stats.routed(Reason::PrefixMatch),
        96,
        "every request matched its family's prefix"
    );
    assert_eq!(
        stats.routed(Reason::LeastRequestFallback),
        8,
        "only the 8 primers found nothing"
    );
    let (hot_on_b, total_on_b, _) = run(Strategy::LeastRequest);
    // The first eight requests split 4 / 4 (a tie is broken at random only when both pods hold
    // as many, and the next request goes to the other); from then on each completion frees the
    // pod that takes the next request, so the traffic splits exactly in half. The hot family's
    // share follows the shuffle: about half, with a binomial spread of ±3.5 requests.
    assert_eq!(
        total_on_b, 48,
        "least-request splits the traffic: {total_on_b}/96 on B"
    );
    assert!(
        (24 - 7..=24 + 7).contains(&hot_on_b),
        "least-request splits the hot family: {hot_on_b}/48 on B"
    );
}

#[test]
fn models_without_pods_and_recorded_prefixes() {
    let mut r = Router::new(cfg()).unwrap();
    r.add_model(MODEL).unwrap();
    assert_eq!(
        r.route(RouteRequest::new(MODEL, &[]), t(0)).unwrap_err(),
        RouteError::NoReadyPod
    );
    let a = r
        .add_pod(
            MODEL,
            PodSpec {
                name: "a",
                address: "10.0.0.1:1",
                ready: true,
            },
        )
        .unwrap();
    let b = r
        .add_pod(
            MODEL,
            PodSpec {
                name: "b",
                address: "10.0.0.2:1",
                ready: true,
            },
        )
        .unwrap();
    let h = r.hash_config().hashes(&[b'p'; 640]);
    r.record_prefix(MODEL, b, &h, t(0)).unwrap();
    assert_eq!(r.open_tickets(), 0);
    assert_eq!(r.in_flight(b), Some(0));
    let d = r.route(RouteRequest::new(MODEL, &h), t(1)).unwrap();
    assert_eq!(
        (d.pod, d.reason, d.match_percent),
        (b, Reason::PrefixMatch, 100)
    );
    assert!(matches!(
        r.record_prefix("other", a, &h, t(2)),
        Err(RegistryError::UnknownModel(_))
    ));
}

#[test]
fn a_detached_ticket_holds_its_slot_until_its_predicted_end() {
    let (mut r, pods) = router_with_pods(1, RouterConfig::default());
    let d = r.route(RouteRequest::new(MODEL, &[]), t(1_000)).unwrap();
    let at = r.detach(d.ticket, t(1_500)).unwrap();
    // Predicted wait + prefill + a decode of the expected 128 tokens at the 50 ms prior.
    assert!(at >= t(1_000 + 127 * 50), "{at:?}");
    assert!(r.poll_timeout().unwrap() <= at);
    r.handle_timeout(t(at.as_millis() - 1));
    assert_eq!(r.in_flight(pods[0]), Some(1), "held");
    r.handle_timeout(at);
    assert_eq!(
        r.in_flight(pods[0]),
        Some(0),
        "released at its predicted end"
    );
    assert_eq!(r.stats().tickets.detached_released, 1);
    assert!(r.complete(d.ticket, Outcome::Success.into(), at).is_err());

    // A completion first releases it once; the timer then finds nothing.
    let e = r.route(RouteRequest::new(MODEL, &[]), at).unwrap();
    let end = r.detach(e.ticket, at).unwrap();
    r.complete(e.ticket, Outcome::Success.into(), at).unwrap();
    r.handle_timeout(end);
    assert_eq!(r.stats().tickets.detached_released, 1);
    assert_eq!(r.in_flight(pods[0]), Some(0));
    assert!(r.detach(e.ticket, end).is_err(), "closed");
    r.check_invariants().unwrap();
}

#[test]
fn data_parallel_ranks_are_pods_at_one_address_and_decisions_name_their_rank() {
    let mut r = Router::new(cfg()).unwrap();
    let mut ids = Vec::new();
    for rank in 0..3 {
        let name = format!("dp-server/dp{rank}");
        let id = r
            .add_pod(
                MODEL,
                PodSpec {
                    name: &name,
                    address: "10.0.0.1:8000",
                    ready: true,
                },
            )
            .unwrap();
        r.set_pod_data_parallel_rank(id, Some(rank)).unwrap();
        ids.push(id);
    }
    let plain = r
        .add_pod(
            MODEL,
            PodSpec {
                name: "plain",
                address: "10.0.0.2:8000",
                ready: true,
            },
        )
        .unwrap();
    assert_eq!(r.pod(ids[2]).unwrap().data_parallel_rank, Some(2));
    assert_eq!(r.pod(plain).unwrap().data_parallel_rank, None);
    let spec = StrategySpec::single(Strategy::SessionAffinity);
    let hashes = r.hash_config().hashes(study_prompt("s", 0, 1).as_bytes());
    // Every pod's session id brings the next request back to that pod, rank included.
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..40 {
        let first = r
            .route(RouteRequest::new(MODEL, &hashes).with_strategy(&spec), t(i))
            .unwrap();
        let want_rank = r.pod(first.pod).unwrap().data_parallel_rank;
        assert_eq!(first.data_parallel_rank, want_rank);
        seen.insert(first.pod);
        let session = first.session_id.clone().unwrap();
        for _ in 0..3 {
            let again = r
                .route(
                    RouteRequest::new(MODEL, &hashes)
                        .with_strategy(&spec)
                        .with_session_id(Some(&session)),
                    t(i),
                )
                .unwrap();
            assert_eq!(
                (again.pod, again.data_parallel_rank),
                (first.pod, want_rank)
            );
        }
    }
    assert_eq!(
        seen.len(),
        4,
        "random first picks reach every rank and the plain pod"
    );
}
