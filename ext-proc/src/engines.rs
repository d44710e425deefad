//! The latest good engine snapshot of each pod, by pod name: written by the engine scraper,
//! read by the metrics export and `/debug/pods`. Never lock it while holding the router lock.

use std::collections::BTreeMap;
use std::sync::Arc;

use kvroute_core::EngineSnapshot;
use parking_lot::Mutex;

/// Pod name → its latest good snapshot.
pub type EngineTable = Arc<Mutex<BTreeMap<String, EngineSnapshot>>>;
