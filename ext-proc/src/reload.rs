//! Configuration reload on SIGHUP and on file change.
//!
//! Contract:
//! - The file is polled every [`POLL_INTERVAL`] (its bytes, through symlinks, so a Kubernetes
//!   ConfigMap's symlink swap is seen as well as an editor writing in place). A change is read
//!   only once the file has stayed the same for a whole interval: a file written in several
//!   steps is not read half-written, unless the writer pauses longer than that. SIGHUP reads it
//!   at once.
//! - The bytes read are parsed and validated whole ([`ConfigSource::load_bytes`], the same
//!   layering as at start-up) and applied only if valid; otherwise the last good configuration
//!   stays in force. The validation refuses what a cut-short file looks like: no model at all,
//!   or a model without pods, unless the file says so (`[routing] allow_no_models`,
//!   `[models.NAME] allow_no_pods`).
//! - Each reload counts in `kvroute_config_reloads_total{result="ok"|"error"}` and logs the pods
//!   added, removed and moved (address changed), or the reason it was refused.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

use crate::config::{Config, ConfigSource};
use crate::shared::Shared;

/// How often the file is checked for changes (and how long a change must stay before it is
/// read).
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// The file's bytes, or `None` when it cannot be read now.
fn read(source: &ConfigSource) -> Option<Vec<u8>> {
    std::fs::read(source.path.as_ref()?).ok()
}

/// What a reload changes in the pods: `(added, removed, moved)`, names in order.
pub fn pod_changes(old: &Config, new: &Config) -> (Vec<String>, Vec<String>, Vec<String>) {
    let index = |c: &Config| -> BTreeMap<String, String> {
        c.all_pods()
            .into_iter()
            .map(|p| (p.name.clone(), p.address.clone()))
            .collect()
    };
    let (old, new) = (index(old), index(new));
    let added = new
        .keys()
        .filter(|n| !old.contains_key(*n))
        .cloned()
        .collect();
    let removed = old
        .keys()
        .filter(|n| !new.contains_key(*n))
        .cloned()
        .collect();
    let moved = new
        .iter()
        .filter(|(n, a)| old.get(*n).is_some_and(|o| o != *a))
        .map(|(n, _)| n.clone())
        .collect();
    (added, removed, moved)
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
    if new.discovery != startup.discovery {
        changed.push("discovery");
    }
    if new.tls != startup.tls {
        changed.push("listen.tls");
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

/// Validates `bytes` as the configuration file and applies it, or logs why not; `current` is
/// the configuration in force (replaced on success), `startup` the one the process started
/// with (for [`restart_only_changes`]). Returns whether it was applied.
pub fn reload_bytes(
    source: &ConfigSource,
    bytes: &[u8],
    shared: &Shared,
    startup: &Config,
    current: &mut Config,
) -> bool {
    let result = source
        .load_bytes(bytes)
        .map_err(|e| e.to_string())
        .and_then(|new| {
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
            let (added, removed, moved) = pod_changes(current, &new);
            tracing::info!(
                models = new.models.len(),
                pods = new.all_pods().len(),
                strategy = %new.default_strategy_text,
                added = ?added,
                removed = ?removed,
                moved = ?moved,
                "configuration reloaded"
            );
            *current = new;
            true
        }
        Err(reason) => {
            shared.metrics.reloaded("error");
            tracing::error!(%reason, "configuration rejected; keeping the previous one");
            false
        }
    }
}

/// How a running configuration is reloaded from its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// On file change and on SIGHUP (the kvroute-ext-proc process).
    FileAndSighup,
    /// On file change only: inside another program (Envoy, which owns its signals).
    File,
}

/// Installs the SIGHUP handler now (per `trigger`) and returns the task that watches for file
/// changes and SIGHUP until `stop` changes (see the module docs); `startup` is the
/// configuration the process started with. The handler is installed by this call, not when the
/// task first runs: SIGHUP's default action ends the process, and a spawned task may first run
/// after the process has said it listens (with one worker, always). Must be called within a
/// Tokio runtime.
pub fn run(
    source: ConfigSource,
    shared: Arc<Shared>,
    startup: Config,
    trigger: Trigger,
    stop: watch::Receiver<bool>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let hup = match trigger {
        Trigger::File => None,
        Trigger::FileAndSighup => match signal(SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::error!(error = %e, "cannot install the SIGHUP handler; file polling only");
                None
            }
        },
    };
    watch_for_changes(source, shared, startup, hup, stop)
}

/// The task [`run`] returns: polls the file and waits on SIGHUP (`hup`, when installed).
async fn watch_for_changes(
    source: ConfigSource,
    shared: Arc<Shared>,
    startup: Config,
    mut hup: Option<tokio::signal::unix::Signal>,
    mut stop: watch::Receiver<bool>,
) {
    let mut current = startup.clone();
    // The bytes last read (applied or refused), and a change seen but not yet stable.
    let mut seen = read(&source);
    let mut pending: Option<Vec<u8>> = None;
    let mut tick = tokio::time::interval(POLL_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let forced = tokio::select! {
            _ = async { match hup.as_mut() { Some(h) => { h.recv().await; } None => std::future::pending().await } } => true,
            _ = tick.tick() => false,
            _ = stop.changed() => return,
        };
        let Some(now) = read(&source) else {
            if forced {
                tracing::error!(path = ?source.path, "SIGHUP: configuration file unreadable; keeping the previous one");
                shared.metrics.reloaded("error");
            }
            continue;
        };
        if forced {
            tracing::info!("SIGHUP received, reloading configuration");
        } else if Some(&now) == seen.as_ref() {
            pending = None;
            continue;
        } else if pending.as_ref() != Some(&now) {
            // Changed since the last look: read it once it has stayed so for an interval.
            pending = Some(now);
            continue;
        } else {
            tracing::info!("configuration file changed, reloading");
        }
        pending = None;
        reload_bytes(&source, &now, &shared, &startup, &mut current);
        seen = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::from_toml as config;

    fn source() -> ConfigSource {
        ConfigSource {
            path: Some("kvroute.toml".into()),
            env: crate::env::EnvSnapshot::default(),
            overrides: crate::config::Overrides::default(),
            process_seed: 1,
        }
    }

    const TWO: &str = "[models.m]\npods = [{ name = \"a\", address = \"10.0.0.1:80\" }, { name = \"b\", address = \"10.0.0.2:80\" }]";

    #[test]
    fn a_reload_is_applied_whole_or_not_at_all() {
        let start = source().load_bytes(TWO.as_bytes()).unwrap();
        let shared = Shared::new(
            &start,
            &mut prometheus_client::registry::Registry::default(),
        )
        .unwrap();
        let mut current = start.clone();
        let refused = [
            "",                                                                             // an empty file
            "[models.m]\npods = [",  // cut mid-way
            "[models.m]\npods = []", // every pod gone
            "[models.m]\npods = [{ name = \"a\", address = \"10.0.0.1:80\" }]\n[models.n]", // a model without pods
            "[routing]\nallow_no_models = false\n", // no model, not allowed
        ];
        for text in refused {
            assert!(
                !reload_bytes(&source(), text.as_bytes(), &shared, &start, &mut current),
                "applied: {text:?}"
            );
            assert_eq!(current, start);
            assert_eq!(shared.router.lock().pods().len(), 2, "{text:?}");
        }
        // Said explicitly, they apply.
        let empty_model = "[models.m]\nallow_no_pods = true\npods = []";
        assert!(reload_bytes(
            &source(),
            empty_model.as_bytes(),
            &shared,
            &start,
            &mut current
        ));
        assert!(shared.router.lock().pods().is_empty());
        let nothing = "[routing]\nallow_no_models = true";
        assert!(reload_bytes(
            &source(),
            nothing.as_bytes(),
            &shared,
            &start,
            &mut current
        ));
        assert!(shared.router.lock().models().is_empty());
    }

    #[test]
    fn pod_changes_name_the_pods_added_removed_and_moved() {
        let old = config(TWO);
        let new = config("[models.m]\npods = [{ name = \"b\", address = \"10.0.0.9:80\" }, { name = \"c\", address = \"10.0.0.3:80\" }]");
        let (added, removed, moved) = pod_changes(&old, &new);
        assert_eq!(
            (added, removed, moved),
            (
                vec!["c".to_owned()],
                vec!["a".to_owned()],
                vec!["b".to_owned()]
            )
        );
    }

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
