//! Runs an [`Engine`] in (scaled) real time: one task steps the engine, sleeping each step's
//! modelled duration divided by the speed-up, and hands every token to the request's channel.
//!
//! Contract: [`Driver::submit`] returns a receiver that gets every [`TokenEvent`] of the
//! request, the last with `finished`; dropping the [`Subscription`] before that aborts the
//! request in the engine (the client went away). The engine lock is never held across an
//! `.await`. [`Driver::latencies`] are measured as vLLM's frontend measures them, in real
//! time: a request's time to first token and (once it has all its tokens) its end-to-end
//! latency, from its submission to the end of the step that produced the token (a request
//! aborted before a token is not counted for it).
//!
//! KV events ([`Driver::with_kv_sink`]): the engine records its [`BlockEvent`]s, and after each
//! step, each [`Driver::prime`] and each [`Driver::reset_prefix_cache`] the driver drains them
//! and, if there are any, hands them to the [`KvSink`] in the same critical section that
//! produced them, so hand-overs follow the engine's own order. The sink never blocks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

use super::kv_publish::KvSink;
use super::metrics::{EngineStats, Latencies};
use crate::engine::{BlockEvent, Engine, EngineCounters, RequestId, SubmitError, TokenEvent};

struct State {
    engine: Engine,
    subscribers: HashMap<RequestId, Subscriber>,
    next_id: RequestId,
    requests_total: u64,
    latencies: Latencies,
    // Where the engine's KV events go, when they are published.
    kv_sink: Option<KvSink>,
}

impl State {
    /// Hands the KV events recorded so far to the sink, if any. If the publisher is gone, stops
    /// recording (turning recording off is safe at any time; turning it on is not).
    fn flush_kv_events(&mut self) {
        let Some(sink) = &self.kv_sink else {
            return;
        };
        let mut events: Vec<BlockEvent> = Vec::new();
        self.engine.drain_kv_events(&mut events);
        if !events.is_empty() && !sink.send(events) {
            self.kv_sink = None;
            self.engine.record_kv_events(false);
        }
    }
}

/// A live request's token channel and when it was submitted.
struct Subscriber {
    tx: mpsc::UnboundedSender<TokenEvent>,
    arrival: Instant,
}

/// The shared handle to a running engine.
pub struct Driver {
    state: Mutex<State>,
    wake: Notify,
    speedup: f64,
}

/// A submitted request: its engine id and its token stream. Dropping it aborts the request if
/// it has not finished.
pub struct Subscription {
    driver: Arc<Driver>,
    /// The engine-local id.
    pub id: RequestId,
    /// Tokens as the engine produces them.
    pub tokens: mpsc::UnboundedReceiver<TokenEvent>,
    finished: bool,
}

impl Subscription {
    /// The next token, `None` once the request is over.
    pub async fn next(&mut self) -> Option<TokenEvent> {
        if self.finished {
            return None;
        }
        let ev = self.tokens.recv().await?;
        self.finished = ev.finished;
        Some(ev)
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if !self.finished {
            let mut st = self.driver.lock();
            st.subscribers.remove(&self.id);
            st.engine.abort(self.id);
        }
    }
}

impl Driver {
    /// A driver for `engine`, stepping `speedup` times faster than the model's time (> 0).
    /// Call [`Driver::run`] on a task.
    pub fn new(engine: Engine, speedup: f64) -> Arc<Driver> {
        Self::build(engine, speedup, None)
    }

    /// As [`Driver::new`], with the engine recording its KV events and the driver handing them
    /// to `sink` (see the module docs). `engine` must have no request yet: requests submitted
    /// before recording starts do not keep the tokens a stored block's event carries.
    pub fn with_kv_sink(mut engine: Engine, speedup: f64, sink: KvSink) -> Arc<Driver> {
        engine.record_kv_events(true);
        Self::build(engine, speedup, Some(sink))
    }

    fn build(engine: Engine, speedup: f64, kv_sink: Option<KvSink>) -> Arc<Driver> {
        Arc::new(Driver {
            state: Mutex::new(State {
                engine,
                subscribers: HashMap::new(),
                next_id: 1,
                requests_total: 0,
                latencies: Latencies::default(),
                kv_sink,
            }),
            wake: Notify::new(),
            speedup: if speedup.is_finite() && speedup > 0.0 {
                speedup
            } else {
                1.0
            },
        })
    }

    /// How many times faster than the model's time the engine runs.
    pub fn speedup(&self) -> f64 {
        self.speedup
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere cannot leave the engine half-updated in a way worse than stopping.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a prompt; the tokens arrive on the subscription.
    pub fn submit(
        self: &Arc<Self>,
        tokens: &[u32],
        max_tokens: u32,
    ) -> Result<Subscription, SubmitError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let id = {
            let mut st = self.lock();
            let id = st.next_id;
            st.next_id += 1;
            st.engine.submit(id, tokens, max_tokens)?;
            st.subscribers.insert(
                id,
                Subscriber {
                    tx,
                    arrival: Instant::now(),
                },
            );
            st.requests_total += 1;
            id
        };
        self.wake.notify_one();
        Ok(Subscription {
            driver: Arc::clone(self),
            id,
            tokens: rx,
            finished: false,
        })
    }

    /// Caches a prompt's blocks at once.
    pub fn prime(&self, tokens: &[u32]) {
        let mut st = self.lock();
        st.engine.prime(tokens);
        st.flush_kv_events();
    }

    /// Resets the prefix cache; false while requests hold cached blocks.
    pub fn reset_prefix_cache(&self) -> bool {
        Self::reset_prefix_caches(&[self])
    }

    /// Resets the prefix caches of all `drivers` at once, or none: false (nothing changes)
    /// while a request of any of them holds cached blocks. Their locks are taken in the order
    /// given (callers always give the ranks in rank order; nothing else holds two at once).
    pub fn reset_prefix_caches(drivers: &[&Driver]) -> bool {
        let mut states: Vec<MutexGuard<'_, State>> = drivers.iter().map(|d| d.lock()).collect();
        if !states.iter().all(|st| st.engine.can_reset_prefix_cache()) {
            return false;
        }
        for st in &mut states {
            st.engine.reset_prefix_cache();
            st.flush_kv_events();
        }
        true
    }

    /// The engine's queue as vLLM's data-parallel load balancer reads it: (waiting, running).
    pub fn load(&self) -> (u32, u32) {
        let c = self.lock().engine.counters();
        (c.waiting, c.running)
    }

    /// The engine's counters and the number of requests accepted so far.
    pub fn counters(&self) -> (EngineCounters, u64) {
        let st = self.lock();
        (st.engine.counters(), st.requests_total)
    }

    /// Everything `/metrics` shows of this engine, read at one instant.
    pub fn stats(&self) -> EngineStats {
        let st = self.lock();
        EngineStats {
            counters: st.engine.counters(),
            requests_total: st.requests_total,
            latencies: st.latencies.clone(),
        }
    }

    /// The time-to-first-token and end-to-end latency histograms, in real seconds.
    pub fn latencies(&self) -> Latencies {
        self.lock().latencies.clone()
    }

    /// Steps the engine forever (until the task is dropped).
    pub async fn run(self: Arc<Self>) {
        let mut out = Vec::new();
        let mut deadline = Instant::now();
        loop {
            let step = {
                let mut st = self.lock();
                let step = st.engine.start_step();
                if step.is_none() {
                    // Nothing scheduled: nothing recorded either, but never leave events behind.
                    st.flush_kv_events();
                }
                step
            };
            let Some(us) = step else {
                self.wake.notified().await;
                deadline = Instant::now();
                continue;
            };
            let now = Instant::now();
            // Keep to the model's clock, but never try to catch up more than one step.
            deadline = deadline.max(now.checked_sub(Duration::from_millis(50)).unwrap_or(now))
                + Duration::from_secs_f64(us as f64 / 1e6 / self.speedup);
            tokio::time::sleep_until(deadline).await;
            out.clear();
            let mut guard = self.lock();
            let st = &mut *guard;
            st.engine.finish_step(&mut out);
            // The step's events (evictions when it was scheduled, blocks it cached) as one batch.
            st.flush_kv_events();
            let end = Instant::now();
            for ev in &out {
                let gone = match st.subscribers.get(&ev.id) {
                    Some(sub) => {
                        let seconds = end.duration_since(sub.arrival).as_secs_f64();
                        if ev.generated == 1 {
                            st.latencies.ttft.observe(seconds);
                        }
                        if ev.finished {
                            st.latencies.e2e.observe(seconds);
                        }
                        sub.tx.send(*ev).is_err() || ev.finished
                    }
                    None => false,
                };
                if gone {
                    st.subscribers.remove(&ev.id);
                    if !ev.finished {
                        st.engine.abort(ev.id);
                    }
                }
            }
        }
    }
}
