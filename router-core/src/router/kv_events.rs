//! Feeding engine views: the engines' KV-cache events, decoded by the shell (see
//! `engine_view`'s contract for keys, sequence numbers and when a view is used).

use super::Router;
use crate::engine_view::{KvApplied, KvEvent, KvSource, ViewStats};
use crate::ids::PodId;
use crate::registry::RegistryError;
use crate::time::Timestamp;

impl Router {
    /// Applies one batch of `pod`'s KV-cache events, numbered `seq` by its publisher. From then
    /// on, a token-keyed request ([`crate::RouteRequest::with_tokens`]) is matched against the
    /// pod's engine view while the view is complete and keyed at the request's block size, and
    /// against the router-side index otherwise ([`crate::Decision::view`] says which). Blocks
    /// the engine evicted, and everything when its cache was emptied, are also dropped from the
    /// pod's router-side index entries (which would otherwise keep claiming them).
    ///
    /// [`KvApplied::Gap`]: the batch was not applied; replay the missing batches (as
    /// [`KvSource::Replay`]) and feed this one again, or call [`Router::accept_kv_gap`].
    pub fn apply_kv_events(
        &mut self,
        pod: PodId,
        source: KvSource,
        seq: u64,
        events: &[KvEvent<'_>],
        now: Timestamp,
    ) -> Result<KvApplied, RegistryError> {
        let now = self.clock(now);
        self.registry.pod(pod)?;
        let applied = self.views.apply(pod, source, seq, events, now);
        // What the engine evicted (or lost in a reset) is no longer the pod's in the
        // router-side index either: its pending-window and index matches would claim it.
        let gone = self.views.take_gone();
        if gone.all {
            self.index.purge_pod(pod, None);
        } else if !gone.keys.is_empty() {
            self.index.forget(pod, &gone.keys);
        }
        Ok(applied)
    }

    /// Gives up on replaying `pod`'s pending gap: its view is stale (not used for matching,
    /// still fed) until its engine restarts or clears its cache; the next batch is applied
    /// whatever its number.
    pub fn accept_kv_gap(&mut self, pod: PodId) -> Result<(), RegistryError> {
        self.registry.pod(pod)?;
        self.views.accept_gap(pod);
        Ok(())
    }

    /// Stops using `pod`'s engine view until its next applied batch (the shell suspects its
    /// events stopped: [`ViewStats::awaiting_since`] is long past). The view is kept and still
    /// fed, so nothing is lost if the events were only late. Returns whether it had a view.
    pub fn suspend_kv_view(&mut self, pod: PodId) -> Result<bool, RegistryError> {
        self.registry.pod(pod)?;
        Ok(self.views.suspend(pod))
    }

    /// Drops `pod`'s engine view: its events stopped (or it never published), so its matches
    /// come from the router-side index again until a batch starts a new view.
    pub fn forget_kv_view(&mut self, pod: PodId) -> Result<(), RegistryError> {
        self.registry.pod(pod)?;
        self.views.remove(pod);
        Ok(())
    }

    /// `pod`'s engine view, if it has one.
    pub fn kv_view(&self, pod: PodId) -> Option<ViewStats> {
        self.registry.pod(pod).ok()?;
        self.views.stats(pod)
    }
}
