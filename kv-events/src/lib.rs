//! vLLM KV-cache events: the msgpack wire format ([`wire`]) and the ZMQ transport
//! ([`transport`]) -- no routing logic.
//!
//! ```
//! use kvroute_kv_events::wire::{decode, encode, BlockStored, EventBatch, KvEvent, Layout};
//!
//! let batch = EventBatch::new(
//!     1767225600.0,
//!     vec![KvEvent::BlockStored(BlockStored {
//!         block_hashes: vec![42u64.into()],
//!         token_ids: vec![1, 2, 3, 4],
//!         block_size: 4,
//!         medium: Some("GPU".into()),
//!         ..Default::default()
//!     })],
//! );
//! for layout in [Layout::Positional, Layout::Map, Layout::MapBatch] {
//!     assert_eq!(decode(&encode(&batch, layout)).unwrap(), batch);
//! }
//! ```

pub mod transport;
pub mod wire;

pub use transport::{
    replay, LiveMessage, Publisher, PublisherConfig, ReplayItem, Subscriber, SubscriberEvent,
    TransportError,
};
pub use wire::{decode, encode, BlockHash, DecodeError, EventBatch, KvEvent, Layout};
