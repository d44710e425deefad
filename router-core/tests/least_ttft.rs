//! `least-ttft` through the router façade: pricing cache hits against queueing, learning from
//! completions, first tokens and engine snapshots, and the limits on what callers report.

mod common;

use common::{router_with_pods, salt, study_prompt, t, MODEL};
use kvroute_core::{
    Completion, Outcome, Reason, RouteRequest, Router, RouterConfig, Strategy, StrategySpec,
    TicketError,
};

/// A successful completion with these timings.
fn success(timings: kvroute_core::Timings) -> Completion {
    Completion {
        outcome: Outcome::Success,
        timings,
    }
}

fn ttft_config() -> RouterConfig {
    RouterConfig {
        seed: 21,
        default_strategy: Strategy::LeastTtft.into(),
        ttft: kvroute_core::TtftConfig {
            engine_block_tokens: 1_568,
            max_seqs: 8,
            bytes_per_token: 5.6,
            tpot_ms: 57.0,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// least-ttft keeps a family on its cached pod while there is room, and spills to the other
/// pod (paying one cold prefill) once waiting for a slot would cost more than prefilling.
/// Arrivals at the study's 1.6 requests/s.
#[test]
fn least_ttft_prices_cache_hits_against_queueing() {
    for draw in 1..=8 {
        let (mut r, pods) = router_with_pods(2, ttft_config());
        let mut rng = fastrand::Rng::with_seed(draw);
        let s = salt(&mut rng);
        let h = r.hash_config().hashes(study_prompt(&s, 0, 1).as_bytes());
        let first = r.route(RouteRequest::new(MODEL, &h), t(0)).unwrap();
        assert_eq!(first.reason, Reason::LeastTtft);
        let home = first.pod;
        let mut placed = vec![home];
        for i in 1..12u64 {
            let h = r
                .hash_config()
                .hashes(study_prompt(&s, 0, 1 + i as u32).as_bytes());
            let d = r.route(RouteRequest::new(MODEL, &h), t(i * 625)).unwrap();
            assert!(d.prediction.runner_up_ttft_ms.is_some());
            assert!(
                d.to_string().contains("runner_up_ttft_ms="),
                "draw {draw}: {d}"
            );
            placed.push(d.pod);
        }
        let on_home = placed.iter().filter(|p| **p == home).count();
        assert!(
            placed[..8].iter().all(|p| *p == home),
            "hits while the home pod has free slots: {placed:?} (draw {draw})"
        );
        assert!(
            on_home < 12,
            "spills once the home pod is full: {placed:?} (draw {draw})"
        );
        let other = pods.iter().find(|p| **p != home).unwrap();
        // Once spilled, the other pod holds the prefix too: with the home pod's slots still all
        // taken, the next request goes there and finds it.
        let d = r.route(RouteRequest::new(MODEL, &h), t(12 * 625)).unwrap();
        assert_eq!(d.pod, *other, "draw {draw}: {d}");
        assert!(d.matched_blocks > 0, "draw {draw}: {d}");
        r.check_invariants().unwrap();
    }
}

/// Completion timings teach the model: a pod reported slow gets its prefill rate lowered.
#[test]
fn least_ttft_learns_from_completion_timings() {
    let (mut r, pods) = router_with_pods(2, ttft_config());
    let prompt = vec![b'a'; 28_000];
    for i in 0..20u64 {
        let mut p = prompt.clone();
        p[0] = b'A' + (i % 26) as u8; // fresh prefix every time: no cache hits
        let h = r.hash_config().hashes(&p);
        let d = r
            .route(
                RouteRequest::new(MODEL, &h)
                    .with_strategy(&StrategySpec::single(Strategy::LeastRequest)),
                t(i * 10_000),
            )
            .unwrap();
        // pods[0] prefills at 1,000 tokens/s, pods[1] at the prior's 3,000.
        let rate = if d.pod == pods[0] { 1_000.0 } else { 3_000.0 };
        let ttft = 50 + (f64::from(d.prediction.prompt_tokens) / rate * 1000.0) as u64;
        let timings = kvroute_core::Timings {
            first_token_ms: Some(ttft),
            total_ms: Some(ttft + 127 * 57),
            output_tokens: Some(128),
            prompt_tokens: Some(d.prediction.prompt_tokens),
            cached_tokens: Some(0),
        };
        r.complete(d.ticket, success(timings), t(i * 10_000 + 9_000))
            .unwrap();
    }
    let h = r.hash_config().hashes(&[b'z'; 28_000]);
    let d = r.route(RouteRequest::new(MODEL, &h), t(300_000)).unwrap();
    assert_eq!(d.pod, pods[1], "the slow pod is avoided once learned: {d}");
    // Every sample was exact (whole milliseconds aside) and each pod had several: the learned
    // rates are the true ones, and the slow pod's prediction is the 3× longer prefill.
    let rates: Vec<f64> = r.pods().iter().map(|p| p.prefill_tokens_per_s).collect();
    for (learned, truth) in rates.iter().zip([1_000.0, 3_000.0]) {
        assert!((learned / truth - 1.0).abs() < 0.01, "rates {rates:?}");
    }
    let slow = f64::from(d.prediction.runner_up_ttft_ms.unwrap()) - 50.0;
    let fast = f64::from(d.prediction.ttft_ms) - 50.0;
    assert!((slow / fast - 3.0).abs() < 0.05, "learned the 3x gap: {d}");
    // Failed completions teach nothing, however wild their timings; the same timings on a
    // success would (the contrast shows the comparison can fail).
    let learned = |r: &Router| -> Vec<(f64, f64, f64)> {
        r.pods()
            .iter()
            .map(|p| (p.prefill_tokens_per_s, p.tpot_ms, p.overhead_ms))
            .collect()
    };
    let wild = Completion {
        outcome: Outcome::Failed,
        timings: kvroute_core::Timings {
            first_token_ms: Some(500),
            total_ms: Some(10_000),
            output_tokens: Some(100),
            prompt_tokens: Some(1),
            cached_tokens: Some(0),
        },
    };
    let rates = learned(&r);
    let failed = r.route(RouteRequest::new(MODEL, &h), t(300_001)).unwrap();
    r.complete(failed.ticket, wild, t(320_000)).unwrap();
    assert_eq!(learned(&r), rates, "a failure taught the model");
    let succeeded = r.route(RouteRequest::new(MODEL, &h), t(320_001)).unwrap();
    let success = Completion {
        outcome: Outcome::Success,
        ..wild
    };
    r.complete(succeeded.ticket, success, t(340_000)).unwrap();
    assert_ne!(learned(&r), rates, "the same timings on a success teach");
}

/// A first token reported while the request is still decoding teaches the prefill rate at once
/// (a decode before its completion would), the completion does not learn it a second time,
/// and reports for unknown or closed tickets are typed errors that change nothing.
#[test]
fn first_tokens_teach_before_the_completion_and_only_once() {
    let (mut r, pods) = router_with_pods(1, ttft_config());
    let fresh = |i: u8| {
        let mut p = vec![b'a'; 28_000];
        p[0] = i; // a fresh prefix every time: no index hits
        p
    };
    let route = |r: &mut Router, i: u8, at: u64| {
        let h = r.hash_config().hashes(&fresh(i));
        r.route(RouteRequest::new(MODEL, &h), t(at)).unwrap()
    };
    // The engine reused nothing and prefills at 1,000 tokens/s (the prior says 3,000).
    let first = |d: &kvroute_core::Decision| kvroute_core::Timings {
        first_token_ms: Some(50 + u64::from(d.prediction.prompt_tokens)),
        prompt_tokens: Some(d.prediction.prompt_tokens),
        cached_tokens: Some(0),
        ..Default::default()
    };
    let d0 = route(&mut r, 0, 0);
    let prior = d0.prediction.ttft_ms;
    r.first_token(d0.ticket, first(&d0), t(5_050)).unwrap();
    // A second report for the same ticket is ignored.
    r.first_token(d0.ticket, first(&d0), t(5_060)).unwrap();
    let d1 = route(&mut r, 1, 6_000);
    let taught = d1.prediction.ttft_ms;
    assert!(
        taught > prior + 1_000,
        "one first token slowed the predicted prefill: {prior} -> {taught} ms"
    );
    // The completion carries the same first token; it is not learned again.
    let done = Completion {
        outcome: Outcome::Success,
        timings: kvroute_core::Timings {
            total_ms: Some(12_000),
            output_tokens: Some(128),
            ..first(&d0)
        },
    };
    r.complete(d0.ticket, done, t(12_000)).unwrap();
    r.complete(d1.ticket, Completion::new(Outcome::Cancelled), t(12_001))
        .unwrap();
    let d2 = route(&mut r, 2, 13_000);
    assert_eq!(d2.pod, pods[0]);
    assert_eq!(
        d2.prediction.ttft_ms, taught,
        "the completion taught the prefill rate nothing new"
    );
    // Without a first-token time the report counts from routing to its `now`.
    let (mut r2, _) = router_with_pods(1, ttft_config());
    let e0 = route(&mut r2, 0, 0);
    let untimed = kvroute_core::Timings {
        first_token_ms: None,
        ..first(&e0)
    };
    r2.first_token(
        e0.ticket,
        untimed,
        t(50 + u64::from(e0.prediction.prompt_tokens)),
    )
    .unwrap();
    assert_eq!(route(&mut r2, 1, 6_000).prediction.ttft_ms, taught);
    // Unknown and closed tickets are errors.
    let unknown = kvroute_core::Ticket::from_u64(999);
    assert_eq!(
        r.first_token(unknown, first(&d2), t(13_001)),
        Err(TicketError::NeverIssued(unknown))
    );
    assert_eq!(
        r.first_token(d0.ticket, first(&d0), t(13_002)),
        Err(TicketError::NotOpen(d0.ticket))
    );
    r.check_invariants().unwrap();
}

#[test]
fn engine_snapshots_show_load_from_other_routers_until_stale() {
    let (mut r, pods) = router_with_pods(2, ttft_config());
    // pods[0] reports a full engine (another router's traffic); pods[1] is idle.
    let busy = kvroute_core::EngineSnapshot {
        running: 8,
        waiting: 4,
        ..Default::default()
    };
    r.observe_engine(pods[0], busy, t(1_000)).unwrap();
    for i in 0..4 {
        let d = r
            .route(RouteRequest::new(MODEL, &[]), t(1_000 + i))
            .unwrap();
        assert_eq!(d.pod, pods[1], "{d}");
        r.complete(d.ticket, Outcome::Success.into(), t(1_000 + i))
            .unwrap();
    }
    // After snapshot_max_age_ms (2 s) it is ignored and both pods are candidates again.
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..20 {
        let d = r
            .route(RouteRequest::new(MODEL, &[]), t(3_100 + i))
            .unwrap();
        seen.insert(d.pod);
        r.complete(d.ticket, Outcome::Success.into(), t(3_100 + i))
            .unwrap();
    }
    assert_eq!(seen.len(), 2);
    assert!(r
        .observe_engine(kvroute_core::PodId::from_u32(77), busy, t(0))
        .is_err());
}

#[test]
fn a_snapshot_ages_from_its_scrape_time() {
    let (mut r, pods) = router_with_pods(2, ttft_config());
    let busy = kvroute_core::EngineSnapshot {
        running: 8,
        waiting: 4,
        ..Default::default()
    };
    // Scraped at 1,000 and passed in after a call at 2,500: 1.5 s old already.
    let d = r.route(RouteRequest::new(MODEL, &[]), t(2_500)).unwrap();
    r.complete(d.ticket, Outcome::Success.into(), t(2_500))
        .unwrap();
    r.observe_engine(pods[0], busy, t(1_000)).unwrap();
    let fresh = r.route(RouteRequest::new(MODEL, &[]), t(2_900)).unwrap();
    assert_eq!(fresh.pod, pods[1], "{fresh}");
    r.complete(fresh.ticket, Outcome::Success.into(), t(2_900))
        .unwrap();
    // Stale 2 s after the scrape, not 2 s after it was passed in.
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..20 {
        let d = r
            .route(RouteRequest::new(MODEL, &[]), t(3_001 + i))
            .unwrap();
        seen.insert(d.pod);
        r.complete(d.ticket, Outcome::Success.into(), t(3_001 + i))
            .unwrap();
    }
    assert_eq!(seen.len(), 2);
    // A snapshot's time moves the router's clock: a route passed an earlier time after it
    // happens at the snapshot's time (its ticket expires a ticket TTL after that).
    let (mut r, pods) = router_with_pods(1, ttft_config());
    r.observe_engine(pods[0], busy, t(50_000)).unwrap();
    let d = r.route(RouteRequest::new(MODEL, &[]), t(1_000)).unwrap();
    let ttl = r.config().ticket_ttl_ms;
    assert_eq!(r.poll_timeout(), Some(t(50_000 + ttl)), "{d}");
}

#[test]
fn reported_times_longer_than_the_time_since_routing_are_cut_to_it() {
    let (mut r, pods) = router_with_pods(1, ttft_config());
    let prompt = [b'x'; 28_000];
    let h = r.hash_config().hashes(&prompt);
    let first = r.route(RouteRequest::new(MODEL, &h), t(0)).unwrap();
    // A first token reported as an epoch timestamp in ms, 100 ms after routing.
    let epoch = kvroute_core::Timings {
        first_token_ms: Some(1_764_000_000_000),
        ..Default::default()
    };
    r.first_token(first.ticket, epoch, t(100)).unwrap();
    // Its prefill is over by now, not 56 years from now: a request routed next waits for no
    // prefill backlog (one slot of 8 is taken).
    let next = r.route(RouteRequest::new(MODEL, &[]), t(200)).unwrap();
    assert_eq!(next.pod, pods[0]);
    assert_eq!(next.prediction.queue_ms, 0, "{next}");
    r.check_invariants().unwrap();

    // The same at a completion: a request on an idle pod whose first token and end are
    // reported as timestamps teaches a prefill rate from the 1,000 ms that passed. (Taken
    // as they are, its prefill would have lasted 56 years: the rate would drop to the third
    // of the prior that one sample may cut it to.)
    let (mut r, pods) = router_with_pods(1, ttft_config());
    let before = r.pod(pods[0]).unwrap().prefill_tokens_per_s;
    let d = r.route(RouteRequest::new(MODEL, &h), t(0)).unwrap();
    let done = kvroute_core::Timings {
        first_token_ms: Some(1_764_000_000_000),
        total_ms: Some(1_764_000_000_000),
        output_tokens: Some(128),
        ..Default::default()
    };
    let completion = success(done);
    r.complete(d.ticket, completion, t(1_000)).unwrap();
    let after = r.pod(pods[0]).unwrap().prefill_tokens_per_s;
    assert!(after > before / 2.0, "{before} -> {after}");
}

/// A stream shows usage only at its end (without vLLM's continuous usage stats): a first token
/// reported without prompt tokens teaches the prefill side, and the completion's usage still
/// teaches the bytes per token.
#[test]
fn usage_missing_at_the_first_token_is_learned_at_the_completion() {
    let (mut r, _) = router_with_pods(1, ttft_config());
    let h = r.hash_config().hashes(&[b'q'; 28_000]);
    let d = r.route(RouteRequest::new(MODEL, &h), t(0)).unwrap();
    let first = kvroute_core::Timings {
        first_token_ms: Some(900),
        ..Default::default()
    };
    assert!(d.prediction.cached_tokens > 0, "the pod's probe: {d}");
    r.first_token(d.ticket, first, t(900)).unwrap();
    assert_eq!(r.stats().prompt_bytes_per_token, 5.6, "the prior");
    // Without cached tokens the probe has not answered: the next request is not a second one.
    let h2 = r.hash_config().hashes(&[b'r'; 28_000]);
    let next = r.route(RouteRequest::new(MODEL, &h2), t(901)).unwrap();
    assert_eq!(next.prediction.cached_tokens, 0, "{next}");
    let usage = kvroute_core::Timings {
        first_token_ms: Some(900),
        total_ms: Some(8_000),
        output_tokens: Some(128),
        prompt_tokens: Some(3_496), // 27,968 bytes counted: 8 bytes per token
        cached_tokens: Some(0),
    };
    let done = success(usage);
    r.complete(d.ticket, done, t(8_000)).unwrap();
    let learned = r.stats().prompt_bytes_per_token;
    assert!(
        (learned - 6.08).abs() < 0.01,
        "one EWMA step to 8: {learned}"
    );
}

/// Each part of the prompt side is learned once per request: after a first token that carried
/// its time and usage, the completion's (here different) ones teach nothing more.
#[test]
fn a_first_token_with_usage_is_not_learned_again_at_the_completion() {
    let (mut r, pods) = router_with_pods(1, ttft_config());
    let h = r.hash_config().hashes(&[b'q'; 28_000]);
    let d = r.route(RouteRequest::new(MODEL, &h), t(0)).unwrap();
    let first = kvroute_core::Timings {
        first_token_ms: Some(900),
        prompt_tokens: Some(3_496), // 8 bytes per token
        cached_tokens: Some(0),
        ..Default::default()
    };
    r.first_token(d.ticket, first, t(900)).unwrap();
    let learned = |r: &Router| {
        let rate = r.pod(pods[0]).unwrap().prefill_tokens_per_s;
        (r.stats().prompt_bytes_per_token, rate)
    };
    let after_first = learned(&r);
    assert_ne!(after_first, (5.6, 3_000.0), "the first token taught both");
    let other = kvroute_core::Timings {
        first_token_ms: Some(300),
        total_ms: Some(8_000),
        output_tokens: Some(128),
        prompt_tokens: Some(6_992), // 4 bytes per token
        cached_tokens: Some(0),
    };
    let done = success(other);
    r.complete(d.ticket, done, t(8_000)).unwrap();
    assert_eq!(learned(&r), after_first);
}

/// A request's output-token limit bounds the decode predicted for it, so the slot it holds is
/// predicted free sooner; a generous limit changes nothing.
#[test]
fn an_output_token_limit_frees_the_predicted_slot_sooner() {
    let one_slot = RouterConfig {
        ttft: kvroute_core::TtftConfig {
            max_seqs: 1,
            ..ttft_config().ttft
        },
        ..ttft_config()
    };
    let queue_behind = |limit: Option<u32>| {
        let (mut r, _) = router_with_pods(1, one_slot.clone());
        let h = r.hash_config().hashes(&[b'q'; 28_000]);
        let first = RouteRequest::new(MODEL, &h).with_max_output_tokens(limit);
        r.route(first, t(0)).unwrap();
        let h = r.hash_config().hashes(&[b'r'; 28_000]);
        r.route(RouteRequest::new(MODEL, &h), t(0))
            .unwrap()
            .prediction
            .queue_ms
    };
    let unlimited = queue_behind(None);
    // The expected output (128 tokens at 57 ms) against 2 tokens (1 after the first).
    assert_eq!(unlimited - queue_behind(Some(2)), 126 * 57);
    assert_eq!(queue_behind(Some(4_096)), unlimited);
}

/// Where completions carry no prompt tokens (behind Envoy, untimed), the first engine window
/// replaces the bytes-per-token prior: it is one exact ratio over whole prompts.
#[test]
fn an_engine_window_replaces_the_bytes_per_token_prior() {
    let (mut r, pods) = router_with_pods(1, ttft_config());
    let snap = |queries| kvroute_core::EngineSnapshot {
        prefix_queries: Some(queries),
        prefix_hits: Some(0),
        ..Default::default()
    };
    r.observe_engine(pods[0], snap(0), t(0)).unwrap();
    for i in 0..2u8 {
        let mut p = vec![b'a'; 28_000];
        p[0] = i;
        let h = r.hash_config().hashes(&p);
        let d = r.route(RouteRequest::new(MODEL, &h), t(1)).unwrap();
        let total_only = kvroute_core::Timings {
            total_ms: Some(5_000),
            ..Default::default()
        };
        let done = success(total_only);
        r.complete(d.ticket, done, t(5_001)).unwrap();
    }
    assert_eq!(r.stats().prompt_bytes_per_token, 5.6, "the prior");
    // The engine scheduled 7,000 tokens for the two 28,000-byte prompts: 8 bytes per token
    // (the router counts prompt bytes in whole hash blocks: 27,968 each).
    r.observe_engine(pods[0], snap(7_000), t(5_002)).unwrap();
    let learned = r.stats().prompt_bytes_per_token;
    assert!((learned - 8.0).abs() < 0.02, "{learned}");
}

#[test]
fn reconfigure_takes_new_priors_where_nothing_was_learned() {
    let (mut r, pods) = router_with_pods(2, ttft_config());
    // pods[0] learns a TPOT of 20 ms from one completion; nothing else is learned.
    let d = r.route(RouteRequest::new(MODEL, &[]), t(0)).unwrap();
    let learned = kvroute_core::Timings {
        first_token_ms: Some(100),
        total_ms: Some(100 + 127 * 20),
        ..Default::default()
    };
    let done = kvroute_core::Completion {
        outcome: Outcome::Success,
        timings: kvroute_core::Timings {
            output_tokens: Some(128),
            ..learned
        },
    };
    r.complete(d.ticket, done, t(3_000)).unwrap();
    let tpot = |r: &Router, p| r.pod(p).unwrap().tpot_ms;
    let (taught, other) = if d.pod == pods[0] {
        (pods[0], pods[1])
    } else {
        (pods[1], pods[0])
    };
    let learned_tpot = tpot(&r, taught);
    let mut next = ttft_config();
    next.ttft.tpot_ms = 80.0;
    next.ttft.prefill_tokens_per_s = 9_000.0;
    next.ttft.bytes_per_token = 3.0;
    r.reconfigure(next).unwrap();
    assert_eq!(tpot(&r, taught), learned_tpot, "learned: kept");
    assert_eq!(tpot(&r, other), 80.0, "never learned: the new prior");
    assert_eq!(r.pod(other).unwrap().prefill_tokens_per_s, 9_000.0);
    assert_eq!(r.stats().prompt_bytes_per_token, 3.0);
}

/// Exploration: once the cheapest pod would make a request wait `explore_wait_ms` or more, a
/// pod that has never shown what it holds beyond the index, and is idle, gets the request as
/// its probe, however dear the model prices it (here a prefill prior 30× too slow makes the
/// idle pod look 25 s away). One probe at a time; with `explore_wait_ms` 0 the request waits.
#[test]
fn a_long_wait_sends_a_request_to_probe_an_idle_unknown_pod() {
    let config = |explore_wait_ms| RouterConfig {
        ttft: kvroute_core::TtftConfig {
            max_seqs: 2,
            prefill_tokens_per_s: 100.0,
            // Samples cannot move the rates: the priors stay whatever the answers show.
            max_sample_ratio: 1.0,
            explore_wait_ms,
            ..ttft_config().ttft
        },
        ..ttft_config()
    };
    let placements = |explore_wait_ms| {
        let (mut r, _) = router_with_pods(2, config(explore_wait_ms));
        let mut rng = fastrand::Rng::with_seed(3);
        let s = salt(&mut rng);
        let hashing = r.hash_config();
        let prompt = |i: u32| hashing.hashes(study_prompt(&s, 0, i).as_bytes());
        // The first request probes its pod; its answer, nothing cached, makes the pod known
        // as cold beyond the index. (An answer all cached would have shown engines warmed
        // outside the router, and the other pod, untried, would be priced warm too.)
        let first = r.route(RouteRequest::new(MODEL, &prompt(0)), t(0)).unwrap();
        let known = first.pod;
        let answer = kvroute_core::Timings {
            first_token_ms: Some(1_600),
            prompt_tokens: Some(5_000),
            cached_tokens: Some(0),
            ..Default::default()
        };
        r.first_token(first.ticket, answer, t(1_600)).unwrap();
        // Its family fills the known pod's two slots; the next would wait a whole decode.
        let mut placed = Vec::new();
        for i in 1..5u32 {
            let d = r
                .route(
                    RouteRequest::new(MODEL, &prompt(i)),
                    t(1_600 + u64::from(i)),
                )
                .unwrap();
            let explored = d.reason == Reason::LeastTtftProbe;
            assert_eq!(explored, d.to_string().contains("least_ttft_probe"), "{d}");
            assert!(explored || d.reason == Reason::LeastTtft, "{d}");
            placed.push((d.pod == known, d.prediction.queue_ms, explored));
        }
        placed
    };
    let explored = placements(500.0);
    assert!(explored[0].0, "a free slot on the known pod: {explored:?}");
    assert!(
        !explored[1].0,
        "the wait would be long: probe the other: {explored:?}"
    );
    assert!(
        explored[2].0 && explored[2].1 >= 500,
        "one probe at a time: {explored:?}"
    );
    let waited = placements(0.0);
    assert!(
        waited[..3].iter().all(|(home, _, probe)| *home && !probe) && waited[1].1 >= 500,
        "{waited:?}"
    );
}

/// A pod's answer that its engine reused a prompt the router had never sent it (engines warmed
/// outside the router: a restarted router, other routers) prices the pods not yet tried as that
/// warm too, instead of the probe's half-warm guess; an answer that the engine held nothing
/// leaves them at the guess.
#[test]
fn an_answer_from_an_engine_warmed_outside_the_router_prices_untried_pods_warm() {
    let untried_cached_share = |cached_tokens: u32| {
        let (mut r, _) = router_with_pods(2, ttft_config());
        let mut rng = fastrand::Rng::with_seed(3);
        let s = salt(&mut rng);
        let hashing = r.hash_config();
        let prompt = |family: usize| hashing.hashes(study_prompt(&s, family, 0).as_bytes());
        let first = r.route(RouteRequest::new(MODEL, &prompt(0)), t(0)).unwrap();
        assert_eq!(first.reason, Reason::LeastTtft, "{first}");
        let answer = kvroute_core::Timings {
            first_token_ms: Some(200),
            prompt_tokens: Some(5_000),
            cached_tokens: Some(cached_tokens),
            ..Default::default()
        };
        r.first_token(first.ticket, answer, t(200)).unwrap();
        // Another family, indexed nowhere: the idle pod, untried, takes it.
        let d = r
            .route(RouteRequest::new(MODEL, &prompt(1)), t(300))
            .unwrap();
        assert_ne!(d.pod, first.pod, "{d}");
        let p = d.prediction;
        f64::from(p.cached_tokens) / f64::from(p.prompt_tokens)
    };
    let warm = untried_cached_share(4_704);
    assert!(warm > 0.9, "priced as the answering pod's engine: {warm}");
    let cold = untried_cached_share(0);
    assert!((0.4..=0.5).contains(&cold), "the probe's guess: {cold}");
}

/// A prompt the index places on no pod is priced on every pod at the fleet's mean `unrouted`
/// (how the engines were warmed outside the router), not at each pod's own answers: after one
/// pod answered warm and the other cold, a new prefix is priced half cached on both and goes
/// to the less loaded pod. (Priced at each pod's own, it went to the warm-answering pod,
/// loaded or not, and the index then kept every new prefix there.)
#[test]
fn a_prefix_sent_to_no_pod_is_priced_at_the_fleets_unrouted_share() {
    let (mut r, _) = router_with_pods(2, ttft_config());
    let mut rng = fastrand::Rng::with_seed(3);
    let s = salt(&mut rng);
    let hashing = r.hash_config();
    let prompt = |family: usize| hashing.hashes(study_prompt(&s, family, 0).as_bytes());
    let answer = |cached_tokens: u32| kvroute_core::Timings {
        first_token_ms: Some(200),
        prompt_tokens: Some(5_000),
        cached_tokens: Some(cached_tokens),
        ..Default::default()
    };
    let warm = r.route(RouteRequest::new(MODEL, &prompt(0)), t(0)).unwrap();
    r.first_token(warm.ticket, answer(4_704), t(200)).unwrap();
    let cold = r
        .route(RouteRequest::new(MODEL, &prompt(1)), t(300))
        .unwrap();
    assert_ne!(cold.pod, warm.pod, "{cold}");
    r.first_token(cold.ticket, answer(0), t(500)).unwrap();
    r.complete(cold.ticket, Completion::new(Outcome::Success), t(600))
        .unwrap();
    // The warm-answering pod still runs its request; a third family, indexed nowhere.
    let d = r
        .route(RouteRequest::new(MODEL, &prompt(2)), t(700))
        .unwrap();
    let p = d.prediction;
    let share = f64::from(p.cached_tokens) / f64::from(p.prompt_tokens);
    assert!(
        (0.4..=0.5).contains(&share),
        "the fleet's mean: {share} ({d})"
    );
    assert_eq!(d.pod, cold.pod, "priced alike, the idle pod: {d}");
    // A prompt the index places on a pod keeps that pod's own answers.
    let again = r
        .route(RouteRequest::new(MODEL, &prompt(0)), t(800))
        .unwrap();
    assert_eq!(again.pod, warm.pod, "{again}");
}

/// With token-block keys (a shell that tokenizes as the engine does) the model counts tokens
/// exactly: the prompt's size is its token count, a match is its blocks × the block size (in
/// whole engine blocks), and nothing is converted at a bytes-per-token estimate, nor learned.
#[test]
fn token_blocks_are_counted_exactly() {
    let mut cfg = ttft_config();
    cfg.ttft.engine_block_tokens = 16;
    let (mut r, _) = router_with_pods(2, cfg);
    let keys = r.token_key_config(16).unwrap();
    let tokens: Vec<u32> = (0..1_000).collect();
    let k = keys.keys(&tokens, kvroute_core::BlockExtras::default());
    assert_eq!(k.len(), 62); // 992 tokens in full blocks
    let size = kvroute_core::PromptTokens {
        prompt_tokens: 1_000,
        block_tokens: 16,
    };
    let first = r
        .route(RouteRequest::new(MODEL, &k).with_tokens(size), t(0))
        .unwrap();
    assert_eq!(first.prediction.prompt_tokens, 1_000);
    r.complete(first.ticket, Completion::new(Outcome::Success), t(10))
        .unwrap();
    // The same prompt with a longer tail: every full block of the first one matches on its pod.
    let longer: Vec<u32> = (0..1_500).collect();
    let k2 = keys.keys(&longer, kvroute_core::BlockExtras::default());
    let size2 = kvroute_core::PromptTokens {
        prompt_tokens: 1_500,
        block_tokens: 16,
    };
    let again = r
        .route(RouteRequest::new(MODEL, &k2).with_tokens(size2), t(20))
        .unwrap();
    assert_eq!(again.pod, first.pod);
    assert_eq!(again.matched_blocks, 62);
    assert_eq!(again.prediction.prompt_tokens, 1_500);
    // More predicted cached than for the cold first request (whose prediction is the prior
    // share of unindexed tokens), never more than the prompt's whole engine blocks.
    assert!(again.prediction.cached_tokens > first.prediction.cached_tokens);
    assert!(again.prediction.cached_tokens <= 1_488);
    // No bytes per token learned from token-keyed requests.
    let before = r.stats().prompt_bytes_per_token;
    r.complete(
        again.ticket,
        Completion {
            outcome: Outcome::Success,
            timings: kvroute_core::Timings {
                first_token_ms: Some(200),
                total_ms: Some(300),
                output_tokens: Some(2),
                prompt_tokens: Some(1_500),
                cached_tokens: Some(992),
            },
        },
        t(230),
    )
    .unwrap();
    assert_eq!(r.stats().prompt_bytes_per_token, before);
    r.check_invariants().unwrap();
}

/// Every request whose first-token time is reported counts once in its pod's calibration
/// (predicted at routing against observed), split by whether a wait was predicted; requests
/// without one count nowhere; a pod removed and added again keeps its counts.
#[test]
fn predictions_are_held_against_first_tokens_per_pod() {
    let config = RouterConfig {
        ttft: kvroute_core::TtftConfig {
            max_seqs: 1,
            ..ttft_config().ttft
        },
        ..ttft_config()
    };
    let (mut r, pods) = router_with_pods(1, config);
    let h = r.hash_config().hashes(&[b'q'; 28_000]);
    let route = |r: &mut Router, at: u64| r.route(RouteRequest::new(MODEL, &h), t(at)).unwrap();
    let calibration = |r: &Router| r.pods()[0].ttft_calibration;
    let first = |ms: u64| kvroute_core::Timings {
        first_token_ms: Some(ms),
        ..Default::default()
    };
    let d0 = route(&mut r, 0);
    assert_eq!(d0.prediction.queue_ms, 0);
    // One slot: the second waits for the first.
    let d1 = route(&mut r, 10);
    assert!(d1.prediction.queue_ms > 0);
    r.first_token(d0.ticket, first(900), t(900)).unwrap();
    r.first_token(d0.ticket, first(950), t(950)).unwrap();
    let done = Completion {
        outcome: Outcome::Success,
        timings: first(900),
    };
    r.complete(d0.ticket, done, t(5_000)).unwrap();
    let c = calibration(&r);
    assert_eq!((c.at_once.samples, c.waited.samples), (1, 0));
    assert_eq!(c.at_once.observed_ms, 900.0);
    assert!((c.at_once.predicted_ms - f64::from(d0.prediction.ttft_ms)).abs() <= 0.5);
    let error = 900.0 - c.at_once.predicted_ms;
    assert_eq!(c.at_once.mean_error_ms(), Some(error));
    assert_eq!(c.at_once.mean_abs_error_ms(), Some(error.abs()));
    // The waiting one, reported at its completion only.
    let done = Completion {
        outcome: Outcome::Success,
        timings: first(7_000),
    };
    r.complete(d1.ticket, done, t(12_000)).unwrap();
    assert_eq!(calibration(&r).waited.samples, 1);
    assert_eq!(calibration(&r).waited.observed_ms, 7_000.0);
    // No first-token time, nothing counted.
    let d2 = route(&mut r, 13_000);
    r.complete(d2.ticket, Completion::new(Outcome::Success), t(14_000))
        .unwrap();
    let kept = calibration(&r);
    assert_eq!(kept.total().samples, 2);
    r.remove_pod(pods[0]).unwrap();
    let again = kvroute_core::PodSpec {
        name: "pod-0",
        address: "10.0.0.1:8000",
        ready: true,
    };
    r.add_pod(MODEL, again).unwrap();
    assert_eq!(calibration(&r), kept);
}

/// least-ttft answers with its pod's session id, and a conversation's next turn that sends it
/// back credits that pod with the previous answer (the index saw only the previous prompt):
/// the answer's whole engine blocks count as cached there, and nowhere else.
#[test]
fn a_session_id_credits_its_pod_with_the_previous_answer() {
    let mut cfg = ttft_config();
    cfg.ttft.engine_block_tokens = 16;
    cfg.ttft.output_tokens = 300.0;
    let turn = |r: &mut Router, upto: u32, session: Option<&str>, at| {
        let keys = r.token_key_config(16).unwrap();
        let tokens: Vec<u32> = (0..upto).collect();
        let k = keys.keys(&tokens, kvroute_core::BlockExtras::default());
        let size = kvroute_core::PromptTokens {
            prompt_tokens: upto,
            block_tokens: 16,
        };
        let req = RouteRequest::new(MODEL, &k)
            .with_tokens(size)
            .with_session_id(session);
        r.route(req, t(at)).unwrap()
    };
    let finish = |r: &mut Router, d: &kvroute_core::Decision, at| {
        let timings = kvroute_core::Timings {
            first_token_ms: Some(200),
            total_ms: Some(2_000),
            output_tokens: Some(300),
            prompt_tokens: Some(d.prediction.prompt_tokens),
            cached_tokens: Some(0),
        };
        r.complete(d.ticket, success(timings), t(at)).unwrap();
    };
    let mut cached = Vec::new();
    for with_session in [false, true] {
        let (mut r, _) = router_with_pods(2, cfg.clone());
        // Turn 1: 1,000 prompt tokens, a 300-token answer.
        let first = turn(&mut r, 1_000, None, 0);
        let id = first.session_id.clone().expect("least-ttft names its pod");
        finish(&mut r, &first, 2_000);
        // Turn 2: the first prompt, the answer (tokens 1,000-1,299) and a new question.
        let session = with_session.then_some(id.as_str());
        let second = turn(&mut r, 1_500, session, 10_000);
        assert_eq!(second.pod, first.pod, "session {with_session}: {second}");
        assert_eq!(second.matched_blocks, 62, "the index saw 992 tokens");
        cached.push(second.prediction.cached_tokens);
        r.check_invariants().unwrap();
    }
    // Without the id, the 992 indexed tokens; with it, the answer's whole blocks too
    // (⌊1,292 / 16⌋ × 16).
    assert_eq!(cached, [992, 1_280]);
}
