//! In-flight tickets: one per routed request, released exactly once (AIBrix's counter
//! in `pkg/cache/pod.go`, without its leaks).
//!
//! Tickets are numbered in issue order and the router's clock never goes back, so the map
//! ordered by ticket is also ordered by issue time: the oldest open ticket is the first key,
//! which makes expiry and [`TicketTable::next_expiry`] O(log n).

use std::collections::{BTreeMap, BTreeSet};

use crate::ids::{ModelId, PodId, Ticket};
use crate::time::Timestamp;
use crate::ttft::TicketContext;

/// How a request ended, as the shell saw it. What the pod's health makes of each is in the
/// [`crate::HealthConfig`] docs: a cancel never counts against a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The response finished normally (or with a client error such as a 4xx: the pod worked).
    Success = 0,
    /// The client went away before the response finished. Says nothing about the pod.
    Cancelled = 1,
    /// The upstream answered with a server error (5xx), or failed in a way the shell cannot
    /// tell apart.
    Failed = 2,
    /// The pod could not be connected to (refused, unreachable, connect timeout).
    ConnectFailed = 3,
    /// The pod closed or reset the connection before the response ended.
    Reset = 4,
    /// The pod did not answer in time.
    Timeout = 5,
}

impl Outcome {
    /// Every outcome, in a stable order (the order of [`TicketStats::completed`]). The order
    /// is append-only: positions are stable codes (the C ABI relies on it).
    pub const ALL: [Outcome; 6] = [
        Outcome::Success,
        Outcome::Cancelled,
        Outcome::Failed,
        Outcome::ConnectFailed,
        Outcome::Reset,
        Outcome::Timeout,
    ];

    /// A label for metrics and logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Cancelled => "cancelled",
            Outcome::Failed => "failed",
            Outcome::ConnectFailed => "connect_failed",
            Outcome::Reset => "reset",
            Outcome::Timeout => "timeout",
        }
    }

    /// Its position in [`Outcome::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Whether the request failed because of the pod (every outcome but success and cancel).
    pub const fn is_failure(self) -> bool {
        !matches!(self, Outcome::Success | Outcome::Cancelled)
    }
}

/// Timings the shell observed for a finished request. Every field is optional; strategies that
/// learn from completions use what is there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timings {
    /// Time from routing to the first response byte (or first token), ms.
    pub first_token_ms: Option<u64>,
    /// Time from routing to the end of the response, ms.
    pub total_ms: Option<u64>,
    /// Tokens generated.
    pub output_tokens: Option<u32>,
    /// Prompt tokens the engine served from its prefix cache, when it reports them.
    pub cached_tokens: Option<u32>,
    /// Prompt tokens as the engine counted them (`usage.prompt_tokens`).
    pub prompt_tokens: Option<u32>,
}

impl Timings {
    /// The timings with `first_token_ms` and `total_ms` cut to `elapsed_ms`, the time the
    /// router has seen pass since routing (a longer one is a caller's error, such as a
    /// timestamp or microseconds passed as milliseconds).
    pub(crate) fn at_most(self, elapsed_ms: u64) -> Self {
        Timings {
            first_token_ms: self.first_token_ms.map(|ms| ms.min(elapsed_ms)),
            total_ms: self.total_ms.map(|ms| ms.min(elapsed_ms)),
            ..self
        }
    }
}

/// A completion report: the outcome plus whatever timings are known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// How the request ended.
    pub outcome: Outcome,
    /// What was observed.
    pub timings: Timings,
}

impl Completion {
    /// A completion with this outcome and no timings.
    pub const fn new(outcome: Outcome) -> Self {
        Completion {
            outcome,
            timings: Timings {
                first_token_ms: None,
                total_ms: None,
                output_tokens: None,
                cached_tokens: None,
                prompt_tokens: None,
            },
        }
    }
}

impl From<Outcome> for Completion {
    fn from(o: Outcome) -> Self {
        Completion::new(o)
    }
}

/// Why a completion was rejected. Nothing is decremented in either case.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TicketError {
    /// The router never issued this ticket.
    #[error("ticket {0} was never issued")]
    NeverIssued(Ticket),
    /// The ticket was already completed, or expired.
    #[error("ticket {0} is not open (already completed or expired)")]
    NotOpen(Ticket),
}

/// What a completion released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Released {
    /// The pod the request was routed to.
    pub pod: PodId,
    /// The model it was routed for.
    pub model: ModelId,
    /// Whether the pod had been removed meanwhile (nothing left to decrement).
    pub orphaned: bool,
    /// Milliseconds from routing to completion.
    pub age_ms: u64,
    /// What the outcome changed in the pod's health, if anything.
    pub health: Option<crate::health::HealthEvent>,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct OpenTicket {
    pub(crate) pod: PodId,
    pub(crate) model: ModelId,
    pub(crate) issued: Timestamp,
    pub(crate) context: TicketContext,
    /// Set by [`TicketTable::detach`]: released then unless completed first.
    pub(crate) detached_until: Option<Timestamp>,
}

/// Counters of the ticket table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TicketStats {
    /// Tickets open now.
    pub open: u64,
    /// Tickets issued.
    pub issued: u64,
    /// Completions accepted, by [`Outcome`] in [`Outcome::ALL`] order.
    pub completed: [u64; 6],
    /// Tickets released by the TTL because no completion came.
    pub expired: u64,
    /// Tickets whose pod had been removed when they were completed or expired.
    pub orphaned: u64,
    /// Tickets detached ([`crate::Router::detach`]: their completion signal was lost) and
    /// released at their predicted end because no completion came first.
    pub detached_released: u64,
    /// Completions and first-token reports rejected (unknown, double or late tickets).
    pub rejected: u64,
}

/// Counts a report for a ticket that is not open (`next` = the next ticket to be issued) and
/// says why.
fn reject(stats: &mut TicketStats, next: u64, ticket: Ticket) -> TicketError {
    stats.rejected += 1;
    if ticket.0 >= next {
        TicketError::NeverIssued(ticket)
    } else {
        TicketError::NotOpen(ticket)
    }
}

#[derive(Debug, Default)]
pub(crate) struct TicketTable {
    open: BTreeMap<u64, OpenTicket>,
    /// Detached open tickets by release time.
    detached: BTreeSet<(Timestamp, u64)>,
    next: u64,
    pub(crate) stats: TicketStats,
}

impl TicketTable {
    pub(crate) fn issue(
        &mut self,
        pod: PodId,
        model: ModelId,
        now: Timestamp,
        context: TicketContext,
    ) -> Ticket {
        let t = self.next;
        self.next += 1;
        self.open.insert(
            t,
            OpenTicket {
                pod,
                model,
                issued: now,
                context,
                detached_until: None,
            },
        );
        self.stats.issued += 1;
        Ticket(t)
    }

    pub(crate) fn take(&mut self, ticket: Ticket) -> Result<OpenTicket, TicketError> {
        match self.open.remove(&ticket.0) {
            Some(t) => {
                if let Some(at) = t.detached_until {
                    self.detached.remove(&(at, ticket.0));
                }
                Ok(t)
            }
            None => Err(reject(&mut self.stats, self.next, ticket)),
        }
    }

    /// Marks an open ticket for release at `at` unless completed first; errors as
    /// [`TicketTable::take`]. Detaching again moves the time.
    pub(crate) fn detach(&mut self, ticket: Ticket, at: Timestamp) -> Result<(), TicketError> {
        let t = self.get_mut(ticket)?;
        let before = t.detached_until.replace(at);
        if let Some(b) = before {
            self.detached.remove(&(b, ticket.0));
        }
        self.detached.insert((at, ticket.0));
        Ok(())
    }

    /// Removes and returns a detached ticket whose release time is at or before `now`.
    pub(crate) fn pop_detached(&mut self, now: Timestamp) -> Option<(Ticket, OpenTicket)> {
        let &(at, t) = self.detached.first()?;
        if at > now {
            return None;
        }
        self.detached.pop_first();
        let open = self.open.remove(&t)?;
        self.stats.detached_released += 1;
        Some((Ticket(t), open))
    }

    /// The earliest release time of a detached ticket.
    pub(crate) fn next_detached(&self) -> Option<Timestamp> {
        self.detached.first().map(|(at, _)| *at)
    }

    /// The open ticket, to update its context; errors as [`TicketTable::take`] (counted as a
    /// rejection).
    pub(crate) fn get_mut(&mut self, ticket: Ticket) -> Result<&mut OpenTicket, TicketError> {
        match self.open.get_mut(&ticket.0) {
            Some(t) => Ok(t),
            None => Err(reject(&mut self.stats, self.next, ticket)),
        }
    }

    /// Removes and returns the oldest open ticket if it was issued `ttl_ms` or more before `now`.
    pub(crate) fn pop_expired(
        &mut self,
        now: Timestamp,
        ttl_ms: u64,
    ) -> Option<(Ticket, OpenTicket)> {
        let (_, first) = self.open.first_key_value()?;
        if now.millis_since(first.issued) < ttl_ms {
            return None;
        }
        self.stats.expired += 1;
        let (k, t) = self.open.pop_first()?;
        if let Some(at) = t.detached_until {
            self.detached.remove(&(at, k));
        }
        Some((Ticket(k), t))
    }

    pub(crate) fn next_expiry(&self, ttl_ms: u64) -> Option<Timestamp> {
        self.open
            .first_key_value()
            .map(|(_, t)| t.issued.add_millis(ttl_ms))
    }

    pub(crate) fn is_open(&self, ticket: Ticket) -> bool {
        self.open.contains_key(&ticket.0)
    }

    pub(crate) fn open_count(&self) -> usize {
        self.open.len()
    }

    pub(crate) fn open_tickets(&self) -> impl Iterator<Item = (Ticket, &OpenTicket)> {
        self.open.iter().map(|(k, v)| (Ticket(*k), v))
    }
}
