//! The token-id and token-block-key calls.

use std::ptr;

use super::*;

/// `(ptr, len)` of an optional byte string: `(NULL, 0)` for `None`.
fn opt_bytes(s: Option<&[u8]>) -> (*const u8, usize) {
    s.map_or((ptr::null(), 0), |s| (s.as_ptr(), s.len()))
}

/// `kvroute_router_route_tokens` on model `m` with the default strategy and no limit.
fn route_tokens(
    r: *mut kvroute_router,
    ids: &[u32],
    block_tokens: u32,
    lora: Option<&[u8]>,
    salt: Option<&[u8]>,
    now: u64,
) -> Result<kvroute_decision, kvroute_status> {
    let (lp, ln) = opt_bytes(lora);
    let (sp, sn) = opt_bytes(salt);
    let mut d = kvroute_decision::default();
    match kvroute_router_route_tokens(
        r,
        b"m".as_ptr(),
        1,
        ids.as_ptr(),
        ids.len(),
        block_tokens,
        lp,
        ln,
        sp,
        sn,
        ptr::null(),
        0,
        0,
        now,
        &mut d,
    ) {
        kvroute_status::Ok => Ok(d),
        e => Err(e),
    }
}

/// `kvroute_token_block_keys` into a vector, through its count query.
fn token_keys(
    block_tokens: u32,
    seed: u64,
    ids: &[u32],
    lora: Option<&[u8]>,
    salt: Option<&[u8]>,
) -> Result<Vec<u64>, kvroute_status> {
    let (lp, ln) = opt_bytes(lora);
    let (sp, sn) = opt_bytes(salt);
    let call = |buf: &mut [u64], n: &mut usize| {
        let p = if buf.is_empty() {
            ptr::null_mut()
        } else {
            buf.as_mut_ptr()
        };
        kvroute_token_block_keys(
            block_tokens,
            seed,
            ids.as_ptr(),
            ids.len(),
            lp,
            ln,
            sp,
            sn,
            p,
            buf.len(),
            n,
        )
    };
    let mut n = usize::MAX;
    match call(&mut [], &mut n) {
        kvroute_status::Ok => return Ok(Vec::new()),
        kvroute_status::InsufficientSize => {}
        e => return Err(e),
    }
    let mut keys = vec![0u64; n];
    match call(&mut keys, &mut n) {
        kvroute_status::Ok => Ok(keys[..n].to_vec()),
        e => Err(e),
    }
}

/// A router seeded 7 with a fixed hash seed, so that keys can be computed outside it.
fn new_router_with_hash_seed(strategy: &str, hash_seed: u64) -> *mut kvroute_router {
    let b = kvroute_config_builder_new();
    assert_eq!(kvroute_config_builder_set_seed(b, 7), kvroute_status::Ok);
    assert_eq!(
        kvroute_config_builder_set_hash_seed(b, hash_seed),
        kvroute_status::Ok
    );
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

/// `n` token ids, the same for the same `family` (a shared prefix), from a small LCG.
fn ids(family: u32, n: usize) -> Vec<u32> {
    let mut x = u64::from(family).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (x >> 40) as u32 % 128_000
        })
        .collect()
}

#[test]
fn token_block_keys_are_the_cores() {
    use kvroute_core::{BlockExtras, TokenKeyConfig};
    let prompt = ids(1, 100);
    for (block, seed) in [(16u32, 0u64), (16, 42), (1, 7), (64, u64::MAX), (100, 3)] {
        let config = TokenKeyConfig::new(block, seed).unwrap();
        for (lora, salt) in [
            (None, None),
            (Some("sql-adapter"), None),
            (None, Some("tenant-1")),
            (Some("sql-adapter"), Some("tenant-1")),
        ] {
            let core: Vec<u64> = config
                .keys(
                    &prompt,
                    BlockExtras {
                        lora,
                        cache_salt: salt,
                    },
                )
                .into_iter()
                .map(|k| k.0)
                .collect();
            let got = token_keys(
                block,
                seed,
                &prompt,
                lora.map(str::as_bytes),
                salt.map(str::as_bytes),
            );
            assert_eq!(
                got.as_deref(),
                Ok(&core[..]),
                "{block} {seed} {lora:?} {salt:?}"
            );
            assert_eq!(core.len(), 100 / block as usize);
        }
    }
    // An empty LoRA name or salt is none, as (NULL, 0) is (vLLM ignores an empty salt).
    assert_eq!(
        token_keys(16, 5, &prompt, Some(b""), Some(b"")),
        token_keys(16, 5, &prompt, None, None)
    );
    // A prompt shorter than a block, or none, has no keys.
    assert_eq!(token_keys(16, 5, &prompt[..15], None, None), Ok(vec![]));
    let mut n = 9usize;
    assert_eq!(
        kvroute_token_block_keys(
            16,
            5,
            ptr::null(),
            0,
            ptr::null(),
            0,
            ptr::null(),
            0,
            ptr::null_mut(),
            0,
            &mut n
        ),
        kvroute_status::Ok
    );
    assert_eq!(n, 0);
}

/// Keys from an independent implementation of the scheme (pure-Python XXH64:
/// `tests/c/token_keys_golden.py`); the C and Go tests check the same values.
#[test]
fn token_block_keys_golden_values() {
    let ids: Vec<u32> = (1..10).collect();
    // (LoRA, cache salt, keys); "" is none.
    let golden = [
        ("", "", [0xd2828303c82b3344, 0x8879faddb1d9721b]),
        ("sql", "", [0x46385cd41f318aa3, 0x39f297036e1dda2b]),
        ("", "tenant-1", [0x80225f633e8330d8, 0x2baf9d2edb9a58bb]),
        ("sql", "tenant-1", [0x61b74bbd12967618, 0x30b8481bf599aaa2]),
    ];
    for (lora, salt, keys) in golden {
        let got = token_keys(4, 42, &ids, Some(lora.as_bytes()), Some(salt.as_bytes()));
        assert_eq!(got, Ok(keys.to_vec()), "{lora:?} {salt:?}");
    }
    let long: Vec<u32> = (1000..1040).collect();
    assert_eq!(
        token_keys(16, 0, &long, None, None),
        Ok(vec![0x7f98bc3aa313799f, 0xb4bb9f4d4833b4ea])
    );
}

/// Two requests sharing a 1,000-token prefix go to the same pod, whose blocks they match; the
/// decisions are the core's for the same keys, and least-ttft counts the prompt exactly.
#[test]
fn route_tokens_is_the_cores_token_routing() {
    let r = new_router("least-ttft");
    add(r, "vllm-a", "10.0.0.1:8000");
    add(r, "vllm-b", "10.0.0.2:8000");
    let mut core = kvroute_core::Router::new(kvroute_core::RouterConfig {
        seed: 7,
        default_strategy: kvroute_core::StrategySpec::parse("least-ttft").unwrap(),
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
    let keys = core.token_key_config(16).unwrap();
    let shared = ids(4, 1_000);
    let prompts: Vec<Vec<u32>> = [7u32, 9, 11]
        .iter()
        .map(|&tail| [shared.clone(), ids(100 + tail, 3 + tail as usize)].concat())
        .collect();
    let mut decisions = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let now = 10 + i as u64;
        let d = route_tokens(r, p, 16, None, None, now).unwrap();
        let k = keys.keys(p, kvroute_core::BlockExtras::default());
        let size = kvroute_core::PromptTokens {
            prompt_tokens: p.len() as u32,
            block_tokens: 16,
        };
        let expected = core
            .route(
                kvroute_core::RouteRequest::new("m", &k).with_tokens(size),
                kvroute_core::Timestamp::from_millis(now),
            )
            .unwrap()
            .to_string();
        let mut buf = vec![0u8; 1024];
        let mut n = 0;
        assert_eq!(
            kvroute_router_explain(r, d.ticket, buf.as_mut_ptr(), buf.len(), &mut n),
            kvroute_status::Ok
        );
        assert_eq!(std::str::from_utf8(&buf[..n]).unwrap(), expected);
        // The prompt's length in tokens, exactly (partial last block included).
        let cached = expected
            .split(' ')
            .find_map(|kv| kv.strip_prefix("pred_cached_tokens="))
            .unwrap();
        assert_eq!(
            cached.split_once('/').unwrap().1,
            p.len().to_string(),
            "{expected}"
        );
        assert_eq!(d.total_blocks as usize, p.len() / 16);
        decisions.push(d);
    }
    // The later requests match the first's 62 shared blocks (1,000 / 16) on its pod.
    for d in &decisions[1..] {
        assert_eq!(d.pod, decisions[0].pod);
        assert_eq!(d.matched_blocks, 62, "{d:?}");
    }
    // Another LoRA adapter or cache salt matches nothing.
    let lora = route_tokens(r, &prompts[0], 16, Some(b"sql"), None, 20).unwrap();
    let salted = route_tokens(r, &prompts[0], 16, None, Some(b"tenant-2"), 21).unwrap();
    assert_eq!((lora.matched_blocks, salted.matched_blocks), (0, 0));
    // Token keys never match the byte hashes of a text prompt.
    let text = route(r, "x".repeat(4_000).as_bytes(), 22).unwrap();
    assert_eq!(text.matched_blocks, 0);
    kvroute_router_free(r);
}

/// `kvroute_router_route_keys` on `kvroute_token_block_keys` with the router's hash seed is
/// `kvroute_router_route_tokens`: two routers given the same requests both ways decide alike.
#[test]
fn route_keys_on_token_block_keys_is_route_tokens() {
    let by_tokens = new_router_with_hash_seed("prefix-cache", 99);
    let by_keys = new_router_with_hash_seed("prefix-cache", 99);
    for r in [by_tokens, by_keys] {
        add(r, "a", "10.0.0.1:80");
        add(r, "b", "10.0.0.2:80");
        add(r, "c", "10.0.0.3:80");
    }
    for i in 0..12u32 {
        let prompt = [ids(i % 3, 200), ids(50 + i, 21)].concat();
        let lora: Option<&[u8]> = (i % 4 == 0).then_some(b"adapter");
        let now = u64::from(i);
        let d = route_tokens(by_tokens, &prompt, 32, lora, None, now).unwrap();
        let keys = token_keys(32, 99, &prompt, lora, None).unwrap();
        let mut e = kvroute_decision::default();
        assert_eq!(
            kvroute_router_route_keys(
                by_keys,
                b"m".as_ptr(),
                1,
                keys.as_ptr(),
                keys.len(),
                prompt.len() as u32,
                32,
                ptr::null(),
                0,
                0,
                ptr::null(),
                0,
                now,
                &mut e,
            ),
            kvroute_status::Ok
        );
        assert_eq!(d, e, "request {i}");
        if i >= 3 && i % 4 != 0 && (i - 3) % 4 != 0 {
            assert_eq!(
                d.matched_blocks, 6,
                "request {i}: 200 shared tokens are 6 blocks of 32"
            );
        }
    }
    kvroute_router_free(by_tokens);
    kvroute_router_free(by_keys);
}

/// The output-token limit of the token calls caps the decode least-ttft predicts; 0 is none.
#[test]
fn route_tokens_passes_the_output_token_limit() {
    let queue_behind = |limit: u32| {
        let r = new_router("least-ttft");
        let a = add(r, "a", "10.0.0.1:80");
        assert_eq!(kvroute_router_set_pod_capacity(r, a, 1), kvroute_status::Ok);
        // No complete block and no tokens, as the route_json test's "hello".
        let prompt: Vec<u32> = Vec::new();
        let mut d = kvroute_decision::default();
        let st = kvroute_router_route_tokens(
            r,
            b"m".as_ptr(),
            1,
            prompt.as_ptr(),
            prompt.len(),
            16,
            ptr::null(),
            0,
            ptr::null(),
            0,
            ptr::null(),
            0,
            limit,
            0,
            &mut d,
        );
        assert_eq!(status(st), "KVROUTE_STATUS_OK");
        let next = route(r, b"next", 0).unwrap();
        let queue = decision_field(r, next.ticket, "pred_queue_ms");
        kvroute_router_free(r);
        queue
    };
    // As in route_json_passes_the_output_token_limit.
    assert_eq!(queue_behind(0), 127.0 * 50.0);
    assert_eq!(queue_behind(2), 0.4 * 50.0 + 50.0);
}

mod statuses;
