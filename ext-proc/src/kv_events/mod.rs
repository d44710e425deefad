//! Engine views from the engines' own KV-cache events (`[kv_events."<model>"]`): per pod, a
//! ZMQ SUB to the vLLM publisher its engine runs with `--kv-events-config`, whose decoded
//! batches feed the core's engine view of that pod ([`kvroute_core::Router::apply_kv_events`]).
//! Token-keyed requests (the model has a tokenizer) then match the pod against what its engine
//! holds, not against what kvroute routed to it; decisions say `view=engine`.
//!
//! ## Contract
//! - **Which pods**: every pod serving a model with a `[kv_events."<model>"]` section (the
//!   router model: the `[models.NAME]` name, the AIBrix label's model, or the InferencePool's
//!   name). Its endpoint is the section's template with `{host}`, `{port}` and `{name}`
//!   replaced by the pod's address host, port and name, or the pod entry's own
//!   `kv_events_endpoint` (static pods). Engine R of a data-parallel server
//!   ([`crate::data_parallel`]) subscribes to that endpoint (and replay endpoint) with the port
//!   plus R, where vLLM's rank R publishes; `{name}` is the server's name. Pods added, moved
//!   or removed (reload, discovery) get their subscriptions started, restarted or stopped
//!   within [`RECONCILE_EVERY`].
//! - **Gaps** (a lost message, a subscriber that joined late, an undecodable batch): repaired
//!   from the replay endpoint when one is configured (`replay_endpoint`, the same
//!   placeholders); otherwise, or when the replay cannot cover the gap, the view is stale
//!   (ingested, not used) until the engine clears its cache or restarts. A publisher restart
//!   (its numbers start again) restarts the view.
//! - **Events that stop**: a pod whose subscription is down for `silence_ms` loses its view;
//!   a pod sent a request with blocks its engine did not hold `silence_ms` ago, with no batch
//!   back since, has its view suspended (kept, fed, not used) until the next batch (requests
//!   whose prompts are cached make the engine store nothing, so they raise no suspicion). Either way it is matched against the
//!   router-side index meanwhile, and both show in `/metrics`
//!   (`kvroute_kv_view_state{pod,state}`) and in the log. A pod whose engine never publishes
//!   simply has no view.
//! - Nothing here holds the router lock across an await: batches are decoded and converted
//!   outside it, and each is applied in one short lock.

mod convert;
pub mod status;
mod subscriber;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use kvroute_core::PodId;
use serde::Deserialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::data_parallel;
use crate::shared::Shared;
pub use convert::Converted;
pub use status::{KvEventsStatus, PodStatus};

/// How often the subscriptions are matched to the pods.
pub const RECONCILE_EVERY: Duration = Duration::from_secs(1);
/// Default `silence_ms`: longer than a request waits in a loaded engine's queue before its
/// blocks are computed, as the 30 s pending window of the core's engine views.
pub const DEFAULT_SILENCE: Duration = Duration::from_secs(30);
/// Default `connect_timeout_ms`, also the longest wait between two connection attempts.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Default `replay_timeout_ms`.
pub const DEFAULT_REPLAY_TIMEOUT: Duration = Duration::from_secs(2);

/// `[kv_events."<model>"]` as written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvEventsSection {
    /// The publisher of each pod: a `tcp://` template with `{host}`, `{port}`, `{name}`
    /// (e.g. `tcp://{host}:5557`, vLLM's default port).
    pub endpoint: String,
    /// The replay (ROUTER) endpoint template, when the engines run with `replay_endpoint`.
    #[serde(default)]
    pub replay_endpoint: Option<String>,
    /// The topic prefix subscribed to (vLLM's `topic`; default empty: everything).
    #[serde(default)]
    pub topic: Option<String>,
    /// See the module docs; default 30 000.
    #[serde(default)]
    pub silence_ms: Option<u64>,
    /// Longest wait for a connection; default 2 000.
    #[serde(default)]
    pub connect_timeout_ms: Option<u64>,
    /// Longest wait for a replay; default 2 000.
    #[serde(default)]
    pub replay_timeout_ms: Option<u64>,
}

/// A model's validated `[kv_events]` settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvEventsSpec {
    /// The publisher endpoint template.
    pub endpoint: String,
    /// The replay endpoint template.
    pub replay_endpoint: Option<String>,
    /// The topic prefix.
    pub topic: String,
    /// See the module docs.
    pub silence: Duration,
    /// Connection timeout.
    pub connect_timeout: Duration,
    /// Replay timeout.
    pub replay_timeout: Duration,
}

const PLACEHOLDERS: [&str; 3] = ["{host}", "{port}", "{name}"];

fn check_template(model: &str, key: &str, t: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("[kv_events.\"{model}\"] {key} {t:?}: {why}"));
    if !t.starts_with("tcp://") {
        return bad("must start with tcp://");
    }
    let mut rest = t.to_owned();
    for p in PLACEHOLDERS {
        rest = rest.replace(p, "");
    }
    if rest.contains('{') || rest.contains('}') {
        return bad("the only placeholders are {host}, {port} and {name}");
    }
    Ok(())
}

fn millis(v: Option<u64>, default: Duration, model: &str, key: &str) -> Result<Duration, String> {
    match v {
        None => Ok(default),
        Some(0) => Err(format!("[kv_events.\"{model}\"] {key} must be at least 1")),
        Some(ms) => Ok(Duration::from_millis(ms)),
    }
}

impl KvEventsSection {
    /// Validates the section of `model`.
    pub fn to_spec(&self, model: &str) -> Result<KvEventsSpec, String> {
        check_template(model, "endpoint", &self.endpoint)?;
        if let Some(r) = &self.replay_endpoint {
            check_template(model, "replay_endpoint", r)?;
        }
        Ok(KvEventsSpec {
            endpoint: self.endpoint.clone(),
            replay_endpoint: self.replay_endpoint.clone(),
            topic: self.topic.clone().unwrap_or_default(),
            silence: millis(self.silence_ms, DEFAULT_SILENCE, model, "silence_ms")?,
            connect_timeout: millis(
                self.connect_timeout_ms,
                DEFAULT_CONNECT_TIMEOUT,
                model,
                "connect_timeout_ms",
            )?,
            replay_timeout: millis(
                self.replay_timeout_ms,
                DEFAULT_REPLAY_TIMEOUT,
                model,
                "replay_timeout_ms",
            )?,
        })
    }
}

/// Validates every `[kv_events."<model>"]` section and the pods' own endpoints. A model with
/// events must be configured (static pods) and have a tokenizer (its requests must be keyed by
/// token blocks to match what engines report), except under an InferencePool, whose router
/// model is the pool's name while tokenizers are looked up by the requests' model.
pub fn validate(
    sections: &BTreeMap<String, KvEventsSection>,
    tokenizers: &BTreeMap<String, crate::tokenize::TokenizerSection>,
    models: &BTreeMap<String, Vec<crate::config::PodEntry>>,
    discovery: &crate::discovery::Discovery,
) -> Result<BTreeMap<String, KvEventsSpec>, String> {
    let mut out = BTreeMap::new();
    for (model, section) in sections {
        let spec = section.to_spec(model)?;
        if discovery.is_static() && !models.contains_key(model) {
            return Err(format!(
                "[kv_events.\"{model}\"]: {model:?} is not a configured model"
            ));
        }
        if discovery.routing_model().is_none() && !tokenizers.contains_key(model) {
            return Err(format!("[kv_events.\"{model}\"] needs [tokenizers.\"{model}\"]: engines report token blocks, which only token-keyed requests match"));
        }
        out.insert(model.clone(), spec);
    }
    for (model, pods) in models {
        for pod in pods {
            let own = [
                ("kv_events_endpoint", &pod.kv_events_endpoint),
                ("kv_events_replay_endpoint", &pod.kv_events_replay_endpoint),
            ];
            for (key, value) in own {
                let Some(v) = value else { continue };
                if !sections.contains_key(model) {
                    return Err(format!("pod {:?} has {key} but model {model:?} has no [kv_events.\"{model}\"] section", pod.name));
                }
                if !v.starts_with("tcp://") {
                    return Err(format!(
                        "pod {:?} {key} {v:?} must start with tcp://",
                        pod.name
                    ));
                }
            }
            if let (Some(spec), Some(size @ 2..)) = (out.get(model), pod.data_parallel_size) {
                // Every rank's endpoints have a port to offset (checked for the last rank).
                let endpoints = [
                    pod.kv_events_endpoint
                        .clone()
                        .unwrap_or_else(|| expand(&spec.endpoint, &pod.name, &pod.address)),
                    pod.kv_events_replay_endpoint
                        .clone()
                        .or_else(|| {
                            spec.replay_endpoint
                                .as_deref()
                                .map(|r| expand(r, &pod.name, &pod.address))
                        })
                        .unwrap_or_default(),
                ];
                for ep in endpoints.iter().filter(|ep| !ep.is_empty()) {
                    if data_parallel::offset_port(ep, size - 1).is_none() {
                        return Err(format!("pod {:?} (data_parallel_size {size}): KV-event endpoint {ep:?} needs a port that rank {} can offset", pod.name, size - 1));
                    }
                }
            }
            if pod.kv_events_replay_endpoint.is_some() && pod.kv_events_endpoint.is_none() {
                return Err(format!(
                    "pod {:?} has kv_events_replay_endpoint without kv_events_endpoint",
                    pod.name
                ));
            }
        }
    }
    Ok(out)
}

/// `template` for the pod `name` at `address` (`host:port`, `[v6]:port`).
pub fn expand(template: &str, name: &str, address: &str) -> String {
    let (host, port) = match address.rsplit_once(':') {
        Some((h, p)) if !p.contains(']') => (h, p),
        _ => (address, ""),
    };
    template
        .replace("{host}", host)
        .replace("{port}", port)
        .replace("{name}", name)
}

/// Where one pod's events come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The pod's name (metrics and logs).
    pub pod: String,
    /// The model whose section applies.
    pub model: String,
    /// Publisher endpoint.
    pub endpoint: String,
    /// Replay endpoint.
    pub replay_endpoint: Option<String>,
    /// The model's settings.
    pub spec: KvEventsSpec,
    /// The block size the model's requests are keyed at, when it has a tokenizer.
    pub request_block_tokens: Option<u32>,
}

/// The subscriptions the configuration and the pods call for, by pod.
fn targets(shared: &Shared) -> HashMap<PodId, Target> {
    let config = shared.config();
    if config.kv_events.is_empty() {
        return HashMap::new();
    }
    // Static pods may name their own endpoints.
    let mut own: BTreeMap<&str, (&str, Option<&str>)> = BTreeMap::new();
    for pod in config.models.values().flatten() {
        if let Some(ep) = &pod.kv_events_endpoint {
            own.insert(&pod.name, (ep, pod.kv_events_replay_endpoint.as_deref()));
        }
    }
    let pods = shared.router.lock().pods();
    let mut out = HashMap::new();
    for p in pods {
        let Some((model, spec)) = p
            .models
            .iter()
            .find_map(|m| config.kv_events.get(&**m).map(|s| (m, s)))
        else {
            continue;
        };
        // An engine of a data-parallel server: the server's endpoints, port + rank.
        let rank = p.data_parallel_rank;
        let server = data_parallel::server_name(&p.name, rank);
        let (endpoint, replay_endpoint) = match own.get(server) {
            Some((ep, replay)) => (ep.to_string(), replay.map(str::to_owned)),
            None => (
                expand(&spec.endpoint, server, &p.address),
                spec.replay_endpoint
                    .as_deref()
                    .map(|r| expand(r, server, &p.address)),
            ),
        };
        let offset = |ep: String| match rank {
            None => Some(ep),
            Some(r) => data_parallel::offset_port(&ep, r),
        };
        let Some(endpoint) = offset(endpoint) else {
            // Refused when the configuration was loaded.
            tracing::debug!(pod = %p.name, "KV events: no port to offset by the rank");
            continue;
        };
        let replay_endpoint = replay_endpoint.and_then(offset);
        out.insert(
            p.id,
            Target {
                pod: p.name.to_string(),
                model: model.to_string(),
                endpoint,
                replay_endpoint,
                spec: spec.clone(),
                request_block_tokens: config.tokenizers.get(&**model).map(|t| t.block_tokens),
            },
        );
    }
    out
}

struct Running {
    target: Target,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// Keeps one subscription per pod that should have one, until `stop` changes.
pub async fn run(shared: Arc<Shared>, status: KvEventsStatus, mut stop: watch::Receiver<bool>) {
    let mut running: HashMap<PodId, Running> = HashMap::new();
    loop {
        let want = targets(&shared);
        running.retain(|id, r| {
            let keep = want.get(id) == Some(&r.target) && !r.task.is_finished();
            if !keep {
                let _ = r.stop.send(true);
                r.task.abort();
                // A pod removed since has lost its view with it; one still here falls back to
                // the index until its new subscription builds a view.
                let _ = shared.router.lock().forget_kv_view(*id);
                status.remove(&r.target.pod);
            }
            keep
        });
        for (id, target) in want {
            if running.contains_key(&id) {
                continue;
            }
            let (stop_tx, stop_rx) = watch::channel(false);
            let task = tokio::spawn(subscriber::run(
                shared.clone(),
                status.clone(),
                id,
                target.clone(),
                stop_rx,
            ));
            running.insert(
                id,
                Running {
                    target,
                    stop: stop_tx,
                    task,
                },
            );
        }
        tokio::select! {
            _ = tokio::time::sleep(RECONCILE_EVERY) => {}
            _ = stop.changed() => break,
        }
    }
    for (_, r) in running {
        let _ = r.stop.send(true);
        r.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_expand_and_are_checked() {
        assert_eq!(
            expand("tcp://{host}:5557", "p", "10.0.0.5:8000"),
            "tcp://10.0.0.5:5557"
        );
        assert_eq!(
            expand("tcp://{host}:1{port}/{name}", "p", "[::1]:8000"),
            "tcp://[::1]:18000/p"
        );
        let s = |ep: &str| KvEventsSection {
            endpoint: ep.into(),
            ..Default::default()
        };
        assert!(s("tcp://{host}:5557").to_spec("m").is_ok());
        for bad in ["ipc:///x", "tcp://{pod}:1", "", "tcp://{host:1"] {
            let e = s(bad).to_spec("m").unwrap_err();
            assert!(e.contains("[kv_events.\"m\"] endpoint"), "{e}");
        }
        let e = KvEventsSection {
            silence_ms: Some(0),
            ..s("tcp://{host}:1")
        }
        .to_spec("m")
        .unwrap_err();
        assert!(e.contains("silence_ms"), "{e}");
        let spec = s("tcp://{host}:1").to_spec("m").unwrap();
        assert_eq!((spec.silence, spec.topic.as_str()), (DEFAULT_SILENCE, ""));
    }
}
