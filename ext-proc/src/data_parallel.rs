//! Data-parallel servers: a vLLM started with `--data-parallel-size N` runs N engines (ranks),
//! each with its own KV cache, queue and slots, behind one HTTP address. Routing to the
//! address alone lets vLLM's own balancer pick a rank by queue length, which scatters a
//! prefix's requests over ranks that do not share a cache. kvroute routes to the rank instead.
//!
//! ## Contract
//! - A static pod with `data_parallel_size = N` (N > 1), or a discovered pod labelled
//!   `kvroute.io/data-parallel-size: "N"` (discovery's `pods::DATA_PARALLEL_LABEL`),
//!   is N pods of the router, named `NAME/dp0` … `NAME/dp{N-1}` ([`rank_name`]) at the pod's
//!   address, each with its own in-flight count, prefix index entries, TTFT model and
//!   KV-event view ([`kvroute_core::Router::set_pod_data_parallel_rank`]). `1` (the default)
//!   is the pod as before.
//! - A request routed to a rank carries [`RANK_HEADER`] upstream (vLLM's
//!   `X-data-parallel-rank`: the API server hands the request to that engine); `target-pod`
//!   and the decision name the rank's pod.
//! - Engine metrics: one scrape of the address serves every rank; each rank reads the series
//!   labelled `engine="R"` (vLLM labels each engine's series so; `scrape::parse_engine`).
//! - KV events: rank R's publisher is the pod's endpoint with its port offset by R, and so
//!   is its replay endpoint ([`offset_port`], vLLM's `offset_endpoint_port`).
//! - Envoy's hosts (`[discovery] source = "envoy"`) are whole servers.
//!
//! This module is a leaf: the configuration, discovery, scraping and the KV-event subscriber
//! call it; it calls none of them.

use std::collections::BTreeMap;

/// The upstream request header naming the engine (vLLM reads it case-insensitively).
pub const RANK_HEADER: &str = "x-data-parallel-rank";
/// The largest `data_parallel_size` accepted.
pub const MAX_SIZE: u32 = 1024;

/// The router's name of engine `rank` of the server `name`.
pub fn rank_name(name: &str, rank: u32) -> String {
    format!("{name}/dp{rank}")
}

/// The server's name of the router pod `name` that is engine `rank` (the name itself when it
/// has no rank).
pub fn server_name(name: &str, rank: Option<u32>) -> &str {
    let Some(rank) = rank else { return name };
    name.strip_suffix(&*format!("/dp{rank}")).unwrap_or(name)
}

/// The router pods of a server `name` with `size` engines: `(name, None)` for a size of 1 (or
/// 0), else one `(NAME/dpR, Some(R))` per rank.
pub fn engines(name: &str, size: u32) -> Vec<(String, Option<u32>)> {
    if size <= 1 {
        return vec![(name.to_owned(), None)];
    }
    (0..size).map(|r| (rank_name(name, r), Some(r))).collect()
}

/// `endpoint` (`tcp://HOST:PORT`) with its port offset by `rank`, as each rank of a vLLM
/// data-parallel server binds its KV-event sockets; `None` when the endpoint has no numeric
/// port or the port would pass 65535.
pub fn offset_port(endpoint: &str, rank: u32) -> Option<String> {
    if rank == 0 {
        return Some(endpoint.to_owned());
    }
    let (base, port) = endpoint.rsplit_once(':')?;
    let port = port.parse::<u16>().ok()?;
    let shifted = u16::try_from(u32::from(port) + rank).ok()?;
    Some(format!("{base}:{shifted}"))
}

/// Checks the static pods' `data_parallel_size`, given as `(model, pod, size)`: 1 to
/// [`MAX_SIZE`], the same for a pod listed under several models, and no rank's name taken by
/// another pod.
pub fn validate<'a>(
    pods: impl IntoIterator<Item = (&'a str, &'a str, Option<u32>)>,
) -> Result<(), String> {
    let mut sizes: BTreeMap<&str, u32> = BTreeMap::new();
    for (model, pod, size) in pods {
        let size = size.unwrap_or(1);
        if !(1..=MAX_SIZE).contains(&size) {
            return Err(format!(
                "model {model:?}: pod {pod:?} data_parallel_size must be 1 to {MAX_SIZE}"
            ));
        }
        if let Some(prev) = sizes.insert(pod, size) {
            if prev != size {
                return Err(format!(
                    "pod {pod:?} has two data_parallel_size ({prev} and {size})"
                ));
            }
        }
    }
    for (name, size) in sizes.iter().filter(|(_, size)| **size > 1) {
        for rank in 0..*size {
            let rank_pod = rank_name(name, rank);
            if sizes.contains_key(rank_pod.as_str()) {
                return Err(format!(
                    "pod {rank_pod:?} has the name of rank {rank} of pod {name:?} (data_parallel_size {size})"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_are_named_and_ports_offset_as_vllm_does() {
        assert_eq!(engines("a", 1), [("a".to_owned(), None)]);
        assert_eq!(
            engines("a", 3),
            [
                ("a/dp0".to_owned(), Some(0)),
                ("a/dp1".to_owned(), Some(1)),
                ("a/dp2".to_owned(), Some(2))
            ]
        );
        assert_eq!(server_name("a/dp2", Some(2)), "a");
        assert_eq!(server_name("a/dp2", None), "a/dp2");
        assert_eq!(server_name("a", Some(1)), "a");
        assert_eq!(
            offset_port("tcp://10.0.0.1:5557", 2).as_deref(),
            Some("tcp://10.0.0.1:5559")
        );
        assert_eq!(
            offset_port("tcp://[::1]:5557", 1).as_deref(),
            Some("tcp://[::1]:5558")
        );
        assert_eq!(
            offset_port("tcp://h:5557", 0).as_deref(),
            Some("tcp://h:5557")
        );
        assert_eq!(offset_port("tcp://h:65535", 1), None);
        assert_eq!(offset_port("tcp://h", 1), None);
        assert_eq!(offset_port("tcp://h:x", 1), None);
    }

    #[test]
    fn sizes_are_checked() {
        let a = |size| ("m", "a", size);
        let b = ("m", "b", None);
        for (bad, why) in [
            (vec![a(Some(0)), b], "data_parallel_size must be 1 to 1024"),
            (
                vec![a(Some(1025)), b],
                "data_parallel_size must be 1 to 1024",
            ),
            (
                vec![a(Some(2)), ("n", "a", Some(3))],
                "pod \"a\" has two data_parallel_size (2 and 3)",
            ),
            (
                vec![a(Some(2)), ("n", "a/dp1", None)],
                "pod \"a/dp1\" has the name of rank 1 of pod \"a\"",
            ),
        ] {
            let e = validate(bad.clone()).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        assert_eq!(validate([a(Some(1024)), b, ("n", "a", Some(1024))]), Ok(()));
    }
}
