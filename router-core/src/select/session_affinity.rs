//! `session-affinity` (AIBrix v0.7.0 `simple_session_affinity.go`). The session id is
//! stateless: the standard (padded) base64 of the pod's `ip:port` (for an engine of a
//! data-parallel server, [`crate::Router::set_pod_data_parallel_rank`], of `ip:port/dpR`:
//! its ranks share the address; kvroute's addition). A request whose
//! `x-session-id` decodes to the address of a candidate goes there; one without a session id,
//! with one that does not decode, or with one naming no candidate (the pod is gone, unready or
//! ejected) goes to a uniformly random candidate. Either way the response carries the chosen
//! pod's session id, so the client sticks to it from then on. In a weighted spec the pod the
//! session names scores 1 and the others 0 (higher is better), and the response carries the
//! session id of the pod the mix chose.
//!
//! Difference: AIBrix does not run its router when only one pod is ready, so such responses
//! carry no session id; kvroute always sets it.

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::DecodePaddingMode;
use base64::Engine;

/// Go's `base64.StdEncoding` when decoding: padding required, unused trailing bits not
/// checked.
const GO_STD: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::RequireCanonical)
        .with_decode_allow_trailing_bits(true),
);

/// The session id of the pod at `address` (engine `rank` of a data-parallel server).
pub(crate) fn encode(address: &str, rank: Option<u32>) -> String {
    match rank {
        None => STANDARD.encode(address),
        Some(r) => STANDARD.encode(format!("{address}/dp{r}")),
    }
}

/// The bytes a session id encodes, decoded as Go's `base64.StdEncoding.DecodeString` does
/// (padding required, `\r` and `\n` ignored, unused trailing bits not checked); `None` if it
/// is not base64.
pub(crate) fn decode(session_id: &str) -> Option<Vec<u8>> {
    let chars: Vec<u8> = session_id
        .bytes()
        .filter(|&c| c != b'\r' && c != b'\n')
        .collect();
    GO_STD.decode(chars).ok()
}

/// The index of the `(address, rank)` `session_id` names among `pods`, if any.
pub(crate) fn target<'a>(
    session_id: Option<&str>,
    pods: impl IntoIterator<Item = (&'a str, Option<u32>)>,
) -> Option<usize> {
    let wanted = decode(session_id.filter(|s| !s.is_empty())?)?;
    pods.into_iter().position(|(address, rank)| {
        let Some(rest) = wanted.strip_prefix(address.as_bytes()) else {
            return false;
        };
        match rank {
            None => rest.is_empty(),
            Some(r) => rest
                .strip_prefix(b"/dp")
                .and_then(|n| std::str::from_utf8(n).ok())
                .is_some_and(|n| n == r.to_string()),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_matches_go() {
        // Go: base64.StdEncoding.EncodeToString([]byte("10.0.0.1:8000")).
        assert_eq!(encode("10.0.0.1:8000", None), "MTAuMC4wLjE6ODAwMA==");
        assert_eq!(encode("[::1]:8000", None), "Wzo6MV06ODAwMA==");
        assert_eq!(encode("1.2.3.4:80", None), "MS4yLjMuNDo4MA==");
        for a in ["", "a", "ab", "abc", "abcd", "10.1.2.3:65535"] {
            assert_eq!(decode(&encode(a, None)).unwrap(), a.as_bytes(), "{a:?}");
        }
        assert_eq!(
            decode(&encode("10.0.0.1:8000", Some(3))).unwrap(),
            b"10.0.0.1:8000/dp3"
        );
    }

    #[test]
    fn decoding_is_go_std_encoding() {
        assert_eq!(
            decode("MTAuMC4wLjE6ODAwMA=="),
            Some(b"10.0.0.1:8000".to_vec())
        );
        // Line breaks are ignored; unused trailing bits are not checked.
        assert_eq!(
            decode("MTAuMC4w\r\nLjE6ODAwMA=="),
            Some(b"10.0.0.1:8000".to_vec())
        );
        assert_eq!(
            decode("MTAuMC4wLjE6ODAwMB=="),
            Some(b"10.0.0.1:8000".to_vec())
        );
        // Missing padding, padding inside, other alphabets: not base64.
        for bad in [
            "MTAuMC4wLjE6ODAwMA",
            "MTA=uMC4",
            "MTAuMC4wLjE6ODAwMA=",
            "MT-_",
            "====",
        ] {
            assert_eq!(decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_session_names_a_candidate_or_none() {
        let addrs = [("10.0.0.1:8000", None), ("10.0.0.2:8000", None)];
        let id = encode("10.0.0.2:8000", None);
        assert_eq!(target(Some(&id), addrs), Some(1));
        assert_eq!(target(Some(&encode("10.0.0.9:8000", None)), addrs), None);
        assert_eq!(target(Some("not base64!"), addrs), None);
        assert_eq!(target(Some(""), addrs), None);
        assert_eq!(target(None, addrs), None);
    }

    #[test]
    fn a_data_parallel_session_names_its_rank() {
        let ranks = [
            ("10.0.0.1:8000", Some(0)),
            ("10.0.0.1:8000", Some(1)),
            ("10.0.0.1:8000", Some(10)),
        ];
        for (i, r) in [0, 1, 10].into_iter().enumerate() {
            assert_eq!(
                target(Some(&encode("10.0.0.1:8000", Some(r))), ranks),
                Some(i)
            );
        }
        // The plain address, another rank, a prefix of a rank: none.
        for other in [
            "10.0.0.1:8000",
            "10.0.0.1:8000/dp2",
            "10.0.0.1:8000/dp",
            "10.0.0.1:8000/dp01",
        ] {
            let id = STANDARD.encode(other);
            assert_eq!(target(Some(&id), ranks), None, "{other}");
        }
        // A rank's session does not name the plain pod at that address.
        let plain = [("10.0.0.1:8000", None)];
        assert_eq!(target(Some(&encode("10.0.0.1:8000", Some(1))), plain), None);
    }
}
