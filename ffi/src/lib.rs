//! Placeholder until the ffi crate lands.
