//! One model's queue of requests held while it is saturated: bands by priority (highest
//! first), and within a band one FIFO per tenant, served in turn (the tenant after the one
//! served last, in name order, wrapping), so one tenant's burst does not starve another's
//! requests of the same priority. Deadlines are kept in order for expiry.
//!
//! Plain data, single owner; ids are the router's [`QueueId`]s.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use super::QueueId;
use crate::time::Timestamp;

/// Where a queued request sits.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Place {
    priority: i32,
    tenant: Arc<str>,
    queued_at: Timestamp,
    deadline: Timestamp,
}

/// One priority's tenants.
#[derive(Debug, Default)]
struct Band {
    tenants: BTreeMap<Arc<str>, VecDeque<QueueId>>,
    /// The tenant served last (the next turn goes to the one after it).
    last_served: Option<Arc<str>>,
}

impl Band {
    fn next_tenant(&self) -> Option<&Arc<str>> {
        let after = self.last_served.as_ref().and_then(|last| {
            self.tenants
                .range::<Arc<str>, _>((std::ops::Bound::Excluded(last), std::ops::Bound::Unbounded))
                .next()
        });
        after
            .or_else(|| self.tenants.iter().next())
            .map(|(tenant, _)| tenant)
    }
}

/// The queue. Empty tenants and bands are dropped, so `len` is cheap and exact.
#[derive(Debug, Default)]
pub(crate) struct AdmissionQueue {
    // Keyed by priority, iterated highest first.
    bands: BTreeMap<i32, Band>,
    places: BTreeMap<QueueId, Place>,
    deadlines: BTreeSet<(Timestamp, QueueId)>,
}

impl AdmissionQueue {
    /// Requests queued.
    pub(crate) fn len(&self) -> usize {
        self.places.len()
    }

    /// `id`'s priority and when it was queued.
    pub(crate) fn entry(&self, id: QueueId) -> Option<(i32, Timestamp)> {
        self.places.get(&id).map(|p| (p.priority, p.queued_at))
    }

    /// Queues `id` (at `now`, until `deadline`) at the back of its tenant's line in its
    /// priority's band.
    pub(crate) fn push(
        &mut self,
        id: QueueId,
        priority: i32,
        tenant: &str,
        now: Timestamp,
        deadline: Timestamp,
    ) {
        let band = self.bands.entry(priority).or_default();
        let tenant: Arc<str> = match band.tenants.get_key_value(tenant) {
            Some((t, _)) => t.clone(),
            None => Arc::from(tenant),
        };
        band.tenants
            .entry(tenant.clone())
            .or_default()
            .push_back(id);
        self.deadlines.insert((deadline, id));
        self.places.insert(
            id,
            Place {
                priority,
                tenant,
                queued_at: now,
                deadline,
            },
        );
    }

    /// The request to serve next: the highest band's next tenant's oldest request.
    pub(crate) fn peek(&self) -> Option<QueueId> {
        let band = self.bands.values().next_back()?;
        let tenant = band.next_tenant()?;
        band.tenants.get(tenant)?.front().copied()
    }

    /// Removes `id`; `served` makes its tenant the one served last in its band (a dispatch),
    /// otherwise turns are unchanged (a cancel or an expiry). False if it was not queued.
    pub(crate) fn remove(&mut self, id: QueueId, served: bool) -> bool {
        let Some(place) = self.places.remove(&id) else {
            return false;
        };
        self.deadlines.remove(&(place.deadline, id));
        let Some(band) = self.bands.get_mut(&place.priority) else {
            return true;
        };
        if let Some(line) = band.tenants.get_mut(&place.tenant) {
            line.retain(|&q| q != id);
            if line.is_empty() {
                band.tenants.remove(&place.tenant);
            }
        }
        if served {
            band.last_served = Some(place.tenant);
        }
        if band.tenants.is_empty() {
            self.bands.remove(&place.priority);
        }
        true
    }

    /// The earliest deadline, if any request is queued.
    pub(crate) fn next_deadline(&self) -> Option<Timestamp> {
        self.deadlines.first().map(|&(t, _)| t)
    }

    /// Removes the requests whose deadline is at or before `now`, appending their ids.
    pub(crate) fn expire(&mut self, now: Timestamp, out: &mut Vec<QueueId>) {
        while let Some(&(deadline, id)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            self.remove(id, false);
            out.push(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: u64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    #[test]
    fn highest_priority_first_then_fifo() {
        let mut q = AdmissionQueue::default();
        q.push(QueueId(1), 0, "", t(0), t(100));
        q.push(QueueId(2), 5, "", t(0), t(100));
        q.push(QueueId(3), 0, "", t(0), t(100));
        assert_eq!(q.len(), 3);
        assert_eq!(q.peek(), Some(QueueId(2)));
        assert!(q.remove(QueueId(2), true));
        assert_eq!(q.peek(), Some(QueueId(1)));
        assert!(q.remove(QueueId(1), true));
        assert_eq!(q.peek(), Some(QueueId(3)));
        assert!(!q.remove(QueueId(1), true), "already gone");
    }

    #[test]
    fn tenants_of_a_priority_take_turns() {
        let mut q = AdmissionQueue::default();
        for i in 0..4 {
            q.push(QueueId(i), 0, "a", t(0), t(100));
        }
        q.push(QueueId(10), 0, "b", t(0), t(100));
        q.push(QueueId(11), 0, "b", t(0), t(100));
        let mut order = Vec::new();
        while let Some(id) = q.peek() {
            order.push(id.0);
            q.remove(id, true);
        }
        assert_eq!(order, [0, 10, 1, 11, 2, 3]);
    }

    #[test]
    fn a_cancel_does_not_take_a_turn() {
        let mut q = AdmissionQueue::default();
        q.push(QueueId(1), 0, "a", t(0), t(100));
        q.push(QueueId(2), 0, "a", t(0), t(100));
        q.push(QueueId(3), 0, "b", t(0), t(100));
        assert!(q.remove(QueueId(1), true)); // a served
        assert!(q.remove(QueueId(3), false)); // b cancelled
        assert_eq!(q.peek(), Some(QueueId(2)));
    }

    #[test]
    fn deadlines_expire_in_order() {
        let mut q = AdmissionQueue::default();
        q.push(QueueId(1), 0, "", t(0), t(300));
        q.push(QueueId(2), 9, "", t(0), t(100));
        q.push(QueueId(3), 0, "", t(0), t(200));
        assert_eq!(q.next_deadline(), Some(t(100)));
        let mut out = Vec::new();
        q.expire(t(200), &mut out);
        assert_eq!(out, [QueueId(2), QueueId(3)]);
        assert_eq!(q.len(), 1);
        assert_eq!(q.peek(), Some(QueueId(1)));
        assert_eq!(q.next_deadline(), Some(t(300)));
    }
}
