//! Publishes the engine's KV-cache events as a vLLM started with `--kv-events-config` does: one
//! msgpack `KVEventBatch` per engine step on a ZMQ PUB socket, with an optional replay ROUTER
//! socket (see [`kvroute_kv_events::transport`]).
//!
//! ## Contract
//! - The driver hands over each step's [`BlockEvent`]s (and those of a prime or a prefix-cache
//!   reset) through a [`KvSink`], which never blocks: the channel is unbounded, so publishing
//!   can never stall the engine.
//! - A task turns each hand-over into ONE [`EventBatch`] ([`to_batch`]), stamped with the unix
//!   time of the hand-over, and publishes it in the configured [`Layout`] with the next seq
//!   (from 0). Hand-overs are published in the order they were made, and the events of one in
//!   their recorded order.
//! - A publish error is reported on stderr once (the first); later batches are still tried.
//!   Nothing here panics.
//! - Data parallelism: each rank has its own publisher, sockets and seqs (from 0), and stamps
//!   its batches `data_parallel_rank: R` (0 for a lone engine, as vLLM's publisher stamps its
//!   rank). Rank R binds the configured endpoints offset as vLLM offsets them
//!   ([`KvEventsConfig::for_rank`]), except that port 0 stays 0 (each rank a free port of its
//!   own) where vLLM would offset it.

use std::time::{SystemTime, UNIX_EPOCH};

use kvroute_kv_events::transport::{
    offset_endpoint_port, Publisher, PublisherConfig, TransportError,
};
use kvroute_kv_events::wire::{BlockHash, BlockRemoved, BlockStored, EventBatch, KvEvent, Layout};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::engine::BlockEvent;

/// The medium every event names: the simulated engine has one KV cache, on the "GPU".
pub const MEDIUM: &str = "GPU";

/// Where and how `kvroute-sim serve` publishes KV-cache events (`--kv-events-*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvEventsConfig {
    /// The PUB socket's bind address, e.g. `tcp://127.0.0.1:5557` (port 0: any free port;
    /// host `*`: every interface, as in ZMQ).
    pub endpoint: String,
    /// The replay ROUTER socket's bind address, if any (same forms).
    pub replay_endpoint: Option<String>,
    /// The topic frame of every message (vLLM's default: empty).
    pub topic: String,
    /// How batches are encoded (current vLLM: [`Layout::Map`]).
    pub layout: Layout,
}

impl KvEventsConfig {
    /// Publishing on `endpoint`, no replay socket, empty topic, [`Layout::Map`].
    pub fn new(endpoint: impl Into<String>) -> Self {
        KvEventsConfig {
            endpoint: endpoint.into(),
            replay_endpoint: None,
            topic: String::new(),
            layout: Layout::Map,
        }
    }

    /// What data-parallel rank `rank` binds: both endpoints with their port offset by `rank`
    /// (vLLM's `offset_endpoint_port`: `tcp://*:5557` is `tcp://*:5558` for rank 1), except a
    /// port 0, which every rank binds as 0 (each gets a free port of its own; vLLM would bind
    /// port `rank`). Rank 0 binds the endpoints as given. An endpoint that cannot be offset
    /// (not tcp or inproc, or past port 65535) is an error.
    pub fn for_rank(&self, rank: u32) -> Result<KvEventsConfig, TransportError> {
        let offset = |endpoint: &str| {
            if port_is_zero(endpoint) {
                Ok(endpoint.to_owned())
            } else {
                offset_endpoint_port(endpoint, rank)
            }
        };
        Ok(KvEventsConfig {
            endpoint: offset(&self.endpoint)?,
            replay_endpoint: self.replay_endpoint.as_deref().map(offset).transpose()?,
            ..self.clone()
        })
    }
}

/// Whether a tcp endpoint asks for port 0 (any free port).
fn port_is_zero(endpoint: &str) -> bool {
    endpoint.starts_with("tcp://") && endpoint.rsplit_once(':').is_some_and(|(_, p)| p == "0")
}

/// The `--kv-events-layout` values: `positional`, `map` and `map-batch` (`map_batch` too).
pub fn parse_layout(s: &str) -> Option<Layout> {
    match s {
        "positional" => Some(Layout::Positional),
        "map" => Some(Layout::Map),
        "map-batch" | "map_batch" => Some(Layout::MapBatch),
        _ => None,
    }
}

/// ZMQ's `tcp://*:PORT` (every interface) as the socket library binds it: `tcp://0.0.0.0:PORT`.
/// Other endpoints are returned as they are.
fn bind_address(endpoint: &str) -> String {
    match endpoint.strip_prefix("tcp://*:") {
        Some(port) => format!("tcp://0.0.0.0:{port}"),
        None => endpoint.to_owned(),
    }
}

/// One hand-over from the driver: the events drained at `ts` (unix seconds).
#[derive(Debug)]
struct Drained {
    ts: f64,
    events: Vec<BlockEvent>,
}

/// The driver's end of the publisher: hands drained events to the publisher task without
/// blocking.
#[derive(Clone, Debug)]
pub struct KvSink {
    tx: mpsc::UnboundedSender<Drained>,
}

impl KvSink {
    /// Queues `events` (one engine step's, in order) for publishing as one batch, stamped now.
    /// Returns false if the publisher is gone (the events are dropped).
    pub fn send(&self, events: Vec<BlockEvent>) -> bool {
        self.tx
            .send(Drained {
                ts: unix_seconds(),
                events,
            })
            .is_ok()
    }
}

fn unix_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// One step's events as vLLM batches them: consecutive `Stored` blocks that chain (each one's
/// parent is the previous one's hash) become one `BlockStored` (the first one's parent, all
/// their tokens, `block_size`, medium `GPU`); consecutive `Removed` blocks one `BlockRemoved`
/// (medium `GPU`); `Cleared` an `AllBlocksCleared`. The order of the events is kept. Hashes are
/// published as ints (vLLM's default); `data_parallel_rank` is `rank`, as vLLM's publisher
/// stamps its rank (0 for a single-rank vLLM).
pub fn to_batch(ts: f64, events: &[BlockEvent], block_size: u32, rank: u32) -> EventBatch {
    let mut out: Vec<KvEvent> = Vec::new();
    for ev in events {
        match ev {
            BlockEvent::Stored {
                hash,
                parent,
                tokens,
            } => {
                if let Some(KvEvent::BlockStored(s)) = out.last_mut() {
                    let chains =
                        parent.is_some() && s.block_hashes.last().map(BlockHash::fold) == *parent;
                    if chains {
                        s.block_hashes.push(BlockHash::Int(*hash));
                        s.token_ids.extend_from_slice(tokens);
                        continue;
                    }
                }
                out.push(KvEvent::BlockStored(BlockStored {
                    block_hashes: vec![BlockHash::Int(*hash)],
                    parent_block_hash: parent.map(BlockHash::Int),
                    token_ids: tokens.clone(),
                    block_size,
                    medium: Some(MEDIUM.to_owned()),
                    ..BlockStored::default()
                }));
            }
            BlockEvent::Removed { hash } => {
                if let Some(KvEvent::BlockRemoved(r)) = out.last_mut() {
                    r.block_hashes.push(BlockHash::Int(*hash));
                    continue;
                }
                out.push(KvEvent::BlockRemoved(BlockRemoved {
                    block_hashes: vec![BlockHash::Int(*hash)],
                    medium: Some(MEDIUM.to_owned()),
                    group_idx: None,
                }));
            }
            BlockEvent::Cleared => out.push(KvEvent::AllBlocksCleared),
        }
    }
    let mut batch = EventBatch::new(ts, out);
    batch.data_parallel_rank = Some(rank);
    batch
}

/// A running publisher: its bound endpoints and its task. Dropping it stops the task (and with
/// it the sockets).
#[derive(Debug)]
pub struct KvPublisher {
    rank: u32,
    endpoint: String,
    replay_endpoint: Option<String>,
    task: JoinHandle<()>,
}

impl Drop for KvPublisher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl KvPublisher {
    /// Binds the sockets of `config` (as given: see [`KvEventsConfig::for_rank`] for a rank's)
    /// and starts the publishing task (inside a tokio runtime). Returns the publisher and the
    /// sink the driver sends each step's events to; batches name `block_size` as their blocks'
    /// size and `rank` as their `data_parallel_rank`.
    pub async fn start(
        config: &KvEventsConfig,
        block_size: u32,
        rank: u32,
    ) -> Result<(KvPublisher, KvSink), TransportError> {
        let publisher = Publisher::bind(PublisherConfig {
            replay_endpoint: config.replay_endpoint.as_deref().map(bind_address),
            topic: config.topic.clone(),
            ..PublisherConfig::new(bind_address(&config.endpoint))
        })
        .await?;
        let endpoint = publisher.endpoint().to_owned();
        let replay_endpoint = publisher.replay_endpoint().map(str::to_owned);
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(publish_steps(
            publisher,
            rx,
            config.layout,
            block_size,
            rank,
        ));
        Ok((
            KvPublisher {
                rank,
                endpoint,
                replay_endpoint,
                task,
            },
            KvSink { tx },
        ))
    }

    /// The data-parallel rank whose events this publishes.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// The PUB endpoint as bound (port 0 resolved), e.g. `tcp://127.0.0.1:40123`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The replay ROUTER endpoint as bound, if any.
    pub fn replay_endpoint(&self) -> Option<&str> {
        self.replay_endpoint.as_deref()
    }
}

/// Publishes every hand-over as one batch until every sink is dropped.
async fn publish_steps(
    mut publisher: Publisher,
    mut rx: mpsc::UnboundedReceiver<Drained>,
    layout: Layout,
    block_size: u32,
    rank: u32,
) {
    let mut reported = false;
    while let Some(step) = rx.recv().await {
        let batch = to_batch(step.ts, &step.events, block_size, rank);
        if let Err(e) = publisher.publish_batch(&batch, layout).await {
            if !reported {
                reported = true;
                eprintln!(
                    "kvroute-sim: cannot publish KV events on {}: {e} (later errors are not reported)",
                    publisher.endpoint()
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(hash: u64, parent: Option<u64>, t: u32) -> BlockEvent {
        BlockEvent::Stored {
            hash,
            parent,
            tokens: vec![t, t + 1],
        }
    }

    #[test]
    fn chains_merge_and_order_is_kept() {
        let events = [
            stored(1, None, 10),
            stored(2, Some(1), 20),
            stored(3, Some(2), 30),
            // Does not chain onto 3: a new BlockStored.
            stored(7, Some(5), 40),
            BlockEvent::Removed { hash: 1 },
            BlockEvent::Removed { hash: 2 },
            stored(8, None, 50),
            BlockEvent::Removed { hash: 8 },
            BlockEvent::Cleared,
            BlockEvent::Removed { hash: 9 },
        ];
        let b = to_batch(1.5, &events, 2, 0);
        assert_eq!(b.ts, 1.5);
        assert_eq!(b.data_parallel_rank, Some(0));
        let tags: Vec<&str> = b.events.iter().map(KvEvent::tag).collect();
        assert_eq!(
            tags,
            [
                "BlockStored",
                "BlockStored",
                "BlockRemoved",
                "BlockStored",
                "BlockRemoved",
                "AllBlocksCleared",
                "BlockRemoved"
            ]
        );
        let KvEvent::BlockStored(s) = &b.events[0] else {
            unreachable!()
        };
        assert_eq!(s.block_hashes, [1u64.into(), 2u64.into(), 3u64.into()]);
        assert_eq!(s.parent_block_hash, None);
        assert_eq!(s.token_ids, [10, 11, 20, 21, 30, 31]);
        assert_eq!((s.block_size, s.medium.as_deref()), (2, Some("GPU")));
        let KvEvent::BlockStored(s) = &b.events[1] else {
            unreachable!()
        };
        assert_eq!(s.parent_block_hash, Some(5u64.into()));
        let KvEvent::BlockRemoved(r) = &b.events[2] else {
            unreachable!()
        };
        assert_eq!(r.block_hashes, [1u64.into(), 2u64.into()]);
        assert_eq!(r.medium.as_deref(), Some("GPU"));
        assert!(to_batch(0.0, &[], 2, 0).events.is_empty());
        assert_eq!(to_batch(0.0, &[], 2, 3).data_parallel_rank, Some(3));
    }

    #[test]
    fn layouts_and_bind_addresses() {
        assert_eq!(parse_layout("positional"), Some(Layout::Positional));
        assert_eq!(parse_layout("map"), Some(Layout::Map));
        assert_eq!(parse_layout("map-batch"), Some(Layout::MapBatch));
        assert_eq!(parse_layout("json"), None);
        assert_eq!(bind_address("tcp://*:5557"), "tcp://0.0.0.0:5557");
        assert_eq!(bind_address("tcp://127.0.0.1:0"), "tcp://127.0.0.1:0");
    }

    #[test]
    fn ranks_offset_ports_but_port_zero() {
        let mut kv = KvEventsConfig::new("tcp://*:5557");
        kv.replay_endpoint = Some("tcp://127.0.0.1:0".into());
        kv.topic = "t".into();
        let r0 = kv.for_rank(0).unwrap();
        assert_eq!(r0, kv);
        let r2 = kv.for_rank(2).unwrap();
        assert_eq!(r2.endpoint, "tcp://*:5559");
        assert_eq!(r2.replay_endpoint.as_deref(), Some("tcp://127.0.0.1:0"));
        assert_eq!((r2.topic.as_str(), r2.layout), ("t", kv.layout));
        assert!(KvEventsConfig::new("tcp://*:65535").for_rank(1).is_err());
        assert!(KvEventsConfig::new("ipc:///tmp/kv").for_rank(1).is_err());
        assert!(port_is_zero("tcp://*:0") && !port_is_zero("tcp://*:10"));
    }
}
