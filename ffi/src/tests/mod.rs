//! Tests of the exported functions called from Rust: the panic boundary and poisoning (which
//! need a test-only hook), and the status paths C cannot easily reach.

use std::ptr;

use crate::router::test_hooks;
use crate::*;

fn status(s: kvroute_status) -> &'static str {
    s.as_str()
}

fn new_router(strategy: &str) -> *mut kvroute_router {
    let b = kvroute_config_builder_new();
    assert!(!b.is_null());
    assert_eq!(kvroute_config_builder_set_seed(b, 7), kvroute_status::Ok);
    assert_eq!(
        kvroute_config_builder_set_strategy(b, strategy.as_ptr(), strategy.len()),
        kvroute_status::Ok
    );
    let mut config = ptr::null();
    assert_eq!(
        kvroute_config_builder_build(b, &mut config),
        kvroute_status::Ok
    );
    let mut router = ptr::null_mut();
    assert_eq!(kvroute_router_new(config, &mut router), kvroute_status::Ok);
    kvroute_config_free(config);
    router
}

fn add(r: *mut kvroute_router, name: &str, addr: &str) -> kvroute_pod_id {
    let mut pod = u32::MAX;
    let st = kvroute_router_add_pod(
        r,
        b"m".as_ptr(),
        1,
        name.as_ptr(),
        name.len(),
        addr.as_ptr(),
        addr.len(),
        true,
        &mut pod,
    );
    assert_eq!(status(st), "KVROUTE_STATUS_OK");
    pod
}

fn route(
    r: *mut kvroute_router,
    prompt: &[u8],
    now: u64,
) -> Result<kvroute_decision, kvroute_status> {
    let mut d = kvroute_decision::default();
    match kvroute_router_route(
        r,
        b"m".as_ptr(),
        1,
        prompt.as_ptr(),
        prompt.len(),
        ptr::null(),
        0,
        now,
        &mut d,
    ) {
        kvroute_status::Ok => Ok(d),
        e => Err(e),
    }
}

#[test]
fn a_panic_while_locked_poisons_the_router_and_later_calls_say_so() {
    let r = new_router("least-request");
    add(r, "a", "10.0.0.1:80");
    let d = route(r, b"hello", 1).unwrap();
    assert_eq!(test_hooks::panic_unlocked(r), kvroute_status::Panic);
    // A panic outside the lock leaves the router usable.
    assert_eq!(
        kvroute_router_complete(r, d.ticket, 0, 2),
        kvroute_status::Ok
    );
    assert_eq!(test_hooks::panic_while_locked(r), kvroute_status::Panic);
    assert_eq!(route(r, b"hello", 3), Err(kvroute_status::Poisoned));
    assert_eq!(kvroute_router_tick(r, 4), kvroute_status::Poisoned);
    let mut stats = kvroute_stats::default();
    assert_eq!(
        kvroute_router_stats(r, &mut stats),
        kvroute_status::Poisoned
    );
    assert_eq!(stats, kvroute_stats::default(), "no output on error");
    let mut pod = 99;
    assert_eq!(
        kvroute_router_pod_id(r, b"a".as_ptr(), 1, &mut pod),
        kvroute_status::Poisoned
    );
    assert_eq!(pod, 99);
    kvroute_router_free(r);
}

#[test]
fn explanation_is_the_core_rendering_and_lives_while_the_ticket_is_open() {
    let r = new_router("prefix-cache");
    add(r, "vllm-a", "10.0.0.1:8000");
    add(r, "vllm-b", "10.0.0.2:8000");
    let prompt = "shared system prompt. ".repeat(40);
    let first = route(r, prompt.as_bytes(), 10).unwrap();
    let d = route(r, prompt.as_bytes(), 11).unwrap();
    assert_eq!(d.pod, first.pod);
    assert_eq!(
        (d.match_percent, d.reason),
        (100, kvroute_reason::PrefixMatch as u32)
    );

    // The same calls on the core directly give the same line.
    let mut core = kvroute_core::Router::new(kvroute_core::RouterConfig {
        seed: 7,
        ..Default::default()
    })
    .unwrap();
    for (n, a) in [("vllm-a", "10.0.0.1:8000"), ("vllm-b", "10.0.0.2:8000")] {
        core.add_pod(
            "m",
            kvroute_core::PodSpec {
                name: n,
                address: a,
                ready: true,
            },
        )
        .unwrap();
    }
    let hashes = core.hash_config().hashes(prompt.as_bytes());
    core.route(
        kvroute_core::RouteRequest::new("m", &hashes),
        kvroute_core::Timestamp::from_millis(10),
    )
    .unwrap();
    let expected = core
        .route(
            kvroute_core::RouteRequest::new("m", &hashes),
            kvroute_core::Timestamp::from_millis(11),
        )
        .unwrap()
        .to_string();

    let mut n = 0usize;
    assert_eq!(
        kvroute_router_explain(r, d.ticket, ptr::null_mut(), 0, &mut n),
        kvroute_status::InsufficientSize
    );
    assert_eq!(n, expected.len() + 1);
    let mut buf = vec![0xAAu8; n];
    assert_eq!(
        kvroute_router_explain(r, d.ticket, buf.as_mut_ptr(), n - 1, &mut n),
        kvroute_status::InsufficientSize
    );
    assert!(
        buf.iter().all(|b| *b == 0xAA),
        "buffer untouched on INSUFFICIENT_SIZE"
    );
    assert_eq!(
        kvroute_router_explain(r, d.ticket, buf.as_mut_ptr(), buf.len(), &mut n),
        kvroute_status::Ok
    );
    assert_eq!(
        (n, &buf[..n], buf[n]),
        (expected.len(), expected.as_bytes(), 0)
    );

    assert_eq!(
        kvroute_router_complete(r, d.ticket, 1, 12),
        kvroute_status::Ok
    );
    assert_eq!(
        kvroute_router_explain(r, d.ticket, buf.as_mut_ptr(), buf.len(), &mut n),
        kvroute_status::UnknownTicket
    );
    kvroute_router_free(r);
}

#[test]
fn explanations_of_expired_tickets_are_dropped_by_tick() {
    let b = kvroute_config_builder_new();
    assert_eq!(
        kvroute_config_builder_set_ticket_ttl_ms(b, 100),
        kvroute_status::Ok
    );
    let mut config = ptr::null();
    assert_eq!(
        kvroute_config_builder_build(b, &mut config),
        kvroute_status::Ok
    );
    let mut r = ptr::null_mut();
    assert_eq!(kvroute_router_new(config, &mut r), kvroute_status::Ok);
    kvroute_config_free(config);
    add(r, "a", "10.0.0.1:80");
    let d = route(r, b"x", 1000).unwrap();
    let (mut has, mut at) = (false, 0u64);
    assert_eq!(
        kvroute_router_next_deadline(r, &mut has, &mut at),
        kvroute_status::Ok
    );
    assert!(has && at <= 1100, "deadline {at}");
    assert_eq!(kvroute_router_tick(r, 1100), kvroute_status::Ok);
    let mut n = 0;
    assert_eq!(
        kvroute_router_explain(r, d.ticket, ptr::null_mut(), 0, &mut n),
        kvroute_status::UnknownTicket
    );
    assert_eq!(
        kvroute_router_complete(r, d.ticket, 0, 1101),
        kvroute_status::TicketNotOpen
    );
    kvroute_router_free(r);
}

#[test]
fn build_and_setters_reject_nulls_and_bad_values() {
    assert_eq!(
        kvroute_config_builder_build(ptr::null_mut(), ptr::null_mut()),
        kvroute_status::NullParameter
    );
    // The builder is consumed even though the out-pointer is NULL: a leak here is what
    // tests/c/test_api.c checks for under ASan's leak checker (`make test-c`).
    assert_eq!(
        kvroute_config_builder_build(kvroute_config_builder_new(), ptr::null_mut()),
        kvroute_status::NullParameter
    );
    let b = kvroute_config_builder_new();
    assert_eq!(
        kvroute_config_builder_set_block_size(b, 0),
        kvroute_status::InvalidParameter
    );
    assert_eq!(
        kvroute_config_builder_set_stddev_factor(b, f64::NAN),
        kvroute_status::InvalidParameter
    );
    assert_eq!(
        kvroute_config_builder_set_strategy(b, b"round-robin".as_ptr(), 11),
        kvroute_status::InvalidStrategy
    );
    assert_eq!(
        kvroute_config_builder_set_strategy(b, ptr::null(), 3),
        kvroute_status::NullParameter
    );
    kvroute_config_builder_free(b);
    kvroute_config_builder_free(ptr::null_mut());
    kvroute_config_free(ptr::null());
    kvroute_router_free(ptr::null_mut());
}

#[test]
fn observe_engine_timed_validates_the_timing_struct() {
    let r = new_router("least-ttft");
    let a = add(r, "a", "10.0.0.1:80");
    let snap = kvroute_engine_snapshot::default();
    let good = kvroute_engine_timing {
        prefill_seconds: 1.5,
        prefills: 3,
        inter_token_seconds: 0.0,
        inter_tokens: 0,
        known: KVROUTE_ENGINE_TIMING_PREFILL | KVROUTE_ENGINE_TIMING_INTER_TOKEN,
    };
    let observe = |pod, s: *const _, t: *const _| {
        status(kvroute_router_observe_engine_timed(r, pod, s, t, 10))
    };
    assert_eq!(observe(a, &snap, &good), "KVROUTE_STATUS_OK");
    assert_eq!(observe(a, &snap, ptr::null()), "KVROUTE_STATUS_OK");
    assert_eq!(
        status(kvroute_router_observe_engine_timed(
            ptr::null_mut(),
            a,
            &snap,
            &good,
            10
        )),
        "KVROUTE_STATUS_NULL_PARAMETER"
    );
    assert_eq!(
        observe(a, ptr::null(), &good),
        "KVROUTE_STATUS_NULL_PARAMETER"
    );
    assert_eq!(observe(4321, &snap, &good), "KVROUTE_STATUS_UNKNOWN_POD");
    let bad_snapshot = kvroute_engine_snapshot {
        known: 1 << 3,
        ..snap
    };
    assert_eq!(
        observe(a, &bad_snapshot, &good),
        "KVROUTE_STATUS_INVALID_PARAMETER"
    );
    let invalid = [
        kvroute_engine_timing {
            known: 1 << 2,
            ..good
        },
        kvroute_engine_timing {
            known: u32::MAX,
            ..good
        },
        kvroute_engine_timing {
            prefill_seconds: -0.5,
            ..good
        },
        kvroute_engine_timing {
            prefill_seconds: f64::NAN,
            ..good
        },
        kvroute_engine_timing {
            inter_token_seconds: f64::INFINITY,
            ..good
        },
        kvroute_engine_timing {
            inter_token_seconds: -1e-9,
            ..good
        },
    ];
    for t in invalid {
        assert_eq!(
            observe(a, &snap, &t),
            "KVROUTE_STATUS_INVALID_PARAMETER",
            "{t:?}"
        );
    }
    // Seconds whose bit is not set are not read.
    let unread = kvroute_engine_timing {
        prefill_seconds: f64::NAN,
        inter_token_seconds: -1.0,
        known: 0,
        ..good
    };
    assert_eq!(observe(a, &snap, &unread), "KVROUTE_STATUS_OK");
    kvroute_router_free(r);
}

/// The decision line's `key=` value, as a number.
fn decision_field(r: *mut kvroute_router, ticket: kvroute_ticket, key: &str) -> f64 {
    let mut buf = vec![0u8; 1024];
    let mut n = 0;
    assert_eq!(
        kvroute_router_explain(r, ticket, buf.as_mut_ptr(), buf.len(), &mut n),
        kvroute_status::Ok
    );
    let line = std::str::from_utf8(&buf[..n]).unwrap();
    let prefix = format!("{key}=");
    let value = line
        .split(' ')
        .find_map(|kv| kv.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no {key} in {line}"));
    value.parse().unwrap()
}

/// A router with one pod of capacity 1 gets engine snapshots, with the engine's timing
/// counters (prefill 40,000 tokens/s, TPOT 10 ms; the priors are 3,000 tokens/s and 50 ms)
/// when `timed` and without them (a NULL `timing`) otherwise, all else equal. Returns
/// `(ttft, queue)` predicted for a 2,000-token request on the idle pod and for the request that
/// waits for its slot.
fn predictions_after_engine_counters(timed: bool) -> (f64, f64) {
    let r = new_router("least-ttft");
    let a = add(r, "a", "10.0.0.1:80");
    assert_eq!(kvroute_router_set_pod_capacity(r, a, 1), kvroute_status::Ok);
    // A completion without a first-token time (as behind Envoy) makes the engine counters the
    // source of the pod's rates. Its prompt token count keeps the engine's prefix-cache
    // counters from teaching bytes per token (the same in both routers anyway), and its cached
    // tokens (none) tell the model the pod holds nothing the index does not know.
    let d = route(r, "warm-up ".repeat(1_000).as_bytes(), 1).unwrap();
    let t = kvroute_timings {
        prompt_tokens: 2_000,
        cached_tokens: 0,
        known: KVROUTE_TIMING_PROMPT_TOKENS | KVROUTE_TIMING_CACHED_TOKENS,
        ..Default::default()
    };
    assert_eq!(
        kvroute_router_complete_with_timings(r, d.ticket, 0, &t, 500),
        kvroute_status::Ok
    );
    // Every second: 4 prefills of 10,000 computed tokens in 1 s in all, 100 gaps of 10 ms.
    for k in 0..30u64 {
        let now = 1_000 + k * 1_000;
        let snapshot = kvroute_engine_snapshot {
            prefix_queries: k * 40_000,
            prefix_hits: 0,
            known: KVROUTE_ENGINE_PREFIX_QUERIES | KVROUTE_ENGINE_PREFIX_HITS,
            ..Default::default()
        };
        let timing = kvroute_engine_timing {
            prefill_seconds: k as f64,
            prefills: k * 4,
            inter_token_seconds: k as f64,
            inter_tokens: k * 100,
            known: KVROUTE_ENGINE_TIMING_PREFILL | KVROUTE_ENGINE_TIMING_INTER_TOKEN,
        };
        let timing: *const kvroute_engine_timing = if timed { &timing } else { ptr::null() };
        assert_eq!(
            kvroute_router_observe_engine_timed(r, a, &snapshot, timing, now),
            kvroute_status::Ok
        );
    }
    let prompt = "x".repeat(8_000); // 2,000 tokens at the prior 4 bytes per token
    let first = route(r, prompt.as_bytes(), 31_000).unwrap();
    let second = route(r, b"next", 31_000).unwrap();
    let ttft = decision_field(r, first.ticket, "pred_ttft_ms");
    assert_eq!(decision_field(r, first.ticket, "pred_queue_ms"), 0.0);
    let queue = decision_field(r, second.ticket, "pred_queue_ms");
    kvroute_router_free(r);
    (ttft, queue)
}

#[test]
fn engine_timing_counters_teach_the_least_ttft_model() {
    let (ttft, queue) = predictions_after_engine_counters(true);
    let (prior_ttft, prior_queue) = predictions_after_engine_counters(false);
    // Priors: 50 ms overhead + 2,000 tokens at 3,000 tokens/s (667 ms); the waiting request
    // starts when the first one ends, 667 ms of prefill and 127 tokens of 50 ms after issue.
    assert!((700.0..=730.0).contains(&prior_ttft), "{prior_ttft}");
    assert!((6_950.0..=7_100.0).contains(&prior_queue), "{prior_queue}");
    // Learned: 2,000 tokens at ~40,000 tokens/s (50 ms); 127 tokens of ~10 ms.
    assert!((90.0..=120.0).contains(&ttft), "{ttft}");
    assert!((1_280.0..=1_400.0).contains(&queue), "{queue}");
}

/// One pod with two sequence slots, one request open on it, and an engine snapshot showing that
/// request running with its KV cache 99% used: whether the next 8,000-byte request (2,000
/// tokens at the prior 4 bytes per token, half of them expected uncached) waits for the
/// running one depends on the KV cache's size.
#[test]
fn the_engine_kv_cache_size_decides_when_a_full_cache_makes_a_request_wait() {
    let r = new_router("least-ttft");
    let a = add(r, "a", "10.0.0.1:80");
    assert_eq!(kvroute_router_set_pod_capacity(r, a, 2), kvroute_status::Ok);
    route(r, b"first", 0).unwrap();
    let queue_after = |tokens: u64, now: u64| {
        assert_eq!(
            kvroute_router_set_engine_kv_cache_tokens(r, a, tokens),
            kvroute_status::Ok
        );
        let snapshot = kvroute_engine_snapshot {
            running: 1,
            kv_usage: 0.99,
            known: KVROUTE_ENGINE_KV_USAGE,
            ..Default::default()
        };
        assert_eq!(
            kvroute_router_observe_engine(r, a, &snapshot, now),
            kvroute_status::Ok
        );
        // A prompt the index has not seen (it learns each one routed).
        let prompt = now.to_string().repeat(8_000);
        let d = route(r, prompt.as_bytes(), now).unwrap();
        let queue = decision_field(r, d.ticket, "pred_queue_ms");
        let cancelled = kvroute_outcome::Cancelled as u32;
        assert_eq!(
            kvroute_router_complete(r, d.ticket, cancelled, now),
            kvroute_status::Ok
        );
        queue
    };
    assert_eq!(queue_after(0, 1), 0.0, "size unknown: never full");
    assert_eq!(queue_after(10_000_000, 2), 0.0, "100,000 tokens free");
    assert!(queue_after(100_000, 3) > 0.0, "1,000 tokens free");
    assert_eq!(queue_after(0, 4), 0.0, "unknown again");
    assert_eq!(
        kvroute_router_set_engine_kv_cache_tokens(r, 99, 1),
        kvroute_status::UnknownPod
    );
    assert_eq!(kvroute_router_remove_pod(r, a), kvroute_status::Ok);
    assert_eq!(
        kvroute_router_set_engine_kv_cache_tokens(r, a, 1),
        kvroute_status::UnknownPod
    );
    kvroute_router_free(r);
}

/// A first-token report with everything it reads: 2,000 prompt tokens, none cached, the first
/// token `first_token_ms` after routing.
fn first_token_timings(first_token_ms: u64) -> kvroute_timings {
    kvroute_timings {
        first_token_ms,
        prompt_tokens: 2_000,
        cached_tokens: 0,
        known: KVROUTE_TIMING_FIRST_TOKEN_MS
            | KVROUTE_TIMING_PROMPT_TOKENS
            | KVROUTE_TIMING_CACHED_TOKENS,
        ..Default::default()
    }
}

#[test]
fn first_token_statuses() {
    let r = new_router("least-ttft");
    let a = add(r, "a", "10.0.0.1:80");
    let b = add(r, "b", "10.0.0.2:80");
    let d = route(r, b"hello", 1).unwrap();
    let good = first_token_timings(120);
    let report =
        |ticket, t: *const kvroute_timings| status(kvroute_router_first_token(r, ticket, t, 200));
    assert_eq!(
        status(kvroute_router_first_token(
            ptr::null_mut(),
            d.ticket,
            &good,
            200
        )),
        "KVROUTE_STATUS_NULL_PARAMETER"
    );
    assert_eq!(
        report(d.ticket, ptr::null()),
        "KVROUTE_STATUS_NULL_PARAMETER"
    );
    // Unknown bits, and a report without the first-token time, are rejected (and checked
    // before the ticket).
    let invalid = [
        kvroute_timings {
            known: good.known | 1 << 5,
            ..good
        },
        kvroute_timings {
            known: u32::MAX,
            ..good
        },
        kvroute_timings {
            known: KVROUTE_TIMING_PROMPT_TOKENS | KVROUTE_TIMING_CACHED_TOKENS,
            ..good
        },
        kvroute_timings { known: 0, ..good },
    ];
    for t in invalid {
        assert_eq!(
            report(d.ticket, &t),
            "KVROUTE_STATUS_INVALID_PARAMETER",
            "{t:?}"
        );
        assert_eq!(
            report(d.ticket + 1_000, &t),
            "KVROUTE_STATUS_INVALID_PARAMETER",
            "{t:?}"
        );
    }
    assert_eq!(
        report(d.ticket + 1_000, &good),
        "KVROUTE_STATUS_UNKNOWN_TICKET"
    );
    // The first-token time alone is enough.
    let minimal = kvroute_timings {
        first_token_ms: 120,
        known: KVROUTE_TIMING_FIRST_TOKEN_MS,
        ..Default::default()
    };
    assert_eq!(report(d.ticket, &minimal), "KVROUTE_STATUS_OK");
    // A second report is ignored; the completion-only bits are accepted (and not read).
    let whole = kvroute_timings {
        total_ms: 900,
        output_tokens: 40,
        known: good.known | KVROUTE_TIMING_TOTAL_MS | KVROUTE_TIMING_OUTPUT_TOKENS,
        ..good
    };
    assert_eq!(report(d.ticket, &whole), "KVROUTE_STATUS_OK");
    // Nothing was released: the ticket is still open, explained and counted in flight.
    let mut in_flight = 0;
    assert_eq!(
        kvroute_router_in_flight(r, d.pod, &mut in_flight),
        kvroute_status::Ok
    );
    assert_eq!(in_flight, 1);
    let mut n = 0;
    assert_eq!(
        kvroute_router_explain(r, d.ticket, ptr::null_mut(), 0, &mut n),
        kvroute_status::InsufficientSize
    );
    assert_eq!(
        kvroute_router_complete_with_timings(r, d.ticket, 0, &whole, 300),
        kvroute_status::Ok
    );
    assert_eq!(report(d.ticket, &good), "KVROUTE_STATUS_TICKET_NOT_OPEN");

    // A ticket whose pod was removed meanwhile is still open: its report succeeds.
    let e = route(r, b"again", 400).unwrap();
    assert_eq!(kvroute_router_remove_pod(r, e.pod), kvroute_status::Ok);
    assert_eq!(report(e.ticket, &good), "KVROUTE_STATUS_OK");
    assert_eq!(
        kvroute_router_complete(r, e.ticket, 0, 500),
        kvroute_status::Ok
    );
    assert!(e.pod == a || e.pod == b);

    // An expired ticket is not open either.
    let f = route(r, b"late", 600).unwrap();
    assert_eq!(
        kvroute_router_tick(r, 600 + 31 * 60 * 1_000),
        kvroute_status::Ok
    );
    assert_eq!(report(f.ticket, &good), "KVROUTE_STATUS_TICKET_NOT_OPEN");
    kvroute_router_free(r);
}

/// The `least-ttft` prediction for a 2,000-token prompt on an idle pod after one 2,000-token
/// request whose first token was reported at each of `reports` (ms after routing), and which
/// was then completed with `completion` (NULL: no timings).
fn ttft_after_first_tokens(reports: &[u64], completion: Option<kvroute_timings>) -> f64 {
    let r = new_router("least-ttft");
    add(r, "a", "10.0.0.1:80");
    let d = route(r, "x".repeat(8_000).as_bytes(), 1).unwrap();
    for &ms in reports {
        let t = first_token_timings(ms);
        assert_eq!(
            kvroute_router_first_token(r, d.ticket, &t, 1 + ms),
            kvroute_status::Ok
        );
    }
    let c = completion.as_ref().map_or(ptr::null(), |t| t as *const _);
    assert_eq!(
        kvroute_router_complete_with_timings(r, d.ticket, 0, c, 5_000),
        kvroute_status::Ok
    );
    let next = route(r, "y".repeat(8_000).as_bytes(), 6_000).unwrap();
    let ttft = decision_field(r, next.ticket, "pred_ttft_ms");
    kvroute_router_free(r);
    ttft
}

#[test]
fn first_token_teaches_least_ttft_and_only_once() {
    // Priors: 50 ms + 2,000 tokens at 3,000 tokens/s = 717 ms (a completion without cached
    // tokens says none will come, so the pod is not probed as possibly warm).
    let prior = ttft_after_first_tokens(&[], None);
    // 2,000 uncached tokens in 2,000 ms after the 50 ms overhead: a prefill rate of 1,000
    // tokens/s, which moves the estimate to 2,600 (50 + 769 = 819 ms).
    let slow = ttft_after_first_tokens(&[2_050], None);
    assert!(
        slow - prior >= 80.0,
        "prior {prior}, after the report {slow}"
    );
    // The report teaches what the completion would have taught with the same fields.
    assert_eq!(
        ttft_after_first_tokens(&[], Some(first_token_timings(2_050))),
        slow
    );
    // A second report is ignored, and so is the completion's own first-token time (the
    // completion alone would have learned a fast pod from it).
    assert_eq!(ttft_after_first_tokens(&[2_050, 60], None), slow);
    let fast = kvroute_timings {
        total_ms: 4_000,
        output_tokens: 100,
        known: first_token_timings(60).known
            | KVROUTE_TIMING_TOTAL_MS
            | KVROUTE_TIMING_OUTPUT_TOKENS,
        ..first_token_timings(60)
    };
    let unreported = ttft_after_first_tokens(&[], Some(fast));
    assert!(unreported < slow - 200.0, "{unreported} vs {slow}");
    assert_eq!(ttft_after_first_tokens(&[2_050], Some(fast)), slow);
}

/// `kvroute_router_route_json` reads the body's output-token limit: the slot a request holds
/// is predicted free after at most that many tokens.
#[test]
fn route_json_passes_the_output_token_limit() {
    let queue_behind = |limit: &str| {
        let r = new_router("least-ttft");
        let a = add(r, "a", "10.0.0.1:80");
        assert_eq!(kvroute_router_set_pod_capacity(r, a, 1), kvroute_status::Ok);
        let body = format!(r#"{{"model":"m","prompt":"hello"{limit}}}"#);
        let mut d = kvroute_decision::default();
        let st = kvroute_router_route_json(
            r,
            ptr::null(),
            0,
            body.as_ptr(),
            body.len(),
            ptr::null(),
            0,
            0,
            &mut d,
        );
        assert_eq!(status(st), "KVROUTE_STATUS_OK");
        let next = route(r, b"next", 0).unwrap();
        let queue = decision_field(r, next.ticket, "pred_queue_ms");
        kvroute_router_free(r);
        queue
    };
    // The prior's 128 output tokens at 50 ms; with the limit, one token after the first (and
    // no sooner than 40% of that decode and a token from now, as for any open request).
    let unlimited = queue_behind("");
    assert_eq!(unlimited, 127.0 * 50.0);
    assert_eq!(queue_behind(r#","max_tokens":2"#), 0.4 * 50.0 + 50.0);
    assert_eq!(
        queue_behind(r#","max_tokens":"2""#),
        unlimited,
        "not an integer: ignored"
    );
}

/// The health settings reach the router: with one gateway failure enough and a 100% cap, one
/// connect failure ejects a pod for the configured time, and the completion says so.
#[test]
fn health_settings_reach_the_router_and_completions_report_events() {
    let b = kvroute_config_builder_new();
    assert_eq!(
        kvroute_config_builder_set_strategy(b, b"least-request".as_ptr(), 13),
        kvroute_status::Ok
    );
    for st in [
        kvroute_config_builder_set_consecutive_gateway_failures(b, 1),
        kvroute_config_builder_set_base_ejection_ms(b, 250),
        kvroute_config_builder_set_max_ejection_percent(b, 100),
    ] {
        assert_eq!(st, kvroute_status::Ok);
    }
    assert_eq!(
        kvroute_config_builder_set_base_ejection_ms(b, 0),
        kvroute_status::InvalidParameter
    );
    assert_eq!(
        kvroute_config_builder_set_max_ejection_percent(b, 101),
        kvroute_status::InvalidParameter
    );
    let mut config = ptr::null();
    assert_eq!(
        kvroute_config_builder_build(b, &mut config),
        kvroute_status::Ok
    );
    let mut r = ptr::null_mut();
    assert_eq!(kvroute_router_new(config, &mut r), kvroute_status::Ok);
    kvroute_config_free(config);
    let pods = [
        add(r, "a", "10.0.0.1:80"),
        add(r, "b", "10.0.0.2:80"),
        add(r, "c", "10.0.0.3:80"),
    ];
    let d = route(r, b"x", 1000).unwrap();
    let mut event = u32::MAX;
    assert_eq!(
        kvroute_router_complete_with_event(
            r,
            d.ticket,
            kvroute_outcome::ConnectFailed as u32,
            ptr::null(),
            1000,
            &mut event
        ),
        kvroute_status::Ok
    );
    assert_eq!(event, kvroute_health_event::Ejected as u32);
    let mut info = kvroute_pod_info::default();
    assert_eq!(
        kvroute_router_pod_info(r, d.pod, &mut info),
        kvroute_status::Ok
    );
    assert!(info.ejected && !info.probing && info.ejected_until_ms == 1250);
    assert_eq!((info.ejections_5xx, info.ejections_gateway), (0, 1));
    // A second pod may go too (100%), but never the last one in service.
    let rest: Vec<_> = pods.iter().copied().filter(|p| *p != d.pod).collect();
    let mut events = Vec::new();
    for now in 1001..1003 {
        let e = route(r, b"x", now).unwrap();
        assert_eq!(
            (e.excluded, rest.contains(&e.pod)),
            (now as u32 - 1000, true)
        );
        assert_eq!(
            kvroute_router_complete_with_event(r, e.ticket, 4, ptr::null(), now, &mut event),
            kvroute_status::Ok
        );
        events.push(event);
    }
    assert_eq!(
        events,
        [
            kvroute_health_event::Ejected as u32,
            kvroute_health_event::EjectionSkipped as u32
        ]
    );
    kvroute_router_free(r);
}

mod session;
mod tokens;
mod ttft;
