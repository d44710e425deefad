//! Session affinity through the C ABI: the `_session` route calls take the request's session id,
//! `kvroute_router_session_id()` gives the decision's.

use std::ffi::c_char;
use std::ptr;

use super::*;

const ADDRESSES: [&str; 3] = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"];
/// Go's `base64.StdEncoding.EncodeToString` of each address (AIBrix's session ids).
const IDS: [&str; 3] = [
    "MTAuMC4wLjE6ODAwMA==",
    "MTAuMC4wLjI6ODAwMA==",
    "MTAuMC4wLjM6ODAwMA==",
];
/// No session id.
const NONE: (*const u8, usize) = (ptr::null(), 0);

/// The four calls that take a session id.
#[derive(Clone, Copy, Debug)]
enum Call {
    Bytes,
    Json,
    Tokens,
    Keys,
}

const CALLS: [Call; 4] = [Call::Bytes, Call::Json, Call::Tokens, Call::Keys];

fn bytes(s: &str) -> (*const u8, usize) {
    (s.as_ptr(), s.len())
}

/// Routes a short prompt of model `m` through `call` with `strategy` (`""`: the default),
/// an optional endpoint subset and `session`. Asserts that a failed call wrote no output.
fn route_session(
    r: *mut kvroute_router,
    call: Call,
    strategy: &str,
    subset: Option<&[*const c_char]>,
    session: (*const u8, usize),
    now: u64,
) -> Result<kvroute_decision, kvroute_status> {
    let sentinel = kvroute_decision {
        ticket: 0xDEAD,
        ..Default::default()
    };
    let mut d = sentinel;
    let (ap, an) = subset.map_or((ptr::null(), 0), |s| (s.as_ptr(), s.len()));
    let (sp, sn) = bytes(strategy);
    let (m, ml) = (b"m".as_ptr(), 1);
    let body = br#"{"model":"m","prompt":"hi"}"#;
    let st = match call {
        Call::Bytes => kvroute_router_route_session(
            r,
            m,
            ml,
            b"hi".as_ptr(),
            2,
            sp,
            sn,
            ap,
            an,
            session.0,
            session.1,
            now,
            &mut d,
        ),
        Call::Json => kvroute_router_route_json_session(
            r,
            ptr::null(),
            0,
            body.as_ptr(),
            body.len(),
            sp,
            sn,
            ap,
            an,
            session.0,
            session.1,
            now,
            &mut d,
        ),
        Call::Tokens => kvroute_router_route_tokens_session(
            r,
            m,
            ml,
            [1u32, 2, 3].as_ptr(),
            3,
            16,
            ptr::null(),
            0,
            ptr::null(),
            0,
            sp,
            sn,
            0,
            ap,
            an,
            session.0,
            session.1,
            now,
            &mut d,
        ),
        Call::Keys => kvroute_router_route_keys_session(
            r,
            m,
            ml,
            ptr::null(),
            0,
            3,
            16,
            sp,
            sn,
            0,
            ap,
            an,
            session.0,
            session.1,
            now,
            &mut d,
        ),
    };
    match st {
        kvroute_status::Ok => Ok(d),
        e => {
            assert_eq!(d, sentinel, "{call:?} wrote its output on {}", status(e));
            Err(e)
        }
    }
}

/// The session id of an open ticket's decision, read through a buffer of the documented size.
fn session_of(r: *mut kvroute_router, ticket: kvroute_ticket) -> Result<String, kvroute_status> {
    let mut buf = [0xAAu8; 96];
    let mut n = usize::MAX;
    match kvroute_router_session_id(r, ticket, buf.as_mut_ptr(), buf.len(), &mut n) {
        kvroute_status::Ok => {
            assert_eq!(buf[n], 0, "NUL-terminated");
            Ok(String::from_utf8(buf[..n].to_vec()).unwrap())
        }
        e => Err(e),
    }
}

/// Index of `pod` in `pods`.
fn which(pods: &[kvroute_pod_id], pod: kvroute_pod_id) -> usize {
    pods.iter()
        .position(|&p| p == pod)
        .expect("one of the pods")
}

#[test]
fn a_session_id_comes_back_and_brings_the_next_requests_to_its_pod() {
    let r = new_router("session-affinity");
    let pods = ADDRESSES.map(|a| add(r, a, a));
    let first = route_session(r, Call::Bytes, "", None, NONE, 1).unwrap();
    assert_eq!(first.reason, kvroute_reason::Random as u32);
    let id = session_of(r, first.ticket).unwrap();
    assert_eq!(id, IDS[which(&pods, first.pod)]);
    // Every call with that id goes to its pod, though the pod's load grows (tickets open).
    for (i, call) in CALLS.iter().cycle().take(12).enumerate() {
        let d = route_session(r, *call, "", None, bytes(&id), 2 + i as u64).unwrap();
        assert_eq!(d.pod, first.pod, "{call:?}");
        assert_eq!(d.reason, kvroute_reason::SessionAffinity as u32, "{call:?}");
        assert_eq!(session_of(r, d.ticket).unwrap(), id, "{call:?}");
    }
    // With a strategy that has no session-affinity, the id is ignored and none comes back.
    let d = route_session(r, Call::Json, "least-request", None, bytes(&id), 20).unwrap();
    assert_ne!(d.pod, first.pod, "least-request avoids the loaded pod");
    assert_eq!(session_of(r, d.ticket).unwrap(), "");
    kvroute_router_free(r);
}

#[test]
fn a_session_naming_no_candidate_falls_back_to_a_random_pod() {
    let r = new_router("session-affinity");
    let a = add(r, "a", ADDRESSES[0]);
    let b = add(r, "b", ADDRESSES[1]);
    let to_a = bytes(IDS[0]);
    // a not ready, or outside the subset: b, at random (the only candidate), with b's id.
    assert_eq!(
        kvroute_router_set_pod_ready(r, a, false),
        kvroute_status::Ok
    );
    let only_b = [c"10.0.0.2:8000".as_ptr()];
    for (subset, ready) in [(None, false), (Some(&only_b[..]), true)] {
        assert_eq!(
            kvroute_router_set_pod_ready(r, a, ready),
            kvroute_status::Ok
        );
        for call in CALLS {
            let d = route_session(r, call, "", subset, to_a, 1).unwrap();
            assert_eq!((d.pod, d.reason), (b, kvroute_reason::Random as u32));
            assert_eq!(session_of(r, d.ticket).unwrap(), IDS[1]);
        }
    }
    // Back in: the id finds a again.
    let d = route_session(r, Call::Bytes, "", None, to_a, 2).unwrap();
    assert_eq!(
        (d.pod, d.reason),
        (a, kvroute_reason::SessionAffinity as u32)
    );
    // a removed: b; a pod added under a's address takes a's sessions.
    assert_eq!(kvroute_router_remove_pod(r, a), kvroute_status::Ok);
    let d = route_session(r, Call::Json, "", None, to_a, 3).unwrap();
    assert_eq!((d.pod, d.reason), (b, kvroute_reason::Random as u32));
    let a2 = add(r, "a2", ADDRESSES[0]);
    let d = route_session(r, Call::Tokens, "", None, to_a, 4).unwrap();
    assert_eq!(
        (d.pod, d.reason),
        (a2, kvroute_reason::SessionAffinity as u32)
    );
    // Ids that name no pod are no error: another address, not base64, not UTF-8, empty.
    let pods = [a2, b];
    let bad: [&[u8]; 5] = [
        IDS[2].as_bytes(),
        b"not base64!",
        b"\xff\xfe==",
        b" MTAuMC4wLjE6ODAwMA==",
        b"",
    ];
    for id in bad {
        let d = route_session(r, Call::Keys, "", None, (id.as_ptr(), id.len()), 5).unwrap();
        assert_eq!(d.reason, kvroute_reason::Random as u32, "{id:?}");
        assert_eq!(
            session_of(r, d.ticket).unwrap(),
            [IDS[0], IDS[1]][which(&pods, d.pod)]
        );
    }
    kvroute_router_free(r);
}

#[test]
fn any_spec_with_session_affinity_carries_a_session_id() {
    let r = new_router("prefix-cache");
    let pods = ADDRESSES.map(|a| add(r, a, a));
    // The request's spec, through a call that takes no session id: the chosen pod's id.
    let mut d = kvroute_decision::default();
    let spec = "session-affinity";
    let st = kvroute_router_route(
        r,
        b"m".as_ptr(),
        1,
        b"hi".as_ptr(),
        2,
        spec.as_ptr(),
        spec.len(),
        1,
        &mut d,
    );
    assert_eq!(st, kvroute_status::Ok);
    assert_eq!(session_of(r, d.ticket).unwrap(), IDS[which(&pods, d.pod)]);
    // Weighted: the session's pod scores 1 under session-affinity (weight 2) and wins over
    // least-request (weight 1), though it is the most loaded.
    for now in 2..8 {
        let d = route_session(
            r,
            Call::Bytes,
            "session-affinity:2,least-request",
            None,
            bytes(IDS[2]),
            now,
        )
        .unwrap();
        assert_eq!(
            (d.pod, d.reason),
            (pods[2], kvroute_reason::Weighted as u32)
        );
        assert_eq!(session_of(r, d.ticket).unwrap(), IDS[2]);
    }
    // The configured default, prefix-cache: no session id.
    let d = route(r, b"hi", 9).unwrap();
    assert_eq!(session_of(r, d.ticket).unwrap(), "");
    kvroute_router_free(r);
}

#[test]
fn session_statuses() {
    let r = new_router("session-affinity");
    add(r, "a", ADDRESSES[0]);
    // (NULL, n > 0) is NULL_PARAMETER from every call, which routes nothing.
    for call in CALLS {
        assert_eq!(
            route_session(r, call, "", None, (ptr::null(), 4), 1),
            Err(kvroute_status::NullParameter)
        );
    }
    let mut stats = kvroute_stats::default();
    assert_eq!(kvroute_router_stats(r, &mut stats), kvroute_status::Ok);
    assert_eq!(stats.tickets_issued, 0);
    // The other inputs keep their statuses.
    assert_eq!(
        route_session(r, Call::Bytes, "bogus", None, bytes(IDS[0]), 1),
        Err(kvroute_status::InvalidStrategy)
    );
    let d = route_session(r, Call::Bytes, "", None, bytes(IDS[0]), 1).unwrap();

    // The getter: size query, too small a buffer (untouched), NULL pointers, closed tickets.
    let need = IDS[0].len() + 1;
    let mut n = 0;
    let get = |buf: *mut u8, len, n: *mut usize| {
        status(kvroute_router_session_id(r, d.ticket, buf, len, n))
    };
    assert_eq!(
        get(ptr::null_mut(), 0, &mut n),
        "KVROUTE_STATUS_INSUFFICIENT_SIZE"
    );
    assert_eq!(n, need);
    let mut small = [0xAAu8; 20];
    n = 0;
    assert_eq!(
        get(small.as_mut_ptr(), small.len(), &mut n),
        "KVROUTE_STATUS_INSUFFICIENT_SIZE"
    );
    assert_eq!((n, small), (need, [0xAA; 20]));
    let mut exact = vec![0xAAu8; need];
    assert_eq!(get(exact.as_mut_ptr(), need, &mut n), "KVROUTE_STATUS_OK");
    assert_eq!((n, &exact[..n], exact[n]), (need - 1, IDS[0].as_bytes(), 0));
    assert_eq!(
        get(ptr::null_mut(), 5, &mut n),
        "KVROUTE_STATUS_NULL_PARAMETER"
    );
    assert_eq!(
        get(exact.as_mut_ptr(), need, ptr::null_mut()),
        "KVROUTE_STATUS_NULL_PARAMETER"
    );
    assert_eq!(
        kvroute_router_session_id(ptr::null(), d.ticket, exact.as_mut_ptr(), need, &mut n),
        kvroute_status::NullParameter
    );
    assert_eq!(
        session_of(r, d.ticket + 1),
        Err(kvroute_status::UnknownTicket)
    );
    assert_eq!(
        kvroute_router_complete(r, d.ticket, 0, 2),
        kvroute_status::Ok
    );
    assert_eq!(session_of(r, d.ticket), Err(kvroute_status::UnknownTicket));
    kvroute_router_free(r);
}

#[test]
fn engines_of_a_data_parallel_server_carry_their_rank_and_their_own_session() {
    let r = new_router("session-affinity");
    let server = "10.0.0.9:8000";
    let ranks = [add(r, "dp/dp0", server), add(r, "dp/dp1", server)];
    let whole = add(r, "whole", ADDRESSES[0]);
    for (i, &pod) in ranks.iter().enumerate() {
        assert_eq!(
            kvroute_router_set_pod_data_parallel_rank(r, pod, i as i64),
            kvroute_status::Ok
        );
    }
    // Each pod's session id brings the next requests back to it, with its rank.
    let mut seen = [false; 3];
    for now in 1..60 {
        let d = route_session(r, Call::Bytes, "", None, NONE, now).unwrap();
        let rank = match which(&[ranks[0], ranks[1], whole], d.pod) {
            2 => -1,
            i => i as i64,
        };
        assert_eq!(d.data_parallel_rank, rank);
        seen[(rank + 1) as usize] = true;
        let id = session_of(r, d.ticket).unwrap();
        for _ in 0..2 {
            let again = route_session(r, Call::Json, "", None, bytes(&id), now).unwrap();
            assert_eq!((again.pod, again.data_parallel_rank), (d.pod, rank));
        }
    }
    assert_eq!(seen, [true; 3]);
    // A negative rank makes it a whole server again; a rank past u32 and unknown pods are
    // refused with nothing changed; NULL is NULL.
    let set = |pod, rank| status(kvroute_router_set_pod_data_parallel_rank(r, pod, rank));
    assert_eq!(set(ranks[1], 1 << 32), "KVROUTE_STATUS_INVALID_PARAMETER");
    assert_eq!(set(99, 0), "KVROUTE_STATUS_UNKNOWN_POD");
    assert_eq!(set(ranks[1], -1), "KVROUTE_STATUS_OK");
    let d = (1..200)
        .map(|now| route_session(r, Call::Bytes, "", None, NONE, now).unwrap())
        .find(|d| d.pod == ranks[1])
        .unwrap();
    assert_eq!(d.data_parallel_rank, -1);
    assert_eq!(
        kvroute_router_set_pod_data_parallel_rank(ptr::null_mut(), ranks[0], 0),
        kvroute_status::NullParameter
    );
    kvroute_router_free(r);
}
