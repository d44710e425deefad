//! Interned identifiers.

use core::fmt;

/// A pod, interned by the router. Ids are never reused: a pod removed and added again under the
/// same name gets a new id, so tickets issued to the old pod can never touch the new one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodId(pub(crate) u32);

impl PodId {
    /// The raw value, for FFI and logs.
    pub const fn as_u32(self) -> u32 {
        self.0
    }
    /// Rebuilds an id from [`PodId::as_u32`]. An id the router never issued is rejected by every
    /// call that takes one.
    pub const fn from_u32(raw: u32) -> Self {
        PodId(raw)
    }
    pub(crate) const fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for PodId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pod#{}", self.0)
    }
}

/// A model name, interned by the router.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ModelId(pub(crate) u32);

impl ModelId {
    /// The raw value.
    pub const fn as_u32(self) -> u32 {
        self.0
    }
    /// Rebuilds an id from [`ModelId::as_u32`] (for using [`crate::PrefixIndex`] on its own).
    pub const fn from_u32(raw: u32) -> Self {
        ModelId(raw)
    }
    pub(crate) const fn index(self) -> usize {
        self.0 as usize
    }
}

/// One routed request whose in-flight slot has not been released yet.
///
/// Tickets are issued in increasing order, so the router can tell a ticket it never issued from
/// one that was already completed or expired.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket(pub(crate) u64);

impl Ticket {
    /// The raw value, for FFI and logs.
    pub const fn as_u64(self) -> u64 {
        self.0
    }
    /// Rebuilds a ticket from [`Ticket::as_u64`].
    pub const fn from_u64(raw: u64) -> Self {
        Ticket(raw)
    }
}

impl fmt::Display for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
