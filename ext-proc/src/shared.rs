//! State shared by every ext_proc stream: the router behind a `parking_lot` mutex, the
//! process clock, the per-request settings, and the metrics.
//!
//! Locking rule: the router lock is held only for `admit` (`route`), `complete`,
//! `handle_timeout`, admission's `dispatch`, `cancel_queued` and `expire_queued`,
//! reconfiguration and stats snapshots; prompts are hashed outside it. Admission's registry of
//! held requests ([`Holds`]) is taken before the router lock when both are needed (its pump),
//! never after.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use kvroute_core::{PodSpec, Router, Timestamp};
use parking_lot::{Mutex, RwLock};
use prometheus_client::registry::Registry;

use crate::admission::{self, Holds};
use crate::config::Config;
use crate::engines::EngineTable;
use crate::introspect::DecisionLog;
use crate::metrics::Metrics;
use crate::stream_timing::StreamBudget;
use crate::tokenize::Tokenizers;

/// The settings a request reads, swapped as a whole on reload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestSettings {
    /// Largest body routed (413 above).
    pub max_body_bytes: usize,
    /// Default strategy as written (echoed in `routing-strategy`).
    pub default_strategy_text: String,
    /// Model for requests without a body: `[routing] default_model`, else the configured model
    /// whose name comes first in byte order (the models are a sorted map, not in file order).
    pub default_model: Option<String>,
    /// Time between two engine metrics scrapes; `None` = off.
    pub scrape_interval: Option<std::time::Duration>,
    /// Time one scrape may take (and one active health check).
    pub scrape_timeout: std::time::Duration,
    /// Whether clients see `target-pod`, `target-pod-ip` and `x-kvroute-decision`
    /// (`[routing] expose_pod_headers`, default true as in AIBrix).
    pub expose_pod_headers: bool,
    /// The active check when scraping is off: `(interval, path)`; `None` = off.
    pub health_check: Option<(std::time::Duration, String)>,
    /// The router model every request is routed under, when discovery decides it (an
    /// InferencePool's); `None`: the request's own model.
    pub routing_model: Option<String>,
    /// Most responses timed at once ([`crate::stream_timing`]; 0 = none).
    pub max_timed_streams: usize,
    /// The engines' KV block size in tokens (`[ttft] engine_block_tokens`): a request predicted
    /// to prefill at least this many is a cold prefill ([`kvroute_core::Prediction::timing_budget`]).
    pub engine_block_tokens: u32,
    /// How a request's admission priority and tenant are read (`[admission]`).
    pub admission: crate::admission::AdmissionHeaders,
}

impl RequestSettings {
    fn from_config(c: &Config) -> Self {
        RequestSettings {
            max_body_bytes: c.max_body_bytes,
            default_strategy_text: c.default_strategy_text.clone(),
            default_model: c
                .default_model
                .clone()
                .or_else(|| c.models.keys().next().cloned()),
            scrape_interval: c.scrape_interval,
            scrape_timeout: c.scrape_timeout,
            health_check: c.health_check.clone(),
            expose_pod_headers: c.expose_pod_headers,
            routing_model: c.discovery.routing_model(),
            max_timed_streams: c.max_timed_streams,
            engine_block_tokens: c.router.ttft.engine_block_tokens,
            admission: c.admission.headers.clone(),
        }
    }
}

/// Why a configuration could not be applied to the running router.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApplyError {
    /// The router rejected its parameters.
    #[error(transparent)]
    Router(#[from] kvroute_core::ConfigError),
    /// The router rejected a pod.
    #[error(transparent)]
    Pod(#[from] kvroute_core::RegistryError),
    /// A model's tokenizer did not load.
    #[error(transparent)]
    Tokenizer(#[from] crate::tokenize::TokenizerLoadError),
    /// The router rejected an admission policy.
    #[error(transparent)]
    Admission(#[from] kvroute_core::AdmissionPolicyError),
}

/// Shared service state.
#[derive(Debug)]
pub struct Shared {
    /// The routing core. Lock it briefly.
    pub router: Arc<Mutex<Router>>,
    /// Live metrics.
    pub metrics: Metrics,
    /// The latest engine snapshot per pod name, written by the engine scraper. Never lock it
    /// while holding the router lock's guard across it (take them one after the other).
    pub engines: EngineTable,
    /// The responses being timed ([`crate::stream_timing`]).
    pub stream_budget: Arc<StreamBudget>,
    /// The last routing decisions, for `/debug/decisions` ([`crate::introspect`]).
    pub decisions: DecisionLog,
    /// The requests admission holds ([`crate::admission`]).
    pub holds: Holds,
    /// The configuration in force (for `/debug/config`).
    config: RwLock<Arc<Config>>,
    /// The models' tokenizers ([`crate::tokenize`]), swapped as a whole on reload.
    tokenizers: RwLock<Arc<Tokenizers>>,
    /// Tokenizations running at once in kvroute-ext-proc ([`Tokenizers::permits`]).
    pub tokenize_permits: tokio::sync::Semaphore,
    start: tokio::time::Instant,
    settings: RwLock<Arc<RequestSettings>>,
    /// The engines' KV block size taken as `[ttft] engine_block_tokens` while the configuration
    /// leaves it unset ([`Shared::adopt_engine_block`]); locked before the router.
    engine_block: Mutex<Option<u32>>,
    ready: AtomicBool,
    /// Discovery has completed its first list (always, for static pods).
    discovery_synced: AtomicBool,
}

impl Shared {
    /// The models' tokenizers.
    pub fn tokenizers(&self) -> Arc<Tokenizers> {
        self.tokenizers.read().clone()
    }

    /// Builds the router from `config`, registers metrics, and adds the configured pods.
    pub fn new(config: &Config, registry: &mut Registry) -> Result<Arc<Shared>, ApplyError> {
        let router = Arc::new(Mutex::new(Router::new(config.router.clone())?));
        let engines = EngineTable::default();
        let metrics = Metrics::register(registry, router.clone(), engines.clone());
        let shared = Shared {
            router,
            metrics,
            engines,
            stream_budget: Arc::default(),
            decisions: DecisionLog::default(),
            holds: Holds::default(),
            config: RwLock::new(Arc::new(config.clone())),
            tokenizers: RwLock::new(Arc::new(Tokenizers::load(
                &config.tokenizers,
                &Tokenizers::default(),
            )?)),
            tokenize_permits: tokio::sync::Semaphore::new(Tokenizers::permits()),
            start: tokio::time::Instant::now(),
            settings: RwLock::new(Arc::new(RequestSettings::from_config(config))),
            engine_block: Mutex::new(None),
            ready: AtomicBool::new(false),
            discovery_synced: AtomicBool::new(config.discovery.is_static()),
        };
        shared.apply(config)?;
        Ok(Arc::new(shared))
    }

    /// Milliseconds since process start, as the core's [`Timestamp`].
    pub fn now(&self) -> Timestamp {
        let ms = self.start.elapsed().as_millis();
        Timestamp::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
    }

    /// The configuration in force.
    pub fn config(&self) -> Arc<Config> {
        self.config.read().clone()
    }

    /// The current per-request settings.
    pub fn settings(&self) -> Arc<RequestSettings> {
        self.settings.read().clone()
    }

    /// Whether `/readyz` says ready: serving, and discovery has listed the pods once.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire) && self.discovery_synced.load(Ordering::Acquire)
    }

    /// Whether the service is serving and not draining (discovery aside).
    pub fn is_serving(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Records whether discovery has completed its first list.
    pub fn set_discovery_synced(&self, synced: bool) {
        self.discovery_synced.store(synced, Ordering::Release);
    }

    /// Sets readiness (true once serving, false when shutting down).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    /// Sets `model`'s admission policy from the configuration in force (for a model
    /// discovery has just added; [`Shared::apply`] sets every known model's on reload). A
    /// model the router does not know is left alone.
    pub fn apply_admission(&self, router: &mut Router, model: &str) {
        let policy = self.config().admission.policy(model);
        // Validated with the configuration: only an unknown model can be refused.
        let _ = router.set_admission(model, policy);
    }

    /// Applies a validated configuration to the running router without losing in-flight
    /// state: router parameters via `reconfigure`; pods added, updated, detached from models
    /// they no longer serve, or removed (their open tickets become orphans the core accepts);
    /// every pod's engine capacity set (its `max_seqs`, else `[ttft] max_seqs`); every
    /// configured model registered, so one without pods answers 503 rather than 400; models
    /// no longer configured removed, so they answer 400 (`model_not_found`) again; every
    /// model's admission policy set from `[admission]` (also the models discovery has added),
    /// and the held requests offered again.
    /// On a router error nothing of the request settings changes; pod and model changes
    /// applied before the error stay (they were individually valid).
    ///
    /// While the configuration leaves `[ttft] engine_block_tokens` unset, the block size taken
    /// from the engines ([`Shared::adopt_engine_block`]) stays in force.
    pub fn apply(&self, config: &Config) -> Result<(), ApplyError> {
        // First, so that a tokenizer that does not load leaves everything as it was.
        let tokenizers = Arc::new(Tokenizers::load(
            &config.tokenizers,
            &self.tokenizers.read(),
        )?);
        let adopted = self.engine_block.lock();
        let patched;
        let config = match *adopted {
            Some(block) if config.engine_block_from_engines => {
                patched = with_engine_block(config, block);
                &patched
            }
            _ => config,
        };
        let mut router = self.router.lock();
        router.reconfigure(config.router.clone())?;
        if !config.discovery.is_static() {
            // Pods and models come from discovery ([`crate::discovery`]).
            admission::apply_policies(&mut router, &config.admission)?;
            drop(router);
            self.holds.kick();
            *self.settings.write() = Arc::new(RequestSettings::from_config(config));
            *self.config.write() = Arc::new(config.clone());
            *self.tokenizers.write() = tokenizers;
            return Ok(());
        }
        // Models first: removing one detaches its pods in a single walk of the index.
        for model in router.models() {
            if !config.models.contains_key(&*model) {
                router.remove_model(&model)?;
            }
        }
        let mut wanted: BTreeMap<String, BTreeSet<&str>> = BTreeMap::new();
        for (model, pods) in &config.models {
            // A configured model without pods answers 503 (no ready pod), not 400.
            router.add_model(model)?;
            for pod in pods {
                let size = pod.data_parallel_size.unwrap_or(1);
                for (name, rank) in crate::data_parallel::engines(&pod.name, size) {
                    let id = router.add_pod(
                        model,
                        PodSpec {
                            name: &name,
                            address: &pod.address,
                            ready: true,
                        },
                    )?;
                    let max_seqs = pod.max_seqs.unwrap_or(config.router.ttft.max_seqs);
                    router.set_pod_capacity(id, max_seqs)?;
                    router.set_pod_data_parallel_rank(id, rank)?;
                    wanted.entry(name).or_default().insert(model.as_str());
                }
            }
        }
        for info in router.pods() {
            match wanted.get(&*info.name) {
                None => router.remove_pod(info.id)?,
                Some(models) => {
                    for m in &info.models {
                        if !models.contains(&**m) {
                            router.detach_pod(m, info.id)?;
                        }
                    }
                }
            }
        }
        admission::apply_policies(&mut router, &config.admission)?;
        drop(router);
        self.holds.kick();
        *self.settings.write() = Arc::new(RequestSettings::from_config(config));
        *self.config.write() = Arc::new(config.clone());
        *self.tokenizers.write() = tokenizers;
        Ok(())
    }

    /// Takes `block`, the KV block size in tokens the engines report, as least-ttft's
    /// `engine_block_tokens` (router, request settings and the configuration in force), if the
    /// configuration leaves it unset; a later reload keeps it. Returns whether the value in
    /// force changed (`false` also when the configuration sets it).
    pub fn adopt_engine_block(&self, block: u32) -> Result<bool, ApplyError> {
        // Before reading the configuration: a reload ([`Shared::apply`]) holds it throughout.
        let mut adopted = self.engine_block.lock();
        let config = self.config();
        if !config.engine_block_from_engines || *adopted == Some(block) {
            return Ok(false);
        }
        let changed = config.router.ttft.engine_block_tokens != block;
        let config = with_engine_block(&config, block);
        if changed {
            self.router.lock().reconfigure(config.router.clone())?;
            *self.settings.write() = Arc::new(RequestSettings::from_config(&config));
            *self.config.write() = Arc::new(config);
        }
        *adopted = Some(block);
        Ok(changed)
    }
}

/// `config` with `[ttft] engine_block_tokens` = `block`.
fn with_engine_block(config: &Config, block: u32) -> Config {
    let mut config = config.clone();
    config.router.ttft.engine_block_tokens = block;
    config
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::from_toml;

    /// `(name, address, rank)` of every router pod, sorted.
    fn pods(shared: &Shared) -> Vec<(String, String, Option<u32>)> {
        let mut v: Vec<_> = shared
            .router
            .lock()
            .pods()
            .into_iter()
            .map(|p| {
                (
                    p.name.to_string(),
                    p.address.to_string(),
                    p.data_parallel_rank,
                )
            })
            .collect();
        v.sort();
        v
    }

    fn dp_config(size: &str) -> Config {
        from_toml(&format!("[models.m]\npods = [{{ name = \"a\", address = \"127.0.0.1:1\"{size} }}, {{ name = \"b\", address = \"127.0.0.1:2\" }}]\n"))
    }

    #[test]
    fn a_data_parallel_pod_is_one_router_pod_per_rank_and_reloads_change_them() {
        let shared = Shared::new(
            &dp_config(", data_parallel_size = 3"),
            &mut Registry::default(),
        )
        .unwrap();
        let at = |n: &str, a: &str, r| (n.to_owned(), a.to_owned(), r);
        assert_eq!(
            pods(&shared),
            [
                at("a/dp0", "127.0.0.1:1", Some(0)),
                at("a/dp1", "127.0.0.1:1", Some(1)),
                at("a/dp2", "127.0.0.1:1", Some(2)),
                at("b", "127.0.0.1:2", None),
            ]
        );
        shared
            .apply(&dp_config(", data_parallel_size = 2"))
            .unwrap();
        assert_eq!(pods(&shared).len(), 3, "{:?}", pods(&shared));
        shared.apply(&dp_config("")).unwrap();
        assert_eq!(
            pods(&shared),
            [at("a", "127.0.0.1:1", None), at("b", "127.0.0.1:2", None)]
        );
    }

    #[test]
    fn the_readme_data_parallel_example_loads_as_documented() {
        let readme = include_str!("../README.md");
        let section = &readme[readme.find("### Data-parallel servers").unwrap()..];
        let block = section.split("```toml\n").nth(1).unwrap();
        let toml = &block[..block.find("```").unwrap()];
        let shared = Shared::new(&from_toml(toml), &mut Registry::default()).unwrap();
        let want: Vec<_> = (0..4)
            .map(|r| (format!("dsv3-0/dp{r}"), "10.0.0.5:8000".to_owned(), Some(r)))
            .collect();
        assert_eq!(pods(&shared), want);
    }

    #[test]
    fn the_engines_block_size_is_taken_only_when_unset_and_survives_reloads() {
        let pods = "[models.m]\npods = [{ name = \"a\", address = \"127.0.0.1:1\" }]\n";
        let block = |shared: &Shared| {
            let in_router = shared.router.lock().config().ttft.engine_block_tokens;
            let in_settings = shared.settings().engine_block_tokens;
            let in_config = shared.config().router.ttft.engine_block_tokens;
            assert_eq!((in_settings, in_config), (in_router, in_router));
            in_router
        };
        let unset = from_toml(pods);
        let shared = Shared::new(&unset, &mut Registry::default()).unwrap();
        assert_eq!(
            block(&shared),
            16,
            "the core's default until an engine reports"
        );
        assert!(shared.adopt_engine_block(1568).unwrap());
        assert_eq!(block(&shared), 1568);
        assert!(!shared.adopt_engine_block(1568).unwrap(), "no change");
        // A reload that still leaves it unset keeps the engines' value.
        shared.apply(&unset).unwrap();
        assert_eq!(block(&shared), 1568);
        // A reload that sets it wins, and the engines' value is no longer taken.
        let set = from_toml(&format!("[ttft]\nengine_block_tokens = 32\n{pods}"));
        shared.apply(&set).unwrap();
        assert_eq!(block(&shared), 32);
        assert!(!shared.adopt_engine_block(64).unwrap());
        assert_eq!(block(&shared), 32);
        // Unset again: the value the engines reported last applies until they report another.
        shared.apply(&unset).unwrap();
        assert_eq!(block(&shared), 1568);
        assert!(shared.adopt_engine_block(16).unwrap());
        assert_eq!(block(&shared), 16);
    }
}
