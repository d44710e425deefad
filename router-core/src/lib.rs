//! # kvroute-core
//!
//! The routing engine of kvroute: a prefix hash index, a pod registry, in-flight tickets and
//! the selection strategies (AIBrix v0.7.0's `random`, `least-request`, `prefix-cache`,
//! `least-kv-cache`, `least-gpu-cache`, `least-busy-time`, `least-latency`, `throughput`,
//! `least-utilization`, `power-of-two` and `session-affinity`, kvroute's `least-ttft`, and
//! weighted mixes of them; AIBrix's other names are [`StrategyError::Unsupported`]), as a plain
//! data structure.
//!
//! ## Contract
//! - **Deterministic.** The same [`RouterConfig`] (including its `seed`) and the same sequence
//!   of calls give the same decisions, on every platform.
//! - **No IO.** No sockets, files, environment, clock reads, threads, sleeps, global state or
//!   async runtime. Time comes in as a caller-supplied monotonic [`Timestamp`] in milliseconds;
//!   randomness from a PRNG seeded by [`RouterConfig::seed`]. `router-core/clippy.toml` and the
//!   `no_io_dependencies` test hold this line mechanically.
//! - **Single owner.** Every change is one `&mut self` call. Shells put the [`Router`] behind a
//!   lock, hash prompts *outside* it with [`Router::hash_config`], and hold it only for
//!   [`Router::route`] / [`Router::complete`].
//! - **Timers are pulled.** [`Router::poll_timeout`] says when [`Router::handle_timeout`] has
//!   work (index TTL, ticket TTL); the shell calls it then.
//! - **Exactly once.** [`Router::route`] increments the chosen pod's in-flight count and issues
//!   a [`Ticket`]; [`Router::complete`] releases it once. Double, late or unknown completions
//!   are [`TicketError`]s, never a negative count.
//! - **Admission is opt-in.** [`Router::admit`] queues or sheds a request when no pod is
//!   predicted to meet its model's TTFT target ([`Router::set_admission`]; see [`admission`]);
//!   without a policy it is [`Router::route`].
//! - **No panics on input.** Bad input is a typed error ([`RouteError`], [`RegistryError`],
//!   [`TicketError`], [`StrategyError`], [`ConfigError`]).
//!
//! ## Example
//! ```
//! use kvroute_core::{Completion, Outcome, PodSpec, RouteRequest, Router, RouterConfig, Timestamp};
//!
//! let mut router = Router::new(RouterConfig { seed: 7, ..Default::default() }).unwrap();
//! router.add_pod("llama", PodSpec { name: "vllm-a", address: "10.0.0.1:8000", ready: true }).unwrap();
//! router.add_pod("llama", PodSpec { name: "vllm-b", address: "10.0.0.2:8000", ready: true }).unwrap();
//!
//! let hashes = router.hash_config().hashes("a long shared system prompt ... ".repeat(20).as_bytes());
//! let now = Timestamp::from_millis(1_000);
//! let first = router.route(RouteRequest::new("llama", &hashes), now).unwrap();
//! let again = router.route(RouteRequest::new("llama", &hashes), now).unwrap();
//! assert_eq!(first.pod, again.pod); // the prefix is indexed under the first pod
//! assert_eq!(again.match_percent, 100);
//! let line = again.to_string(); // "strategy=prefix-cache reason=prefix_match pod=... match=100% ..."
//! assert!(line.contains("reason=prefix_match"));
//!
//! router.complete(first.ticket, Completion::new(Outcome::Success), now).unwrap();
//! router.complete(again.ticket, Outcome::Cancelled.into(), now).unwrap();
//! assert!(router.complete(again.ticket, Outcome::Success.into(), now).is_err());
//! ```
//!
//! ## Deliberate differences from AIBrix v0.7.0
//! - A pod update keeps its in-flight count (AIBrix resets it).
//! - Selection and increment are one call (AIBrix issue #2422).
//! - The index is written for every routed prompt, whatever the strategy, and also when only
//!   one pod is ready (AIBrix skips the router then).
//! - Each pod's index entry expires on its own TTL (AIBrix keeps stale per-pod entries alive
//!   while any pod refreshes the block).
//! - Ticket TTL: a lost completion cannot pin a slot forever.
//! - A prompt's blocks are written last block first, so its leading blocks (which every
//!   contiguous match needs) are the last the capacity LRU evicts.
//! - The AIBrix metric strategies read what kvroute has of AIBrix's metrics, skip snapshots
//!   older than [`TtftConfig::snapshot_max_age_ms`] (AIBrix uses a pod's last value however
//!   old), and fix the reads that made several of them random in AIBrix (each [`Strategy`]
//!   variant says how). `power-of-two` needs no Redis; `session-affinity` sets the session id
//!   also when only one pod is ready. In a multi-strategy spec, entries of weight 0 are
//!   dropped before their names are looked up, as in AIBrix.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod admission;
#[cfg(feature = "json")]
pub mod body;
mod busy;
mod config;
mod decision;
mod engine_view;
mod hash;
mod health;
mod ids;
mod index;
mod registry;
mod router;
mod select;
mod stats;
mod strategy;
mod tickets;
mod time;
mod token_keys;
mod ttft;

pub use admission::{
    AdmissionPolicy, AdmissionPolicyError, AdmissionStats, Admitted, Priority, QueueId, Shed,
    ShedReason,
};
pub use config::{
    ConfigError, RouterConfig, DEFAULT_ENGINE_VIEW_PENDING_MS, DEFAULT_IMBALANCE_ABS_COUNT,
    DEFAULT_INDEX_CAPACITY, DEFAULT_INDEX_TTL_MS, DEFAULT_STDDEV_FACTOR, DEFAULT_TICKET_TTL_MS,
};
pub use decision::{Decision, LoadSnapshot, MatchView, Prediction, Reason};
pub use engine_view::{
    BatchCounts, EngineBlockHash, KvApplied, KvEvent, KvSource, Medium, StoredBlocks, ViewStats,
};
pub use hash::{BlockHash, HashConfig, InvalidBlockSize, DEFAULT_BLOCK_SIZE, MAX_BLOCK_SIZE};
pub use health::{
    EjectionReason, HealthConfig, HealthEvent, PodHealth, Readmission, DEFAULT_BASE_EJECTION_MS,
    DEFAULT_CONSECUTIVE_5XX, DEFAULT_CONSECUTIVE_GATEWAY_FAILURES, DEFAULT_HEALTHY_THRESHOLD,
    DEFAULT_MAX_EJECTION_MS, DEFAULT_MAX_EJECTION_PERCENT, DEFAULT_UNHEALTHY_THRESHOLD,
};
pub use ids::{ModelId, PodId, Ticket};
pub use index::{IndexStats, PrefixIndex};
pub use registry::{PodInfo, PodSpec, RegistryError};
pub use router::{PromptTokens, RouteError, RouteRequest, Router};
pub use stats::{match_bucket, ModelStats, RouterStats, MATCH_BUCKETS};
pub use strategy::{Strategy, StrategyError, StrategySpec, MAX_WEIGHT};
pub use tickets::{Completion, Outcome, Released, TicketError, TicketStats, Timings};
pub use time::Timestamp;
pub use token_keys::{
    BlockExtras, InvalidBlockTokens, TokenKeyConfig, DEFAULT_BLOCK_TOKENS, MAX_BLOCK_TOKENS,
};
pub use ttft::{EngineSnapshot, TtftCalibration, TtftConfig, TtftErrors, TtftSettingError};
