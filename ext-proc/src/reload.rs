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

/// Loads and applies the configuration once. Returns the new config, or logs why not.
pub fn reload_once(source: &ConfigSource, shared: &Shared, current: &Config) -> Option<Config> {
    let result = source.load().map_err(|e| e.to_string()).and_then(|new| {
        if new.grpc_listen != current.grpc_listen || new.admin_listen != current.admin_listen {
            tracing::warn!(
                "listen addresses changed in the file; they take effect only after a restart"
            );
        }
        shared.apply(&new).map(|()| new).map_err(|e| e.to_string())
    });
    match result {
        Ok(new) => {
            shared.metrics.reloaded("ok");
            let pods = new.all_pods().len();
            tracing::info!(models = new.models.len(), pods, strategy = %new.default_strategy_text, "configuration reloaded");
            Some(new)
        }
        Err(reason) => {
            shared.metrics.reloaded("error");
            tracing::error!(%reason, "configuration rejected; keeping the previous one");
            None
        }
    }
}

/// Watches for SIGHUP and file changes until `stop` changes.
pub async fn run(
    source: ConfigSource,
    shared: Arc<Shared>,
    mut current: Config,
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
        if let Some(new) = reload_once(&source, &shared, &current) {
            current = new;
        }
    }
}
