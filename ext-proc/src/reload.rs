//! Configuration reload on SIGHUP and on file change (polled every second: modification
//! time, size and content). A new configuration is loaded with the same env snapshot and
//! flags, validated, and applied to the running router without touching in-flight state. A
//! bad file is rejected with a logged reason and the old configuration stays in force.

use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

use crate::config::{Config, ConfigSource};
use crate::shared::Shared;

/// How often the file is checked for changes.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// A cheap fingerprint of the file: (mtime, len, content hash).
fn fingerprint(source: &ConfigSource) -> Option<(Option<std::time::SystemTime>, u64, u64)> {
    let path = source.path.as_ref()?;
    let meta = std::fs::metadata(path).ok()?;
    let bytes = std::fs::read(path).ok()?;
    let hash = fnv1a(&bytes);
    Some((meta.modified().ok(), meta.len(), hash))
}

fn fnv1a(bytes: &[u8]) -> u64 {
    // FNV-1a: only used to notice edits.
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// The settings in `new` that differ from the start-up configuration `startup` but take
/// effect only after a restart: the listen addresses, the shutdown grace period, and a
/// `max_body_bytes` whose bodies the gRPC decode limit set at start-up
/// ([`crate::grpc_decode_limit`]) no longer covers (a body Envoy buffers that is larger than
/// that limit fails the side stream, and the request takes the fallback route, instead of
/// getting kvroute's 413). Every other setting applies on reload.
pub fn restart_only_changes(startup: &Config, new: &Config) -> Vec<&'static str> {
    let mut changed = Vec::new();
    if new.grpc_listen != startup.grpc_listen {
        changed.push("listen.grpc");
    }
    if new.admin_listen != startup.admin_listen {
        changed.push("listen.admin");
    }
    if new.shutdown_grace != startup.shutdown_grace {
        changed.push("limits.shutdown_grace_secs");
    }
    if crate::grpc_decode_limit(new.max_body_bytes)
        > crate::grpc_decode_limit(startup.max_body_bytes)
    {
        changed.push(
            "limits.max_body_bytes (above what the gRPC decode limit set at start-up covers)",
        );
    }
    changed
}

/// Loads and applies the configuration once, or logs why not; `startup` is the configuration
/// the process started with (for [`restart_only_changes`]).
pub fn reload_once(source: &ConfigSource, shared: &Shared, startup: &Config) {
    let result = source.load().map_err(|e| e.to_string()).and_then(|new| {
        let changed = restart_only_changes(startup, &new);
        if !changed.is_empty() {
            tracing::warn!(
                settings = changed.join(", "),
                "settings changed that need a restart to take full effect (listen addresses and the grace period keep their start-up values; a larger max_body_bytes applies to the 413, but bodies over the start-up gRPC decode limit fail the side stream)"
            );
        }
        shared.apply(&new).map(|()| new).map_err(|e| e.to_string())
    });
    match result {
        Ok(new) => {
            shared.metrics.reloaded("ok");
            let pods = new.all_pods().len();
            tracing::info!(models = new.models.len(), pods, strategy = %new.default_strategy_text, "configuration reloaded");
        }
        Err(reason) => {
            shared.metrics.reloaded("error");
            tracing::error!(%reason, "configuration rejected; keeping the previous one");
        }
    }
}

/// Watches for SIGHUP and file changes until `stop` changes; `startup` is the configuration
/// the process started with.
pub async fn run(
    source: ConfigSource,
    shared: Arc<Shared>,
    startup: Config,
    mut stop: watch::Receiver<bool>,
) {
    let mut hup = match signal(SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::error!(error = %e, "cannot install the SIGHUP handler; file polling only");
            None
        }
    };
    let mut seen = fingerprint(&source);
    let mut tick = tokio::time::interval(POLL_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let forced = tokio::select! {
            _ = async { match hup.as_mut() { Some(h) => { h.recv().await; } None => std::future::pending().await } } => true,
            _ = tick.tick() => false,
            _ = stop.changed() => return,
        };
        let now = fingerprint(&source);
        if forced {
            tracing::info!("SIGHUP received, reloading configuration");
        } else if now == seen || now.is_none() {
            continue;
        } else {
            tracing::info!("configuration file changed, reloading");
        }
        seen = now;
        reload_once(&source, &shared, &startup);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::from_toml as config;

    #[test]
    fn restart_only_settings_are_named_when_a_reload_changes_them() {
        let startup = config("[limits]\nmax_body_bytes = 4194304\nshutdown_grace_secs = 30");
        let same = config("[routing]\ndefault_strategy = \"random\"\n[limits]\nmax_body_bytes = 1024\nshutdown_grace_secs = 30");
        assert!(restart_only_changes(&startup, &same).is_empty());
        // 8 MiB bodies: 16 MiB buffered, within the start-up decode limit.
        let covered = config("[limits]\nmax_body_bytes = 8388608\nshutdown_grace_secs = 30");
        assert!(restart_only_changes(&startup, &covered).is_empty());
        let changed = config("[listen]\ngrpc = \"127.0.0.1:1\"\nadmin = \"127.0.0.1:2\"\n[limits]\nmax_body_bytes = 16777216\nshutdown_grace_secs = 5");
        let names = restart_only_changes(&startup, &changed);
        assert_eq!(names.len(), 4, "{names:?}");
        assert!(names[..3] == ["listen.grpc", "listen.admin", "limits.shutdown_grace_secs"]);
        assert!(names[3].starts_with("limits.max_body_bytes"));
    }
}
