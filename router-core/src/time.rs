//! Caller-supplied time.

use core::fmt;

/// A point on the caller's monotonic clock, in milliseconds.
///
/// The core never reads a clock. Every call that needs time takes a `Timestamp`; the router
/// clamps it to the latest one it has seen, so a caller whose clock steps back cannot reorder
/// the index or the ticket table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The origin of the caller's clock.
    pub const ZERO: Timestamp = Timestamp(0);

    /// A timestamp `ms` milliseconds after the caller's origin.
    pub const fn from_millis(ms: u64) -> Self {
        Timestamp(ms)
    }

    /// Milliseconds since the caller's origin.
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// `self + ms`, saturating at `u64::MAX`.
    pub const fn add_millis(self, ms: u64) -> Self {
        Timestamp(self.0.saturating_add(ms))
    }

    /// Milliseconds from `earlier` to `self`, or 0 if `earlier` is later.
    pub const fn millis_since(self, earlier: Timestamp) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}
