//! Plain counters the shells export. No metrics crate here: shells read [`RouterStats`] on
//! scrape and render it in their own format.

use std::sync::Arc;

use crate::decision::Reason;
use crate::index::IndexStats;
use crate::registry::PodInfo;
use crate::tickets::TicketStats;

/// AIBrix's `match_percent_bucket` label values, in order.
pub const MATCH_BUCKETS: [&str; 5] = ["0", "1-25", "26-50", "51-75", "76-100"];

/// The index into [`MATCH_BUCKETS`] of a match percentage.
pub const fn match_bucket(percent: u8) -> usize {
    match percent {
        0 => 0,
        1..=25 => 1,
        26..=50 => 2,
        51..=75 => 3,
        _ => 4,
    }
}

/// Counters of one model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelStats {
    /// The model name.
    pub model: Arc<str>,
    /// prefix-cache decisions by the chosen pod's match bucket ([`MATCH_BUCKETS`] order).
    pub decisions_by_bucket: [u64; 5],
    /// Decisions by reason ([`Reason::ALL`] order). The prefix-cache entries are AIBrix's
    /// `selection` counts.
    pub routed_by_reason: [u64; Reason::ALL.len()],
    /// Times prefix-cache's imbalance guard fired.
    pub imbalance_events: u64,
    /// Requests rejected because no pod of the model was ready.
    pub no_ready_pod: u64,
}

impl ModelStats {
    pub(crate) fn new(model: Arc<str>) -> Self {
        ModelStats {
            model,
            decisions_by_bucket: [0; 5],
            routed_by_reason: [0; Reason::ALL.len()],
            imbalance_events: 0,
            no_ready_pod: 0,
        }
    }

    /// Decisions with this reason.
    pub fn routed(&self, reason: Reason) -> u64 {
        self.routed_by_reason[reason.index()]
    }
}

/// A snapshot of every counter.
#[derive(Clone, Debug, PartialEq)]
pub struct RouterStats {
    /// Per model ever added (removed ones too: counters do not restart), in the order models
    /// were first added.
    pub models: Vec<ModelStats>,
    /// Every live pod.
    pub pods: Vec<PodInfo>,
    /// The prefix index.
    pub index: IndexStats,
    /// The ticket table.
    pub tickets: TicketStats,
    /// Requests for a model the router does not know.
    pub unknown_model: u64,
    /// The TTFT model's prompt bytes per engine token (the prior until learned).
    pub prompt_bytes_per_token: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_follow_aibrix_bounds() {
        let b = |p| MATCH_BUCKETS[match_bucket(p)];
        assert_eq!(b(0), "0");
        assert_eq!(b(1), "1-25");
        assert_eq!(b(25), "1-25");
        assert_eq!(b(26), "26-50");
        assert_eq!(b(50), "26-50");
        assert_eq!(b(75), "51-75");
        assert_eq!(b(76), "76-100");
        assert_eq!(b(100), "76-100");
    }
}
