//! Held requests: the registry of requests the router queued ([`Holds`]), each one's handle in
//! its stream ([`Held`]), and the pump that offers them to the router as capacity frees
//! ([`pump`], driven by [`run`]).
//!
//! Locking: [`pump`] takes the registry's lock, then the router's, and answers only after
//! releasing both; everything else takes one of them at a time. Nothing here awaits while
//! holding either.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvroute_core::{Admitted, QueueId, RouteError, Shed};
use parking_lot::Mutex;
use tokio::sync::{oneshot, watch, Notify};

use super::config::HOLD_GRACE_MS;
use super::metrics::Outcome;
use crate::respond::Reject;
use crate::routing::{self, KeyedRequest, Routed};
use crate::shared::Shared;

/// How often the held requests are offered again while any is held, besides the events that
/// free capacity: the predictions move with time alone (a busy pod's requests progress), and
/// engine snapshots arrive on the scraper's schedule. Also the precision of the deadlines.
pub const TICK: Duration = Duration::from_millis(25);

/// How a held request ended.
#[derive(Debug)]
pub enum Verdict {
    /// Dispatched: answer exactly as for a request routed at once.
    Routed(Box<Routed>),
    /// Shed (429) or no longer routable (its model or its pods gone): answer with this.
    Rejected(Reject),
}

/// A held request in the registry: what it is routed with, and where its verdict goes.
#[derive(Debug)]
struct Waiter {
    request: KeyedRequest,
    reply: oneshot::Sender<Verdict>,
    queued_at: Instant,
}

/// The held requests, by queue id, and the pump's wake-up.
#[derive(Debug, Default)]
pub struct Holds {
    waiters: Mutex<HashMap<QueueId, Waiter>>,
    /// The registry's size (read without its lock by [`Holds::kick`]).
    count: AtomicUsize,
    kick: Notify,
}

impl Holds {
    /// Tells the pump that capacity may have freed (a ticket released, a pod added, a
    /// reload, an arrival). A no-op when nothing is held.
    pub fn kick(&self) {
        if self.count.load(Ordering::Acquire) > 0 {
            self.kick.notify_one();
        }
    }

    /// Requests held now.
    pub fn len(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn insert(&self, id: QueueId, waiter: Waiter) {
        let mut w = self.waiters.lock();
        w.insert(id, waiter);
        self.count.store(w.len(), Ordering::Release);
    }

    fn remove(&self, id: QueueId) -> Option<Waiter> {
        let mut w = self.waiters.lock();
        let removed = w.remove(&id);
        self.count.store(w.len(), Ordering::Release);
        removed
    }
}

/// A request the router holds, owned by its stream. Dropping it before its verdict (the
/// client left: Envoy ended the side stream) takes it out of the registry and the router's
/// queue; a verdict sent meanwhile is dropped with it (a routed one releases its ticket).
#[derive(Debug)]
pub struct Held {
    shared: Arc<Shared>,
    id: QueueId,
    model: Arc<str>,
    priority: i32,
    message_timeout: Duration,
    reply: oneshot::Receiver<Verdict>,
    answered: bool,
}

impl Held {
    /// Registers `request`, just queued by the router as `id` under a policy whose queue
    /// timeout is `queue_timeout_ms`, and wakes the pump.
    pub(crate) fn register(
        shared: &Arc<Shared>,
        id: QueueId,
        request: KeyedRequest,
        queue_timeout_ms: u64,
    ) -> Held {
        let (tx, rx) = oneshot::channel();
        let held = Held {
            shared: shared.clone(),
            id,
            model: request.model.clone(),
            priority: request.priority,
            message_timeout: Duration::from_millis(queue_timeout_ms + HOLD_GRACE_MS),
            reply: rx,
            answered: false,
        };
        let waiter = Waiter {
            request,
            reply: tx,
            queued_at: Instant::now(),
        };
        shared.holds.insert(id, waiter);
        shared.holds.kick();
        held
    }

    /// How long Envoy should wait for this request's reply (`override_message_timeout`): its
    /// queue timeout and [`HOLD_GRACE_MS`], by which its deadline has been answered.
    pub fn message_timeout(&self) -> Duration {
        self.message_timeout
    }

    /// The verdict, once the pump gives it. Cancel-safe: dropping the future keeps the
    /// request held.
    pub async fn verdict(&mut self) -> Verdict {
        let v = (&mut self.reply).await;
        self.answered = true;
        // The pump answers every request it takes out of the registry; only a registry
        // dropped with the service ends a hold without one.
        v.unwrap_or_else(|_| Verdict::Rejected(Reject::NoReadyPod(self.model.to_string())))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        // Registry first, router second (the pump's order): the pump cannot answer it after
        // this, and a head the pump finds unregistered waits for the kick below.
        let removed = self.shared.holds.remove(self.id).is_some();
        let cancelled = self.shared.router.lock().cancel_queued(self.id);
        if removed && cancelled {
            let m = &self.shared.metrics.admission;
            m.count(
                &self.model,
                Outcome::Cancelled,
                "client_gone",
                self.priority,
            );
            tracing::debug!(
                model = &*self.model,
                "held request cancelled: the client left"
            );
        }
        self.shared.holds.kick();
    }
}

/// What the router made of an offered request.
enum Answer {
    /// Routed, in this many seconds.
    Routed(kvroute_core::Decision, f64),
    Shed(Shed),
    Error(RouteError),
}

impl Answer {
    /// A dispatch's result; `None`: still queued.
    fn of(result: Result<Admitted, RouteError>, seconds: f64) -> Option<Answer> {
        match result {
            Ok(Admitted::Queued(_)) => None,
            Ok(Admitted::Routed(d)) => Some(Answer::Routed(d, seconds)),
            Ok(Admitted::Shed(s)) => Some(Answer::Shed(s)),
            Err(e) => Some(Answer::Error(e)),
        }
    }
}

/// Offers the held requests to the router: sheds those past their deadline, then, model by
/// model, dispatches the head of the queue ([`kvroute_core::Router::next_queued`]) until one
/// stays queued; answers them all after releasing the locks. Never awaits.
pub fn pump(shared: &Arc<Shared>) {
    let mut answers: Vec<(Waiter, Answer)> = Vec::new();
    {
        let mut waiters = shared.holds.waiters.lock();
        if waiters.is_empty() {
            return;
        }
        let mut router = shared.router.lock();
        let now = shared.now();
        let mut expired = Vec::new();
        router.expire_queued(now, &mut expired);
        for (id, shed) in expired {
            if let Some(w) = waiters.remove(&id) {
                answers.push((w, Answer::Shed(shed)));
            }
        }
        let models: BTreeSet<Arc<str>> =
            waiters.values().map(|w| w.request.model.clone()).collect();
        for model in models {
            loop {
                let Some(id) = router.next_queued(&model) else {
                    // Requests wait for a model with nothing queued: it was removed (or
                    // removed and added again) since. Offered, each gets the router's error.
                    let orphans: Vec<QueueId> = waiters
                        .iter()
                        .filter(|(_, w)| w.request.model == model)
                        .map(|(id, _)| *id)
                        .collect();
                    for id in orphans {
                        let Some(w) = waiters.remove(&id) else {
                            continue;
                        };
                        let result = w.request.with_request(|req| router.dispatch(id, req, now));
                        let answer = Answer::of(result, 0.0).unwrap_or_else(|| {
                            router.cancel_queued(id);
                            Answer::Error(RouteError::NotQueued)
                        });
                        answers.push((w, answer));
                    }
                    break;
                };
                // Not registered: being registered, or leaving (its Held kicks again).
                let Some(w) = waiters.get(&id) else { break };
                let started = Instant::now();
                let result = w.request.with_request(|req| router.dispatch(id, req, now));
                let Some(answer) = Answer::of(result, started.elapsed().as_secs_f64()) else {
                    break;
                };
                if let Some(w) = waiters.remove(&id) {
                    answers.push((w, answer));
                }
            }
        }
        shared.holds.count.store(waiters.len(), Ordering::Release);
    }
    for (w, answer) in answers {
        answer_waiter(shared, w, answer);
    }
}

fn answer_waiter(shared: &Arc<Shared>, w: Waiter, answer: Answer) {
    let model = &*w.request.model;
    let priority = w.request.priority;
    let m = &shared.metrics.admission;
    let verdict = match answer {
        Answer::Routed(decision, seconds) => {
            m.count(model, Outcome::Dispatched, "none", priority);
            m.observe_wait(model, w.queued_at.elapsed().as_secs_f64());
            let routed = routing::finish(shared, &w.request, decision, seconds);
            Verdict::Routed(Box::new(routed))
        }
        Answer::Shed(s) => {
            m.count(model, Outcome::Shed, s.reason.as_str(), priority);
            Verdict::Rejected(Reject::Shed {
                model: model.to_owned(),
                reason: s.reason.as_str(),
                retry_after_ms: s.retry_after_ms,
            })
        }
        Answer::Error(e) => {
            m.count(model, Outcome::Cancelled, "error", priority);
            Verdict::Rejected(routing::route_error(e, model))
        }
    };
    // A client gone since: the verdict is dropped here (a routed one releases its ticket).
    let _ = w.reply.send(verdict);
}

/// Offers the held requests whenever [`Holds::kick`] says capacity may have freed, and every
/// [`TICK`] while any is held, until `stop` changes.
pub async fn run(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    loop {
        let wait = if shared.holds.is_empty() {
            Duration::from_secs(1)
        } else {
            TICK
        };
        tokio::select! {
            _ = shared.holds.kick.notified() => {}
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
        pump(&shared);
    }
}
