//! What the engine scraper last learned of each pod, by pod name: written by the engine
//! scraper, read by the metrics export and `/debug/pods`. Never lock it while holding the
//! router lock.

use std::collections::BTreeMap;
use std::sync::Arc;

use kvroute_core::EngineSnapshot;
use parking_lot::Mutex;

/// One pod's last good scrape.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ScrapedEngine {
    /// What the core was given.
    pub snapshot: EngineSnapshot,
    /// The KV block size in tokens the engine reports
    /// ([`crate::scrape::engine_block_tokens`]), if it does.
    pub block_tokens: Option<u32>,
}

/// Pod name → its last good scrape.
pub type EngineTable = Arc<Mutex<BTreeMap<String, ScrapedEngine>>>;
