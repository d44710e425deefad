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

use std::time::{SystemTime, UNIX_EPOCH};

use kvroute_kv_events::transport::{Publisher, PublisherConfig, TransportError};
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
/// published as ints (vLLM's default); `data_parallel_rank` is 0, as a single-rank vLLM sets it.
pub fn to_batch(ts: f64, events: &[BlockEvent], block_size: u32) -> EventBatch {
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
    batch.data_parallel_rank = Some(0);
    batch
}

/// A running publisher: its bound endpoints and its task. Dropping it stops the task (and with
/// it the sockets).
#[derive(Debug)]
pub struct KvPublisher {
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
    /// Binds the sockets of `config` and starts the publishing task (inside a tokio runtime).
    /// Returns the publisher and the sink the driver sends each step's events to; batches name
    /// `block_size` as their blocks' size.
    pub async fn start(
        config: &KvEventsConfig,
        block_size: u32,
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
        let task = tokio::spawn(publish_steps(publisher, rx, config.layout, block_size));
        Ok((
            KvPublisher {
                endpoint,
                replay_endpoint,
                task,
            },
            KvSink { tx },
        ))
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
) {
    let mut reported = false;
    while let Some(step) = rx.recv().await {
        let batch = to_batch(step.ts, &step.events, block_size);
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
        let b = to_batch(1.5, &events, 2);
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
        assert!(to_batch(0.0, &[], 2).events.is_empty());
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
}
