//! What an operator can ask the running service on its admin port, as JSON: the pods as the
//! router sees them (`/debug/pods`), the last routing decisions (`/debug/decisions`, no prompt
//! text), and the configuration in force (`/debug/config`).

use std::collections::VecDeque;
use std::time::{SystemTime, UNIX_EPOCH};

use kvroute_core::Decision;
use parking_lot::Mutex;
use serde_json::{json, Value};

use kvroute_core::{PodInfo, Timestamp};

use crate::engines::ScrapedEngine;

use crate::config::Config;

/// Decisions kept for `/debug/decisions`.
pub const DECISIONS_KEPT: usize = 256;

/// One routing decision, as kept (the request's id and model, never its prompt).
#[derive(Clone, Debug)]
struct Entry {
    unix_ms: u64,
    request_id: Option<String>,
    model: String,
    strategy: String,
    /// Rendered only when asked for (cloning it is a few reference counts).
    decision: Decision,
}

/// The last [`DECISIONS_KEPT`] routing decisions.
#[derive(Debug, Default)]
pub struct DecisionLog {
    entries: Mutex<VecDeque<Entry>>,
}

impl DecisionLog {
    /// Records a decision (its one-line explanation and what the request named).
    pub fn record(&self, request_id: Option<&str>, model: &str, strategy: &str, d: &Decision) {
        let unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let entry = Entry {
            unix_ms,
            request_id: request_id.map(|s| s.chars().take(128).collect()),
            model: model.chars().take(256).collect(),
            strategy: strategy.to_owned(),
            decision: d.clone(),
        };
        let mut entries = self.entries.lock();
        if entries.len() == DECISIONS_KEPT {
            entries.pop_front();
        }
        entries.push_back(entry);
    }

    /// The decisions, newest first.
    pub fn to_json(&self) -> Value {
        let entries = self.entries.lock();
        Value::Array(
            entries
                .iter()
                .rev()
                .map(|e| {
                    json!({
                        "unix_ms": e.unix_ms,
                        "request_id": e.request_id,
                        "model": e.model,
                        "strategy": e.strategy,
                        "pod": &*e.decision.pod_name,
                        "reason": e.decision.reason.as_str(),
                        "decision": e.decision.to_string(),
                    })
                })
                .collect(),
        )
    }
}

/// `/debug/pods`: every pod with its health, readiness, load, learned rates and last engine
/// scrape (`engines`, by pod name), as of `now`.
pub fn pods(
    pods: &[PodInfo],
    engines: &std::collections::BTreeMap<String, ScrapedEngine>,
    now: Timestamp,
) -> Value {
    Value::Array(
        pods.iter()
            .map(|p| {
                let h = &p.health;
                let engine = engines.get(&*p.name).map(|scraped| {
                    let e = &scraped.snapshot;
                    json!({
                        "running": e.running,
                        "waiting": e.waiting,
                        "kv_usage": e.kv_usage,
                        "prefix_cache_queries": e.prefix_queries,
                        "prefix_cache_hits": e.prefix_hits,
                        "block_tokens": scraped.block_tokens,
                    })
                });
                json!({
                    "name": &*p.name,
                    "address": &*p.address,
                    "models": p.models.iter().map(|m| &**m).collect::<Vec<_>>(),
                    "ready": p.ready,
                    "in_flight": p.in_flight,
                    "routed": p.routed,
                    "health": {
                        "ejected": h.ejected,
                        "ejected_for_ms": h.ejected_until.map(|t| t.millis_since(now)),
                        "probing": h.probing,
                        "reason": h.reason.map(|r| r.as_str()),
                        "ejections": {
                            "consecutive_5xx": h.ejections[0],
                            "consecutive_gateway_failure": h.ejections[1],
                        },
                        "checks_failing": h.checks_failing,
                        "consecutive_errors": h.consecutive_errors,
                    },
                    "learned": {
                        "max_seqs": p.max_seqs,
                        "prefill_tokens_per_s": p.prefill_tokens_per_s,
                        "tpot_ms": p.tpot_ms,
                        "overhead_ms": p.overhead_ms,
                        "predicted_hit_tokens": p.predicted_hit_tokens,
                    },
                    "engine": engine,
                })
            })
            .collect(),
    )
}

/// `/debug/config`: the configuration in force, with credentials in URLs redacted.
pub fn config(config: &Config) -> Value {
    let r = &config.router;
    let models: serde_json::Map<String, Value> = config
        .models
        .iter()
        .map(|(m, pods)| {
            let pods = pods
                .iter()
                .map(|p| json!({ "name": p.name, "address": p.address, "max_seqs": p.max_seqs }))
                .collect();
            (m.clone(), Value::Array(pods))
        })
        .collect();
    let discovery = match &config.discovery {
        crate::discovery::Discovery::Static => json!({ "source": "static" }),
        crate::discovery::Discovery::Envoy { model } => {
            json!({ "source": "envoy", "model": model })
        }
        crate::discovery::Discovery::Kubernetes(k) => json!({
            "source": "kubernetes",
            "mode": format!("{:?}", k.mode),
            "api_server": k.api_server.as_deref().map(redact_url),
        }),
    };
    json!({
        "listen": { "grpc": config.grpc_listen.to_string(), "admin": config.admin_listen.to_string() },
        "routing": {
            "default_strategy": config.default_strategy_text,
            "default_model": config.default_model,
            "seed": r.seed,
            "ticket_ttl_ms": r.ticket_ttl_ms,
            "expose_pod_headers": config.expose_pod_headers,
        },
        "prefix_cache": {
            "block_size": r.block_size,
            "block_number": r.index_capacity,
            "eviction_ms": r.index_ttl_ms,
            "imbalance_abs_count": r.imbalance_abs_count,
            "standard_deviation_factor": r.stddev_factor,
        },
        "limits": {
            "max_body_bytes": config.max_body_bytes,
            "shutdown_grace_ms": config.shutdown_grace.as_millis() as u64,
        },
        "ttft": format!("{:?}", r.ttft),
        "health": format!("{:?}", r.health),
        "engine_metrics": {
            "scrape_interval_ms": config.scrape_interval.map(|d| d.as_millis() as u64),
            "scrape_timeout_ms": config.scrape_timeout.as_millis() as u64,
        },
        "stream_timing": { "max_streams": config.max_timed_streams },
        "discovery": discovery,
        "models": models,
        "admission": admission(&config.admission),
    })
}

/// `[admission]` as in force: the headers read and each model's policy.
fn admission(a: &crate::admission::AdmissionConfig) -> Value {
    let models: serde_json::Map<String, Value> = a
        .policies
        .iter()
        .map(|(m, p)| {
            let p = json!({
                "ttft_target_ms": p.ttft_target_ms,
                "max_queue": p.max_queue,
                "queue_timeout_ms": p.queue_timeout_ms,
                "queue_depth_threshold": p.queue_depth_threshold,
                "kv_usage_threshold": p.kv_usage_threshold,
            });
            (m.clone(), p)
        })
        .collect();
    json!({
        "priority_header": a.headers.priority,
        "tenant_header": a.headers.tenant,
        "objectives": a.headers.objectives,
        "models": models,
    })
}

/// The URL with any `user:password@` replaced by `REDACTED@`.
fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}REDACTED{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::from_toml;

    #[test]
    fn credentials_in_urls_are_redacted() {
        assert_eq!(
            redact_url("https://u:p@k8s:6443/x"),
            "https://REDACTED@k8s:6443/x"
        );
        assert_eq!(redact_url("http://127.0.0.1:1"), "http://127.0.0.1:1");
    }

    #[test]
    fn the_decision_log_keeps_the_newest_without_prompts() {
        let c = from_toml("[models.m]\npods = [{ name = \"a\", address = \"10.0.0.1:80\" }]");
        let mut router = kvroute_core::Router::new(c.router.clone()).unwrap();
        let pod = kvroute_core::PodSpec {
            name: "a",
            address: "10.0.0.1:80",
            ready: true,
        };
        router.add_pod("m", pod).unwrap();
        let now = Timestamp::from_millis(1);
        let log = DecisionLog::default();
        let hashes = router
            .hash_config()
            .hashes(b"secret prompt text ".repeat(20).as_slice());
        for i in 0..DECISIONS_KEPT + 5 {
            let d = router
                .route(kvroute_core::RouteRequest::new("m", &hashes), now)
                .unwrap();
            log.record(Some(&format!("r{i}")), "m", "prefix-cache", &d);
        }
        let v = log.to_json();
        let all = v.as_array().unwrap();
        assert_eq!(all.len(), DECISIONS_KEPT);
        assert_eq!(all[0]["request_id"], format!("r{}", DECISIONS_KEPT + 4));
        assert!(!v.to_string().contains("secret"));
        let pods = pods(&router.pods(), &Default::default(), now);
        assert_eq!(pods[0]["in_flight"], DECISIONS_KEPT + 5);
        assert_eq!(pods[0]["health"]["ejected"], false);
        let cfg = config(&c);
        assert_eq!(cfg["models"]["m"][0]["address"], "10.0.0.1:80");
        assert_eq!(cfg["admission"]["models"], json!({}));
        let c = from_toml("[models.m]\npods = []\nallow_no_pods = true\n[admission.models.m]\nttft_target_ms = 900");
        let a = &config(&c)["admission"];
        assert_eq!(a["priority_header"], "x-kvroute-priority");
        assert_eq!(a["models"]["m"]["ttft_target_ms"], 900);
        assert_eq!(a["models"]["m"]["max_queue"], 256);
    }
}
