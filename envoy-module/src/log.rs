//! The module's log: kvroute's `tracing` events, one line each on Envoy's stderr (where
//! Envoy logs by default), prefixed `kvroute`. The level comes from `KVROUTE_LOG` in Envoy's
//! environment (`tracing` filter syntax, default `info`), read once when the first instance
//! starts.

use std::sync::Once;

static INIT: Once = Once::new();

/// Installs the subscriber (once per process; a no-op when another one is installed).
pub fn init() {
    INIT.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_env("KVROUTE_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_target(false)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init();
    });
}
