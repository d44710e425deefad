//! [`TicketGuard`]: releases a routed request's in-flight slot exactly once.
//!
//! The guard is created right after [`kvroute_core::Router::route`] returns a decision and is
//! owned by the task serving that request's ext_proc stream. With `response_trailer_mode:
//! SEND` Envoy keeps that stream open until the HTTP response is over (finished, aborted,
//! reset or failed) and closes it within about a millisecond (envoy-completion.md). The task
//! then returns and the guard is dropped: `Drop` is the only release path, and Rust runs it
//! exactly once, also when the task unwinds.

use std::sync::Arc;

use kvroute_core::{Completion, Outcome, Ticket};

use crate::shared::Shared;

/// Owns one open ticket; dropping it completes the ticket.
#[derive(Debug)]
pub struct TicketGuard {
    shared: Arc<Shared>,
    ticket: Ticket,
    outcome: Outcome,
}

impl TicketGuard {
    /// Takes ownership of `ticket` (just issued by the router in `shared`).
    pub fn new(shared: Arc<Shared>, ticket: Ticket) -> Self {
        TicketGuard {
            shared,
            ticket,
            outcome: Outcome::Success,
        }
    }

    /// The ticket held.
    pub fn ticket(&self) -> Ticket {
        self.ticket
    }

    /// Sets the outcome reported at release (default `Success`; the response status can
    /// downgrade it to `Failed`).
    pub fn set_outcome(&mut self, outcome: Outcome) {
        self.outcome = outcome;
    }
}

impl Drop for TicketGuard {
    fn drop(&mut self) {
        let now = self.shared.now();
        let result =
            self.shared
                .router
                .lock()
                .complete(self.ticket, Completion::new(self.outcome), now);
        if let Err(e) = result {
            self.shared.metrics.release_error();
            tracing::error!(ticket = %self.ticket, error = %e, "ticket release refused");
        }
    }
}
