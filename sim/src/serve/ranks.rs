//! Data-parallel ranks: N engines behind one HTTP port, as a vLLM started with
//! `--data-parallel-size N` behind one API server runs N engine cores.
//!
//! ## Contract
//! - [`requested_rank`]: a request header `X-data-parallel-rank: R` (any case) pins a
//!   generation request to engine R; a value that is not an integer in `[0, N)` is an
//!   OpenAI-style 400, decided before any engine is touched. Without the header the server
//!   picks the rank.
//! - [`Ranks::submit`] picks as vLLM's internal load balancer does: the engine with the lowest
//!   `waiting * 4 + running` ([`least_loaded`]; ties: the lowest rank), read from the engines
//!   at that instant. Choosing and submitting happen under one lock, so a request just
//!   submitted counts (as waiting) for the next choice: two requests arriving together on idle
//!   ranks go to different ranks.
//! - [`Ranks::reset_prefix_cache`] resets every engine or none (false while a request of any
//!   engine holds cached blocks).
//! - Each engine is its own [`Driver`] (its own KV cache, slots, queue, counters, latencies,
//!   KV-event publisher); [`Ranks::stats`] reads them in rank order.

use std::sync::{Arc, Mutex};

use axum::http::HeaderMap;

use super::driver::{Driver, Subscription};
use super::metrics::EngineStats;
use super::openai::ApiError;
use super::DATA_PARALLEL_RANK_HEADER;
use crate::engine::SubmitError;

/// The largest `--data-parallel-size` the fake server runs.
pub const MAX_DATA_PARALLEL_SIZE: u32 = 64;

/// The engines of one server, rank 0 first.
pub struct Ranks {
    drivers: Vec<Arc<Driver>>,
    // Held while a rank is chosen and the request submitted to it.
    choosing: Mutex<()>,
}

impl Ranks {
    /// The ranks, `drivers[r]` being rank r (at least one).
    pub fn new(drivers: Vec<Arc<Driver>>) -> Ranks {
        assert!(!drivers.is_empty(), "a server has at least one engine");
        Ranks {
            drivers,
            choosing: Mutex::new(()),
        }
    }

    /// How many ranks (the data-parallel size).
    pub fn size(&self) -> usize {
        self.drivers.len()
    }

    /// The engines' drivers, in rank order.
    pub fn drivers(&self) -> &[Arc<Driver>] {
        &self.drivers
    }

    /// Submits a prompt to rank `pinned` (checked by [`requested_rank`]), or, without one, to
    /// the least loaded rank. Returns the rank and what its engine said.
    pub fn submit(
        &self,
        pinned: Option<usize>,
        tokens: &[u32],
        max_tokens: u32,
    ) -> (usize, Result<Subscription, SubmitError>) {
        let _choosing = self.choosing.lock().unwrap_or_else(|e| e.into_inner());
        let rank = match pinned {
            Some(r) => r.min(self.drivers.len() - 1),
            None => least_loaded(self.drivers.iter().map(|d| d.load())),
        };
        (rank, self.drivers[rank].submit(tokens, max_tokens))
    }

    /// Resets every engine's prefix cache, or none (false) while requests hold cached blocks.
    pub fn reset_prefix_cache(&self) -> bool {
        let drivers: Vec<&Driver> = self.drivers.iter().map(|d| &**d).collect();
        Driver::reset_prefix_caches(&drivers)
    }

    /// Each engine's `/metrics` numbers, in rank order.
    pub fn stats(&self) -> Vec<EngineStats> {
        self.drivers.iter().map(|d| d.stats()).collect()
    }
}

/// vLLM's data-parallel load balancing over `(waiting, running)` per rank: the rank with the
/// lowest `waiting * 4 + running`, the lowest rank on ties (0 for none).
pub fn least_loaded(loads: impl IntoIterator<Item = (u32, u32)>) -> usize {
    loads
        .into_iter()
        .map(|(waiting, running)| u64::from(waiting) * 4 + u64::from(running))
        .enumerate()
        .min_by_key(|&(rank, score)| (score, rank))
        .map_or(0, |(rank, _)| rank)
}

/// The rank `X-data-parallel-rank` pins the request to (`None` without the header), or an
/// OpenAI-style 400 if it is not an integer in `[0, size)`.
pub fn requested_rank(headers: &HeaderMap, size: usize) -> Result<Option<usize>, ApiError> {
    let Some(value) = headers.get(DATA_PARALLEL_RANK_HEADER) else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or("").trim();
    match text.parse::<usize>() {
        Ok(rank) if rank < size => Ok(Some(rank)),
        _ => Err(ApiError::bad_request(format!(
            "X-data-parallel-rank must be an integer in [0, {size}) (the server's \
             --data-parallel-size is {size}), got {:?}",
            String::from_utf8_lossy(value.as_bytes())
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn least_loaded_weighs_waiting_four_times_and_prefers_low_ranks() {
        assert_eq!(least_loaded([]), 0);
        assert_eq!(least_loaded([(0, 0), (0, 0)]), 0);
        assert_eq!(least_loaded([(1, 0), (0, 0)]), 1);
        // 1 waiting (4) loses to 3 running (3); 4 running ties with 1 waiting: the lower rank.
        assert_eq!(least_loaded([(1, 0), (0, 3)]), 1);
        assert_eq!(least_loaded([(1, 0), (0, 4)]), 0);
        assert_eq!(least_loaded([(0, 5), (1, 2), (0, 5)]), 0);
        assert_eq!(least_loaded([(2, 0), (0, 9), (1, 3)]), 2);
        assert_eq!(least_loaded([(u32::MAX, 0), (0, u32::MAX)]), 1);
    }

    #[test]
    fn the_rank_header_must_name_an_engine() {
        let with = |v: &[u8]| {
            let mut h = HeaderMap::new();
            h.insert("X-Data-Parallel-Rank", HeaderValue::from_bytes(v).unwrap());
            requested_rank(&h, 2)
        };
        assert_eq!(requested_rank(&HeaderMap::new(), 2).unwrap(), None);
        assert_eq!(with(b"0").unwrap(), Some(0));
        assert_eq!(with(b" 1 ").unwrap(), Some(1));
        for bad in [&b"2"[..], b"x", b"-1", b"", b"1.0", b"\xff"] {
            let e = with(bad).unwrap_err();
            assert_eq!(e.status, 400);
            assert!(e.message.contains("[0, 2)"), "{}", e.message);
        }
    }
}
