//! Placeholder until the sim crate lands.
