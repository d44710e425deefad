//! Placeholder until the ext-proc crate lands.
