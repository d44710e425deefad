//! The status paths of the token-id calls: NULL pointers, bad UTF-8, bad sizes; outputs
//! untouched on error.

use super::*;

#[test]
fn token_block_keys_statuses() {
    let prompt = ids(2, 40);
    let keys = |block,
                tokens: *const u32,
                lora: (*const u8, usize),
                salt: (*const u8, usize),
                buf: &mut [u64],
                n: *mut usize| {
        let p = if buf.is_empty() {
            ptr::null_mut()
        } else {
            buf.as_mut_ptr()
        };
        status(kvroute_token_block_keys(
            block,
            0,
            tokens,
            40,
            lora.0,
            lora.1,
            salt.0,
            salt.1,
            p,
            buf.len(),
            n,
        ))
    };
    let none = (ptr::null(), 0);
    let mut buf = [0xAAu64; 3];
    let mut n = 77usize;
    // Count query, too small a buffer (untouched), enough.
    assert_eq!(
        keys(16, prompt.as_ptr(), none, none, &mut [], &mut n),
        "KVROUTE_STATUS_INSUFFICIENT_SIZE"
    );
    assert_eq!(n, 2);
    n = 77;
    assert_eq!(
        keys(16, prompt.as_ptr(), none, none, &mut buf[..1], &mut n),
        "KVROUTE_STATUS_INSUFFICIENT_SIZE"
    );
    assert_eq!((n, buf), (2, [0xAA; 3]));
    assert_eq!(
        keys(16, prompt.as_ptr(), none, none, &mut buf, &mut n),
        "KVROUTE_STATUS_OK"
    );
    assert_eq!((n, buf[2]), (2, 0xAA));
    assert_eq!(
        token_keys(16, 0, &prompt, None, None),
        Ok(buf[..2].to_vec())
    );
    // Errors: nothing written.
    let mut untouched = [0x55u64; 3];
    n = 77;
    for (block, tokens, lora, salt, expected) in [
        (
            0,
            prompt.as_ptr(),
            none,
            none,
            "KVROUTE_STATUS_INVALID_PARAMETER",
        ),
        (
            KVROUTE_MAX_BLOCK_TOKENS + 1,
            prompt.as_ptr(),
            none,
            none,
            "KVROUTE_STATUS_INVALID_PARAMETER",
        ),
        (16, ptr::null(), none, none, "KVROUTE_STATUS_NULL_PARAMETER"),
        (
            16,
            prompt.as_ptr(),
            (ptr::null(), 3),
            none,
            "KVROUTE_STATUS_NULL_PARAMETER",
        ),
        (
            16,
            prompt.as_ptr(),
            none,
            (ptr::null(), 3),
            "KVROUTE_STATUS_NULL_PARAMETER",
        ),
        (
            16,
            prompt.as_ptr(),
            (b"a\xff".as_ptr(), 2),
            none,
            "KVROUTE_STATUS_INVALID_UTF8",
        ),
        (
            16,
            prompt.as_ptr(),
            none,
            (b"\xc3".as_ptr(), 1),
            "KVROUTE_STATUS_INVALID_UTF8",
        ),
    ] {
        assert_eq!(
            keys(block, tokens, lora, salt, &mut untouched, &mut n),
            expected,
            "block {block}"
        );
    }
    assert_eq!((n, untouched), (77, [0x55; 3]));
    assert_eq!(
        keys(16, prompt.as_ptr(), none, none, &mut buf, ptr::null_mut()),
        "KVROUTE_STATUS_NULL_PARAMETER"
    );
    assert_eq!(
        status(kvroute_token_block_keys(
            16,
            0,
            prompt.as_ptr(),
            40,
            ptr::null(),
            0,
            ptr::null(),
            0,
            ptr::null_mut(),
            2,
            &mut n
        )),
        "KVROUTE_STATUS_NULL_PARAMETER"
    );
    // The largest block size is accepted.
    assert_eq!(
        keys(
            KVROUTE_MAX_BLOCK_TOKENS,
            prompt.as_ptr(),
            none,
            none,
            &mut [],
            &mut n
        ),
        "KVROUTE_STATUS_OK"
    );
    assert_eq!(n, 0);
}

#[test]
fn route_tokens_statuses() {
    let r = new_router("prefix-cache");
    add(r, "a", "10.0.0.1:80");
    let prompt = ids(3, 50);
    let untouched = kvroute_decision {
        ticket: 0x5A5A,
        pod: 0x5A5A,
        ..Default::default()
    };
    let mut d = untouched;
    let call = |r,
                model: &[u8],
                tokens: *const u32,
                block,
                lora: &[u8],
                salt: &[u8],
                strategy: &[u8],
                d: *mut kvroute_decision| {
        status(kvroute_router_route_tokens(
            r,
            model.as_ptr(),
            model.len(),
            tokens,
            50,
            block,
            lora.as_ptr(),
            lora.len(),
            salt.as_ptr(),
            salt.len(),
            strategy.as_ptr(),
            strategy.len(),
            0,
            1,
            d,
        ))
    };
    let p = prompt.as_ptr();
    for (router, model, tokens, block, lora, salt, strategy, expected) in [
        (
            ptr::null_mut(),
            &b"m"[..],
            p,
            16,
            &b""[..],
            &b""[..],
            &b""[..],
            "KVROUTE_STATUS_NULL_PARAMETER",
        ),
        (
            r,
            b"",
            ptr::null(),
            16,
            b"",
            b"",
            b"",
            "KVROUTE_STATUS_NULL_PARAMETER",
        ),
        (
            r,
            b"m\xff",
            p,
            16,
            b"",
            b"",
            b"",
            "KVROUTE_STATUS_INVALID_UTF8",
        ),
        (
            r,
            b"m",
            p,
            16,
            b"\xfe",
            b"",
            b"",
            "KVROUTE_STATUS_INVALID_UTF8",
        ),
        (
            r,
            b"m",
            p,
            16,
            b"",
            b"s\xff",
            b"",
            "KVROUTE_STATUS_INVALID_UTF8",
        ),
        (
            r,
            b"m",
            p,
            0,
            b"",
            b"",
            b"",
            "KVROUTE_STATUS_INVALID_PARAMETER",
        ),
        (
            r,
            b"m",
            p,
            KVROUTE_MAX_BLOCK_TOKENS + 1,
            b"",
            b"",
            b"",
            "KVROUTE_STATUS_INVALID_PARAMETER",
        ),
        (
            r,
            b"m",
            p,
            16,
            b"",
            b"",
            b"fastest",
            "KVROUTE_STATUS_INVALID_STRATEGY",
        ),
        (
            r,
            b"other",
            p,
            16,
            b"",
            b"",
            b"",
            "KVROUTE_STATUS_UNKNOWN_MODEL",
        ),
    ] {
        assert_eq!(
            call(router, model, tokens, block, lora, salt, strategy, &mut d),
            expected
        );
    }
    assert_eq!(
        call(r, b"m", p, 16, b"", b"", b"", ptr::null_mut()),
        "KVROUTE_STATUS_NULL_PARAMETER"
    );
    // (NULL, n > 0) model, LoRA or salt.
    let st = kvroute_router_route_tokens(
        r,
        ptr::null(),
        1,
        p,
        50,
        16,
        ptr::null(),
        0,
        ptr::null(),
        0,
        ptr::null(),
        0,
        0,
        1,
        &mut d,
    );
    assert_eq!(status(st), "KVROUTE_STATUS_NULL_PARAMETER");
    let st = kvroute_router_route_tokens(
        r,
        b"m".as_ptr(),
        1,
        p,
        50,
        16,
        ptr::null(),
        2,
        ptr::null(),
        0,
        ptr::null(),
        0,
        0,
        1,
        &mut d,
    );
    assert_eq!(status(st), "KVROUTE_STATUS_NULL_PARAMETER");
    let st = kvroute_router_route_tokens(
        r,
        b"m".as_ptr(),
        1,
        p,
        50,
        16,
        ptr::null(),
        0,
        ptr::null(),
        2,
        ptr::null(),
        0,
        0,
        1,
        &mut d,
    );
    assert_eq!(status(st), "KVROUTE_STATUS_NULL_PARAMETER");
    assert_eq!(d, untouched, "no output on error");

    // The subset variant: its own statuses, and the plain call's.
    let only_b = [c"10.0.0.2:80".as_ptr()];
    let with_null = [ptr::null()];
    let subset = |subset: *const *const std::ffi::c_char, n, d: *mut kvroute_decision| {
        status(kvroute_router_route_tokens_subset(
            r,
            b"m".as_ptr(),
            1,
            p,
            50,
            16,
            ptr::null(),
            0,
            ptr::null(),
            0,
            ptr::null(),
            0,
            0,
            subset,
            n,
            1,
            d,
        ))
    };
    assert_eq!(
        subset(only_b.as_ptr(), 1, &mut d),
        "KVROUTE_STATUS_NO_POD_IN_SUBSET"
    );
    assert_eq!(
        subset(with_null.as_ptr(), 1, &mut d),
        "KVROUTE_STATUS_NULL_PARAMETER"
    );
    assert_eq!(
        subset(ptr::null(), 1, &mut d),
        "KVROUTE_STATUS_NULL_PARAMETER"
    );
    assert_eq!(d, untouched);
    let only_a = [c"10.0.0.1:80".as_ptr()];
    assert_eq!(subset(only_a.as_ptr(), 1, &mut d), "KVROUTE_STATUS_OK");
    assert_eq!(subset(ptr::null(), 0, &mut d), "KVROUTE_STATUS_OK");
    // An empty prompt, and a non-NULL empty one, are fine: no blocks.
    for tokens in [ptr::null(), p] {
        let st = kvroute_router_route_tokens(
            r,
            b"m".as_ptr(),
            1,
            tokens,
            0,
            16,
            ptr::null(),
            0,
            ptr::null(),
            0,
            ptr::null(),
            0,
            0,
            2,
            &mut d,
        );
        assert_eq!((status(st), d.total_blocks), ("KVROUTE_STATUS_OK", 0));
    }
    kvroute_router_free(r);
}

#[test]
fn route_keys_statuses() {
    let r = new_router("prefix-cache");
    add(r, "a", "10.0.0.1:80");
    let keys = [1u64, 2, 3];
    let untouched = kvroute_decision {
        ticket: 0x5A5A,
        ..Default::default()
    };
    let mut d = untouched;
    let call = |keys: *const u64, n: usize, prompt_tokens, block, d: *mut kvroute_decision| {
        status(kvroute_router_route_keys(
            r,
            b"m".as_ptr(),
            1,
            keys,
            n,
            prompt_tokens,
            block,
            ptr::null(),
            0,
            0,
            ptr::null(),
            0,
            1,
            d,
        ))
    };
    assert_eq!(
        call(keys.as_ptr(), 3, 48, 0, &mut d),
        "KVROUTE_STATUS_INVALID_PARAMETER"
    );
    assert_eq!(
        call(keys.as_ptr(), 3, 48, KVROUTE_MAX_BLOCK_TOKENS + 1, &mut d),
        "KVROUTE_STATUS_INVALID_PARAMETER"
    );
    // More blocks than the prompt has.
    assert_eq!(
        call(keys.as_ptr(), 3, 47, 16, &mut d),
        "KVROUTE_STATUS_INVALID_PARAMETER"
    );
    assert_eq!(
        call(keys.as_ptr(), 1, u32::MAX, KVROUTE_MAX_BLOCK_TOKENS, &mut d),
        "KVROUTE_STATUS_OK"
    );
    d = untouched;
    assert_eq!(
        call(ptr::null(), 3, 48, 16, &mut d),
        "KVROUTE_STATUS_NULL_PARAMETER"
    );
    assert_eq!(
        call(keys.as_ptr(), 3, 48, 16, ptr::null_mut()),
        "KVROUTE_STATUS_NULL_PARAMETER"
    );
    assert_eq!(
        status(kvroute_router_route_keys(
            ptr::null_mut(),
            b"m".as_ptr(),
            1,
            keys.as_ptr(),
            3,
            48,
            16,
            ptr::null(),
            0,
            0,
            ptr::null(),
            0,
            1,
            &mut d,
        )),
        "KVROUTE_STATUS_NULL_PARAMETER"
    );
    assert_eq!(
        status(kvroute_router_route_keys(
            r,
            b"\xff".as_ptr(),
            1,
            keys.as_ptr(),
            3,
            48,
            16,
            ptr::null(),
            0,
            0,
            ptr::null(),
            0,
            1,
            &mut d,
        )),
        "KVROUTE_STATUS_INVALID_UTF8"
    );
    let nowhere = [c"10.9.9.9:1".as_ptr()];
    assert_eq!(
        status(kvroute_router_route_keys(
            r,
            b"m".as_ptr(),
            1,
            keys.as_ptr(),
            3,
            48,
            16,
            ptr::null(),
            0,
            0,
            nowhere.as_ptr(),
            1,
            1,
            &mut d,
        )),
        "KVROUTE_STATUS_NO_POD_IN_SUBSET"
    );
    assert_eq!(d, untouched, "no output on error");
    // The first key was indexed on the pod by the successful route above.
    assert_eq!(call(keys.as_ptr(), 3, 48, 16, &mut d), "KVROUTE_STATUS_OK");
    assert_eq!((d.total_blocks, d.matched_blocks), (3, 1));
    assert_eq!(call(ptr::null(), 0, 5, 16, &mut d), "KVROUTE_STATUS_OK");
    assert_eq!(d.total_blocks, 0);
    kvroute_router_free(r);
}
