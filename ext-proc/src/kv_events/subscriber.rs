//! One pod's subscription (see the module docs of [`super`] for the contract).

use std::sync::Arc;
use std::time::Duration;

use kvroute_core::{KvApplied, KvSource, PodId, Timestamp};
use kvroute_kv_events::{decode, replay, Subscriber, SubscriberEvent, TransportError};
use tokio::sync::watch;
use tokio::time::Instant;

use super::{Converted, KvEventsStatus, Target};
use crate::shared::Shared;

/// How often the silence rules are checked while nothing arrives.
const TICK: Duration = Duration::from_millis(250);

/// What became of one payload.
enum Fed {
    /// Applied, duplicate, or refused for a pod that is gone: nothing more to do.
    Done,
    /// Not applied: batches from this number are missing.
    Gap(u64),
    /// The payload does not decode.
    Undecodable,
}

struct Sub {
    shared: Arc<Shared>,
    status: KvEventsStatus,
    pod: PodId,
    target: Target,
    /// When the subscription went down (or first tried to come up) without being up since.
    down_since: Option<Instant>,
    warned_block_size: bool,
}

/// Subscribes to `target` for `pod` until `stop` changes.
pub(super) async fn run(
    shared: Arc<Shared>,
    status: KvEventsStatus,
    pod: PodId,
    target: Target,
    mut stop: watch::Receiver<bool>,
) {
    status.update(&target.pod, |s| s.endpoint = target.endpoint.clone());
    let mut sub = Sub {
        shared,
        status,
        pod,
        target,
        down_since: Some(Instant::now()),
        warned_block_size: false,
    };
    let mut backoff = Duration::from_millis(100);
    loop {
        let spec = sub.target.spec.clone();
        let connected = tokio::select! {
            c = Subscriber::connect(&sub.target.endpoint, &spec.topic, spec.connect_timeout) => c,
            _ = stop.changed() => return,
        };
        let mut socket = match connected {
            Ok(s) => s,
            Err(e) => {
                sub.connection_failed(&e);
                sub.check_silence();
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.changed() => return,
                }
                backoff = (backoff * 2).min(spec.connect_timeout);
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        sub.set_connected(true);
        loop {
            let event = tokio::select! {
                e = socket.next_event(TICK) => e,
                _ = stop.changed() => return,
            };
            match event {
                Ok(Some(SubscriberEvent::Message(m))) => {
                    sub.set_connected(true);
                    sub.on_message(m.seq, &m.payload).await;
                }
                Ok(Some(SubscriberEvent::Disconnected)) => sub.set_connected(false),
                Ok(Some(SubscriberEvent::Connected)) => sub.set_connected(true),
                Ok(None) => {}
                Err(TransportError::Malformed(why)) => {
                    sub.status.update(&sub.target.pod, |s| s.malformed += 1);
                    tracing::debug!(pod = %sub.target.pod, why, "malformed KV-event message");
                }
                Err(e) => {
                    sub.connection_failed(&e);
                    break;
                }
            }
            sub.check_silence();
        }
    }
}

impl Sub {
    fn now(&self) -> Timestamp {
        self.shared.now()
    }

    fn set_connected(&mut self, up: bool) {
        let was = self.down_since.is_none();
        if up && !was {
            tracing::info!(pod = %self.target.pod, endpoint = %self.target.endpoint, "KV-event subscription up");
            self.down_since = None;
        } else if !up && was {
            tracing::warn!(pod = %self.target.pod, endpoint = %self.target.endpoint, "KV-event publisher disconnected");
            self.down_since = Some(Instant::now());
        }
        self.status.update(&self.target.pod, |s| s.connected = up);
    }

    fn connection_failed(&mut self, e: &TransportError) {
        if self.down_since.is_none() {
            tracing::warn!(pod = %self.target.pod, endpoint = %self.target.endpoint, error = %e, "KV-event subscription failed");
            self.down_since = Some(Instant::now());
        }
        let text = e.to_string();
        self.status.update(&self.target.pod, |s| {
            s.connected = false;
            s.connect_errors += 1;
            s.last_error = Some(text);
        });
    }

    /// The silence rules of the module docs.
    fn check_silence(&mut self) {
        let silence = self.target.spec.silence;
        if let Some(since) = self.down_since {
            if since.elapsed() >= silence {
                let mut router = self.shared.router.lock();
                if router.kv_view(self.pod).is_some() {
                    let _ = router.forget_kv_view(self.pod);
                    drop(router);
                    tracing::warn!(pod = %self.target.pod, "KV-event publisher down for {silence:?}: engine view dropped; routing this pod on the router-side index");
                    self.status
                        .update(&self.target.pod, |s| s.views_dropped += 1);
                }
            }
            return;
        }
        // Requests with blocks the engine did not hold went to the pod `silence` ago and no
        // batch came back since (a request whose prompt is cached stores nothing: no
        // suspicion).
        let now = self.now();
        let mut router = self.shared.router.lock();
        let overdue = router.kv_view(self.pod).is_some_and(|v| {
            v.complete
                && !v.suspended
                && v.awaiting_since.is_some_and(|t| {
                    now.as_millis().saturating_sub(t.as_millis()) >= silence.as_millis() as u64
                })
        });
        if overdue {
            let _ = router.suspend_kv_view(self.pod);
            drop(router);
            tracing::warn!(pod = %self.target.pod, "requests with uncached blocks went to the pod {silence:?} ago and no KV events came back: engine view suspended until the next batch");
            self.status.update(&self.target.pod, |s| s.suspensions += 1);
        }
    }

    /// Applies one payload, repairing a gap from the replay endpoint or accepting it.
    async fn on_message(&mut self, seq: u64, payload: &[u8]) {
        self.status.update(&self.target.pod, |s| s.batches += 1);
        let expected = match self.feed(KvSource::Live, seq, payload) {
            Fed::Done => return,
            Fed::Gap(expected) => expected,
            // Its events are lost: the next batch shows the gap, which is repaired then.
            Fed::Undecodable => return,
        };
        self.status.update(&self.target.pod, |s| s.gaps += 1);
        if self.repair(expected, seq, payload).await {
            return;
        }
        // Not repaired: the view is stale from here (still fed).
        tracing::warn!(pod = %self.target.pod, expected, got = seq, "KV-event gap not repaired: engine view stale until the engine clears its cache or restarts");
        let _ = self.shared.router.lock().accept_kv_gap(self.pod);
        self.status
            .update(&self.target.pod, |s| s.gaps_accepted += 1);
        self.feed(KvSource::Live, seq, payload);
    }

    /// Replays `expected..` and feeds `seq`'s payload after it; true if nothing is missing.
    async fn repair(&mut self, expected: u64, seq: u64, payload: &[u8]) -> bool {
        let Some(endpoint) = self.target.replay_endpoint.clone() else {
            return false;
        };
        self.status.update(&self.target.pod, |s| s.replays += 1);
        let items = match replay(&endpoint, expected, self.target.spec.replay_timeout).await {
            Ok(items) => items,
            Err(e) => {
                tracing::warn!(pod = %self.target.pod, %endpoint, error = %e, "KV-event replay failed");
                self.status.update(&self.target.pod, |s| {
                    s.replay_errors += 1;
                    s.last_error = Some(e.to_string());
                });
                return false;
            }
        };
        for item in items.iter().filter(|i| i.seq < seq) {
            if !matches!(
                self.feed(KvSource::Replay, item.seq, &item.payload),
                Fed::Done
            ) {
                return false;
            }
        }
        matches!(self.feed(KvSource::Replay, seq, payload), Fed::Done)
    }

    fn feed(&mut self, source: KvSource, seq: u64, payload: &[u8]) -> Fed {
        let batch = match decode(payload) {
            Ok(b) => b,
            Err(e) => {
                tracing::debug!(pod = %self.target.pod, seq, error = %e, "undecodable KV-event batch");
                self.status
                    .update(&self.target.pod, |s| s.decode_errors += 1);
                return Fed::Undecodable;
            }
        };
        let converted = Converted::new(&batch);
        let events = converted.events();
        let now = self.now();
        let mut router = self.shared.router.lock();
        let applied = router.apply_kv_events(self.pod, source, seq, &events, now);
        let block_size = router.kv_view(self.pod).map_or(0, |v| v.block_size);
        drop(router);
        self.check_block_size(block_size);
        match applied {
            Ok(KvApplied::Gap { expected }) => Fed::Gap(expected),
            Ok(KvApplied::Applied(_) | KvApplied::Duplicate) | Err(_) => Fed::Done,
        }
    }

    fn check_block_size(&mut self, view: u32) {
        let Some(request) = self.target.request_block_tokens else {
            if !self.warned_block_size {
                self.warned_block_size = true;
                tracing::warn!(pod = %self.target.pod, model = %self.target.model, "KV events arrive, but the model has no [tokenizers] section: its requests are keyed by text blocks and never match the engine view");
            }
            return;
        };
        if view != 0 && view != request && !self.warned_block_size {
            self.warned_block_size = true;
            tracing::warn!(pod = %self.target.pod, model = %self.target.model, engine_block_size = view, request_block_tokens = request, "the engine's block size differs from the tokenizer's block_tokens: the engine view cannot answer; set [tokenizers] block_tokens to the engine's --block-size");
        }
    }
}
