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

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

use super::metrics::Latencies;
use crate::engine::{Engine, EngineCounters, RequestId, SubmitError, TokenEvent};

struct State {
    engine: Engine,
    subscribers: HashMap<RequestId, Subscriber>,
    next_id: RequestId,
    requests_total: u64,
    latencies: Latencies,
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
        Arc::new(Driver {
            state: Mutex::new(State {
                engine,
                subscribers: HashMap::new(),
                next_id: 1,
                requests_total: 0,
                latencies: Latencies::default(),
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
        self.lock().engine.prime(tokens);
    }

    /// Resets the prefix cache; false while requests hold cached blocks.
    pub fn reset_prefix_cache(&self) -> bool {
        self.lock().engine.reset_prefix_cache()
    }

    /// The engine's counters and the number of requests accepted so far.
    pub fn counters(&self) -> (EngineCounters, u64) {
        let st = self.lock();
        (st.engine.counters(), st.requests_total)
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
            let step = self.lock().engine.start_step();
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
