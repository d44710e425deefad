//! The client's side of a run: what it has sent, what is on its way to an engine, what the
//! router holds, and what it will send again after a 429.

use std::collections::{BTreeSet, VecDeque};

/// What [`super::Cluster::send`] did with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Sent {
    /// Routed: it reaches its engine at `due` (µs), on pod `pod`.
    Routed { due: u64, id: usize, pod: usize },
    /// Refused (an error answer): done.
    Refused { id: usize },
    /// Held by the router's admission queue: in flight, not yet routed.
    Queued,
    /// Shed with a 429: done, or (with retries left) sent again at `retry_at` (µs).
    Shed { id: usize, retry_at: Option<u64> },
}

/// The client's counts.
#[derive(Debug, Default)]
pub(super) struct Flight {
    /// Requests sent and not answered yet (queued ones included).
    pub(super) in_flight: usize,
    /// Requests answered, refused or shed for good.
    pub(super) done: usize,
    /// Routed requests on their way to the engine: (due, id, pod), in due order.
    pub(super) pending: VecDeque<(u64, usize, usize)>,
    /// Shed requests to send again: (when, id).
    pub(super) retries: BTreeSet<(u64, usize)>,
    /// The requests done (answered, refused or shed for good) since the run last took them
    /// ([`Flight::take_ended`]): their conversations' next turns are due.
    ended: Vec<usize>,
}

impl Flight {
    /// Counts a request's (first or repeated) send.
    pub(super) fn sent(&mut self, sent: Sent) {
        match sent {
            Sent::Routed { due, id, pod } => {
                self.in_flight += 1;
                self.pending.push_back((due, id, pod));
            }
            Sent::Queued => self.in_flight += 1,
            Sent::Refused { id } | Sent::Shed { id, retry_at: None } => {
                self.done += 1;
                self.ended.push(id);
            }
            Sent::Shed {
                id,
                retry_at: Some(at),
            } => {
                self.retries.insert((at, id));
            }
        }
    }

    /// A request the router held was routed: on its way to its engine.
    pub(super) fn dispatched(&mut self, due: u64, id: usize, pod: usize) {
        self.pending.push_back((due, id, pod));
    }

    /// A request in flight has its answer (or failed at the engine, or was shed from the
    /// queue for good).
    pub(super) fn answered(&mut self, id: usize) {
        self.in_flight -= 1;
        self.done += 1;
        self.ended.push(id);
    }

    /// The requests done since the last call, in the order they ended.
    pub(super) fn take_ended(&mut self) -> std::vec::Drain<'_, usize> {
        self.ended.drain(..)
    }

    /// A request in flight was shed from the queue and will be sent again at `at`.
    pub(super) fn retry_later(&mut self, at: u64, id: usize) {
        self.in_flight -= 1;
        self.retries.insert((at, id));
    }

    /// The next retry due at or before `now`, taken out.
    pub(super) fn due_retry(&mut self, now: u64) -> Option<usize> {
        let &(at, id) = self.retries.first()?;
        (at <= now).then(|| {
            self.retries.pop_first();
            id
        })
    }
}

/// One request's state during a run.
#[derive(Default)]
pub(super) struct Live {
    /// The client's first send, µs.
    pub(super) sent_us: u64,
    /// When it was routed (after any wait in the router's queue), µs: what the router's
    /// timings are measured from, as a shell measures them from its decision.
    pub(super) routed_us: u64,
    pub(super) first_us: Option<u64>,
    pub(super) last_us: Option<u64>,
    pub(super) generated: u32,
    pub(super) cached: u32,
    pub(super) prompt: u32,
    pub(super) pod: usize,
    /// The prompt's token ids, from its send until it is handed to its engine.
    pub(super) ids: Vec<u32>,
    pub(super) ticket: Option<kvroute_core::Ticket>,
    /// [`super::Feedback::Envoy`]: how many timed responses may be open for its own to be
    /// timed too (kvroute-ext-proc's rule, [`kvroute_core::Prediction::timing_budget`]).
    pub(super) timing_budget: usize,
    /// [`super::Feedback::Envoy`]: its response is timed (it holds one of the timed streams).
    pub(super) timed: bool,
    /// Times it was shed so far.
    pub(super) sheds: u32,
    /// The session id its decision carried (`x-session-id`), which its conversation's next
    /// turn sends.
    pub(super) session_id: Option<String>,
}
