//! One running kvroute inside Envoy: the router every worker thread routes on, and a thread of
//! the module's own running what is not per-request work.
//!
//! Why a thread of its own: engine scraping, active health checks, pod discovery (Kubernetes
//! watches), the router's timers, configuration file reload and the admin listener
//! (`/metrics` with kvroute's usual names, `/readyz`, `/debug/*`) are IO with timers, and
//! Envoy's worker threads must never block on them. Envoy's own stats would rename every
//! metric and have no histograms with kvroute's buckets or `/debug` pages; a side process
//! would need the very IPC the module exists to avoid. So the module runs the same code as
//! kvroute-ext-proc's background ([`kvroute_ext_proc::Background`]) on one tokio
//! current-thread runtime, on one thread named `kvroute`, and Envoy's workers touch only the
//! router (one short lock per decision and per release) and a few atomics.
//!
//! Instances are shared by name (the filter config's `filter_name`): when Envoy loads a new
//! configuration of the same filter (a listener update), the new text is applied to the
//! running router, keeping its in-flight counts, learned rates and index, as a reload of
//! kvroute-ext-proc's file does. The last filter configuration dropped stops the thread.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock, Weak};

use kvroute_ext_proc::config::{Config, ConfigSource, Overrides};
use kvroute_ext_proc::discovery::envoy::EnvoyFeed;
use kvroute_ext_proc::env::EnvSnapshot;
use kvroute_ext_proc::reload::Trigger;
use kvroute_ext_proc::shared::Shared;
use kvroute_ext_proc::Background;
use parking_lot::Mutex;

/// Running instances by filter name.
static INSTANCES: LazyLock<Mutex<HashMap<String, Weak<Instance>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Where an instance's configuration comes from: the filter config's text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigText {
    /// A path to a TOML file (the text is one line with no `=`): read at start, reloaded when
    /// the file changes.
    Path(PathBuf),
    /// The TOML itself: reloaded when Envoy applies a new filter configuration.
    Inline(String),
}

impl ConfigText {
    /// Reads the filter config's text (see the variants).
    pub fn parse(text: &str) -> ConfigText {
        let t = text.trim();
        if !t.is_empty() && !t.contains('\n') && !t.contains('=') && !t.starts_with('[') {
            ConfigText::Path(PathBuf::from(t))
        } else {
            ConfigText::Inline(text.to_owned())
        }
    }
}

/// Why an instance could not start or take a new configuration.
#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    /// The configuration is not valid.
    #[error("kvroute configuration: {0}")]
    Config(#[from] kvroute_ext_proc::config::ConfigError),
    /// The background could not start (router, admin listener).
    #[error("kvroute could not start: {0}")]
    Start(String),
}

/// One running kvroute.
#[derive(Debug)]
pub struct Instance {
    /// The router and settings every request reads.
    pub shared: Arc<Shared>,
    /// Where Envoy's view of the pods' cluster goes (`[discovery] source = "envoy"`).
    pub envoy_feed: Option<EnvoyFeed>,
    /// Where the configuration came from.
    text: Mutex<ConfigText>,
    source: ConfigSource,
    stop: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Instance {
    /// The instance named `name`: the running one, given `text` when it changed, or a new
    /// one started from `text`.
    pub fn get_or_start(name: &str, text: &str) -> Result<Arc<Instance>, InstanceError> {
        let parsed = ConfigText::parse(text);
        let mut all = INSTANCES.lock();
        if let Some(running) = all.get(name).and_then(Weak::upgrade) {
            running.update(parsed)?;
            return Ok(running);
        }
        let started = Arc::new(Instance::start(parsed)?);
        all.insert(name.to_owned(), Arc::downgrade(&started));
        drop(all);
        crate::fleet::replay(name, &started);
        Ok(started)
    }

    /// The running instance named `name`, if any.
    pub fn find(name: &str) -> Option<Arc<Instance>> {
        INSTANCES.lock().get(name).and_then(Weak::upgrade)
    }

    fn source_for(text: &ConfigText) -> ConfigSource {
        let mut seed = [0u8; 8];
        if getrandom::fill(&mut seed).is_err() {
            seed = 0x006b_7672_6f75_7465_u64.to_le_bytes();
        }
        ConfigSource {
            path: match text {
                ConfigText::Path(p) => Some(p.clone()),
                ConfigText::Inline(_) => None,
            },
            env: EnvSnapshot::from_process(),
            overrides: Overrides::default(),
            process_seed: u64::from_le_bytes(seed),
        }
    }

    fn load(source: &ConfigSource, text: &ConfigText) -> Result<Config, InstanceError> {
        Ok(match text {
            ConfigText::Path(_) => source.load()?,
            ConfigText::Inline(t) => source.load_bytes(t.as_bytes())?,
        })
    }

    fn start(text: ConfigText) -> Result<Instance, InstanceError> {
        crate::log::init();
        let source = Instance::source_for(&text);
        let config = Instance::load(&source, &text)?;
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let background_source = source.clone();
        let thread = std::thread::Builder::new()
            .name("kvroute".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let started =
                        Background::start(&config, background_source, Trigger::File).await;
                    match started {
                        Ok(background) => {
                            background.shared.set_ready(true);
                            tracing::info!(
                                admin = %background.admin_addr,
                                models = ?config.models.keys().collect::<Vec<_>>(),
                                default_strategy = %config.default_strategy_text,
                                "kvroute module serving"
                            );
                            let _ = ready_tx.send(Ok((
                                background.shared.clone(),
                                background.envoy_feed.clone(),
                            )));
                            let _ = stop_rx.await;
                            background.shared.set_ready(false);
                            drop(background);
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e.to_string()));
                        }
                    }
                });
            })
            .map_err(|e| InstanceError::Start(e.to_string()))?;
        let (shared, envoy_feed) = match ready_rx.recv() {
            Ok(Ok(started)) => started,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(InstanceError::Start(e));
            }
            Err(_) => {
                let _ = thread.join();
                return Err(InstanceError::Start("the kvroute thread ended".into()));
            }
        };
        Ok(Instance {
            shared,
            envoy_feed,
            text: Mutex::new(text),
            source,
            stop: Mutex::new(Some(stop_tx)),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Applies a new filter configuration text to the running router (nothing changes when
    /// the text is the same, or names the same file, which reloads itself).
    fn update(&self, text: ConfigText) -> Result<(), InstanceError> {
        let mut current = self.text.lock();
        if *current == text {
            return Ok(());
        }
        let mut source = self.source.clone();
        if let ConfigText::Path(p) = &text {
            source.path = Some(p.clone());
        }
        let config = Instance::load(&source, &text)?;
        self.shared
            .apply(&config)
            .map_err(|e| InstanceError::Start(e.to_string()))?;
        tracing::info!("kvroute configuration replaced by Envoy");
        *current = text;
        Ok(())
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.lock().take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_text_is_a_path_or_toml() {
        assert_eq!(
            ConfigText::parse(" /etc/kvroute/kvroute.toml\n"),
            ConfigText::Path("/etc/kvroute/kvroute.toml".into())
        );
        for inline in ["[models]\nm = []", "seed = 1", ""] {
            assert!(
                matches!(ConfigText::parse(inline), ConfigText::Inline(_)),
                "{inline:?}"
            );
        }
    }
}
