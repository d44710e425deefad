//! Engine views through the router façade: token-keyed requests matched against what the
//! engines say they hold (their KV events) instead of what the router sent them.

mod common;

use common::{router_with_pods, t, MODEL};
use kvroute_core::{
    BlockExtras, EngineBlockHash, KvApplied, KvEvent, KvSource, MatchView, PodId, PromptTokens,
    Reason, RouteRequest, Router, RouterConfig, StoredBlocks, Strategy, TtftConfig,
};

const BS: u32 = 16;

fn config(strategy: Strategy) -> RouterConfig {
    RouterConfig {
        seed: 5,
        default_strategy: strategy.into(),
        ttft: TtftConfig {
            engine_block_tokens: BS,
            ..Default::default()
        },
        ..Default::default()
    }
}

fn prompt(family: u32, len: u32) -> Vec<u32> {
    (0..len).map(|i| family * 100_000 + i).collect()
}

/// The engine hashes a publisher would give the prompt's blocks (any distinct values).
fn engine_hashes(family: u32, blocks: usize) -> Vec<EngineBlockHash> {
    (0..blocks as u64)
        .map(|i| EngineBlockHash(u64::from(family) << 32 | i))
        .collect()
}

/// `pod`'s engine stores the prompt's full blocks, as one event numbered `seq`.
fn store(r: &mut Router, pod: PodId, seq: u64, tokens: &[u32], family: u32) -> KvApplied {
    let blocks = tokens.len() / BS as usize;
    let hashes = engine_hashes(family, blocks);
    let ev = KvEvent::Stored(StoredBlocks {
        block_hashes: &hashes,
        parent: None,
        token_ids: &tokens[..blocks * BS as usize],
        block_size: BS,
        ..StoredBlocks::default()
    });
    r.apply_kv_events(pod, KvSource::Live, seq, &[ev], t(seq))
        .unwrap()
}

fn route(r: &mut Router, tokens: &[u32], now: u64) -> kvroute_core::Decision {
    let keys = r
        .token_key_config(BS)
        .unwrap()
        .keys(tokens, BlockExtras::default());
    let size = PromptTokens {
        prompt_tokens: tokens.len() as u32,
        block_tokens: BS,
    };
    r.route(RouteRequest::new(MODEL, &keys).with_tokens(size), t(now))
        .unwrap()
}

/// The study's fooled index: the router sent a family to pod 0, but pod 0 evicted it and pod 1
/// holds it (another router replica sent it there). prefix-cache follows the engines.
#[test]
fn prefix_cache_follows_the_engines_not_the_routes() {
    let no_pending = RouterConfig {
        engine_view_pending_ms: 0,
        ..config(Strategy::PrefixCache)
    };
    let (mut r, pods) = router_with_pods(2, no_pending);
    let p = prompt(1, 1_000);
    // Both views exist and are complete; pod 0's is empty.
    assert!(matches!(
        r.apply_kv_events(pods[0], KvSource::Live, 0, &[], t(0)),
        Ok(KvApplied::Applied(_))
    ));
    assert!(matches!(store(&mut r, pods[1], 0, &p, 1), KvApplied::Applied(c) if c.stored == 62));
    // The router-side index says pod 0 (written by a route while pod 1 was not ready).
    r.set_pod_ready(pods[1], false).unwrap();
    let d = route(&mut r, &p, 1);
    assert_eq!(d.pod, pods[0]);
    assert_eq!(
        d.view,
        MatchView::Engine,
        "pod 0's engine view answered: nothing"
    );
    assert_eq!(d.matched_blocks, 0);
    r.complete(d.ticket, kvroute_core::Outcome::Success.into(), t(2))
        .unwrap();
    r.set_pod_ready(pods[1], true).unwrap();

    let d = route(&mut r, &p, 3);
    assert_eq!(d.pod, pods[1]);
    assert_eq!(d.reason, Reason::PrefixMatch);
    assert_eq!((d.matched_blocks, d.total_blocks), (62, 62));
    assert_eq!(d.view, MatchView::Engine);
    assert!(d.to_string().contains(" view=engine"), "{d}");
}

/// least-ttft takes an engine view's match as the cached tokens: no trust/extra guess.
#[test]
fn least_ttft_predicts_exactly_what_the_engine_holds() {
    let (mut r, pods) = router_with_pods(2, config(Strategy::LeastTtft));
    let p = prompt(2, 1_000);
    store(&mut r, pods[0], 0, &p[..512], 2);
    r.apply_kv_events(pods[1], KvSource::Live, 0, &[], t(0))
        .unwrap();
    let d = route(&mut r, &p, 1);
    assert_eq!(d.pod, pods[0]);
    assert_eq!(d.view, MatchView::Engine);
    assert_eq!(d.matched_blocks, 32);
    assert_eq!(d.prediction.cached_tokens, 512);
    assert_eq!(d.prediction.prompt_tokens, 1_000);
}

/// Byte-keyed requests, stale views and pods without a view use the router-side index.
#[test]
fn the_index_answers_where_no_complete_view_can() {
    let (mut r, pods) = router_with_pods(2, config(Strategy::PrefixCache));
    let p = prompt(3, 640);
    // Pod 0 joins mid-stream: a gap from 0, never replayed.
    assert_eq!(
        store(&mut r, pods[0], 7, &p, 3),
        KvApplied::Gap { expected: 0 }
    );
    let d = route(&mut r, &p, 1);
    assert_eq!(
        d.view,
        MatchView::Index,
        "a view with a pending gap is not used"
    );
    let first = d.pod;
    r.accept_kv_gap(pods[0]).unwrap();
    assert!(matches!(
        store(&mut r, pods[0], 7, &p, 3),
        KvApplied::Applied(_)
    ));
    let v = r.kv_view(pods[0]).unwrap();
    assert!(!v.complete && v.blocks == 40);
    let d = route(&mut r, &p, 2);
    assert_eq!(d.view, MatchView::Index, "a stale view is not used");
    assert_eq!(d.pod, first, "the index sent it to {first} before");
    // Byte-keyed: the views are never consulted.
    let text = r.hash_config().hashes(&[b'x'; 4_096]);
    let d = r.route(RouteRequest::new(MODEL, &text), t(3)).unwrap();
    assert_eq!(d.view, MatchView::Index);
    // A removed pod's view goes with it; feeding an unknown pod is an error.
    r.remove_pod(pods[0]).unwrap();
    assert!(r.kv_view(pods[0]).is_none());
    assert!(r
        .apply_kv_events(pods[0], KvSource::Live, 8, &[], t(4))
        .is_err());
    // Forgetting a view returns the pod to the index.
    r.apply_kv_events(pods[1], KvSource::Live, 0, &[], t(5))
        .unwrap();
    assert!(r.kv_view(pods[1]).unwrap().complete);
    r.forget_kv_view(pods[1]).unwrap();
    assert!(r.kv_view(pods[1]).is_none());
    r.check_invariants().unwrap();
}

/// A prompt just sent to a pod counts as cached there while its engine computes it (the
/// pending window), then only what the engine reports does.
#[test]
fn what_was_just_sent_counts_until_the_engine_reports() {
    let (mut r, pods) = router_with_pods(2, config(Strategy::PrefixCache));
    for &pod in &pods {
        r.apply_kv_events(pod, KvSource::Live, 0, &[], t(0))
            .unwrap();
    }
    let p = prompt(4, 800);
    let first = route(&mut r, &p, 1_000);
    let again = route(&mut r, &p, 1_100);
    assert_eq!(again.pod, first.pod);
    assert_eq!((again.matched_blocks, again.view), (50, MatchView::Engine));
    // Past the window, with the engine never having reported the blocks: no match.
    let pending = r.config().engine_view_pending_ms;
    let late = route(&mut r, &p, 1_100 + pending);
    assert_eq!(late.matched_blocks, 0, "{late}");
}

/// A request routed on a view with blocks the engine does not hold makes the engine owe a
/// batch (`awaiting_since`, until one is applied); one fully held does not.
#[test]
fn routing_uncached_blocks_awaits_a_batch_and_a_batch_settles_it() {
    let (mut r, pods) = router_with_pods(1, config(Strategy::PrefixCache));
    let p = prompt(4, 640);
    store(&mut r, pods[0], 0, &p, 4);
    let d = route(&mut r, &p, 5);
    assert_eq!((d.matched_blocks, d.total_blocks), (40, 40));
    assert_eq!(r.kv_view(pods[0]).unwrap().awaiting_since, None);
    let q = prompt(5, 640);
    route(&mut r, &q, 6);
    route(&mut r, &q, 9);
    assert_eq!(r.kv_view(pods[0]).unwrap().awaiting_since, Some(t(6)));
    assert!(r.suspend_kv_view(pods[0]).unwrap());
    assert_eq!(route(&mut r, &p, 10).view, MatchView::Index);
    store(&mut r, pods[0], 1, &q, 5);
    let v = r.kv_view(pods[0]).unwrap();
    assert_eq!((v.awaiting_since, v.suspended), (None, false));
    assert_eq!(route(&mut r, &p, 11).view, MatchView::Engine);
}

/// A prompt sent to a pod counts there for the pending window (its engine reports its blocks
/// only once computed) until the engine reports them evicted: from then on neither the view
/// nor the router-side index claims them.
#[test]
fn evicted_blocks_stop_counting_in_the_pending_window() {
    let (mut r, pods) = router_with_pods(2, config(Strategy::PrefixCache));
    for &p in &pods {
        r.apply_kv_events(p, KvSource::Live, 0, &[], t(0)).unwrap();
    }
    let p = prompt(6, 640);
    let first = route(&mut r, &p, 1);
    let home = first.pod;
    // Pending: the engine has reported nothing yet, the route counts.
    let again = route(&mut r, &p, 2);
    assert_eq!((again.pod, again.matched_blocks), (home, 40));
    // The engine stores the blocks, then evicts them.
    assert!(matches!(
        store(&mut r, home, 1, &p, 6),
        KvApplied::Applied(c) if c.stored == 40
    ));
    let hashes = engine_hashes(6, 40);
    let removed = KvEvent::Removed {
        block_hashes: &hashes,
        medium: kvroute_core::Medium::Gpu,
        group: 0,
    };
    r.apply_kv_events(home, KvSource::Live, 2, &[removed], t(3))
        .unwrap();
    let d = route(&mut r, &p, 4);
    assert_eq!(d.view, MatchView::Engine);
    assert_eq!(
        d.matched_blocks, 0,
        "nothing claims the evicted prompt: {d}"
    );
}
