//! Admission's metrics: what happened to each request of a model with a policy
//! (`kvroute_admission_requests_total{model,outcome,reason,priority}`), how long the held ones
//! waited (`kvroute_admission_queue_wait_seconds{model}`), and the queues' lengths
//! (`kvroute_admission_queue_length{model}`, read from the router at scrape time).

use std::sync::Arc;

use kvroute_core::Router;
use parking_lot::Mutex;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::request::priority_class;
use crate::metrics::{gauge, ttft_histogram, Labels};

/// What happened to a request under a policy (`outcome` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Routed at once.
    Admitted,
    /// Held.
    Queued,
    /// Held, then routed.
    Dispatched,
    /// Held, then taken out: the client left (`client_gone`), or its routing failed when
    /// offered (`error`: its model or every pod gone).
    Cancelled,
    /// Turned away with a 429 (reason: the core's `saturated`, `queue_full`, `deadline`,
    /// `late`, or `would_queue` where kvroute cannot hold a request: the in-Envoy module).
    Shed,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Admitted => "admitted",
            Outcome::Queued => "queued",
            Outcome::Dispatched => "dispatched",
            Outcome::Cancelled => "cancelled",
            Outcome::Shed => "shed",
        }
    }
}

/// The live admission metrics.
#[derive(Debug)]
pub struct AdmissionMetrics {
    requests: Family<Labels, Counter>,
    wait: Family<Labels, Histogram, fn() -> Histogram>,
}

impl AdmissionMetrics {
    /// Creates the metrics and registers them, with the queue-length collector over `router`.
    pub fn register(registry: &mut Registry, router: Arc<Mutex<Router>>) -> AdmissionMetrics {
        let m = AdmissionMetrics {
            requests: Family::default(),
            wait: Family::new_with_constructor(ttft_histogram as fn() -> Histogram),
        };
        registry.register(
            "kvroute_admission_requests",
            "Requests of models with an [admission] policy, by outcome (admitted, queued, dispatched, cancelled, shed), reason (shed: saturated, queue_full, deadline, late, would_queue; cancelled: client_gone, error; else none) and priority class (critical, standard, sheddable)",
            m.requests.clone(),
        );
        registry.register(
            "kvroute_admission_queue_wait_seconds",
            "Time held requests waited from queueing to dispatch, by model",
            m.wait.clone(),
        );
        registry.register_collector(Box::new(QueueCollector { router }));
        m
    }

    /// Counts one request's `outcome` (`reason`: why it was shed or cancelled, else `none`).
    pub fn count(&self, model: &str, outcome: Outcome, reason: &str, priority: i32) {
        let labels = vec![
            ("model", model.to_owned()),
            ("outcome", outcome.as_str().to_owned()),
            ("reason", reason.to_owned()),
            ("priority", priority_class(priority).to_owned()),
        ];
        self.requests.get_or_create(&labels).inc();
    }

    /// Records a held request's wait until its dispatch.
    pub fn observe_wait(&self, model: &str, seconds: f64) {
        let labels = vec![("model", model.to_owned())];
        self.wait.get_or_create(&labels).observe(seconds);
    }
}

/// `kvroute_admission_queue_length{model}` for every model with a policy or a queue.
#[derive(Debug)]
struct QueueCollector {
    router: Arc<Mutex<Router>>,
}

impl prometheus_client::collector::Collector for QueueCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> std::fmt::Result {
        let rows: Vec<(Labels, i64)> = {
            let router = self.router.lock();
            router
                .models()
                .into_iter()
                .filter_map(|m| {
                    let len = router.admission_stats(&m).ok()?.queue_len;
                    let on = router.admission_policy(&m).is_some();
                    (on || len > 0).then(|| {
                        let len = i64::try_from(len).unwrap_or(i64::MAX);
                        (vec![("model", m.to_string())], len)
                    })
                })
                .collect()
        };
        gauge(
            &mut enc,
            "kvroute_admission_queue_length",
            "Requests held by admission now, by model (models with a policy, or still holding requests)",
            &rows,
        )
    }
}

#[cfg(test)]
mod tests {
    use kvroute_core::{AdmissionPolicy, PodSpec, RouterConfig};

    use super::*;

    #[test]
    fn the_queue_length_shows_for_models_with_a_policy() {
        let mut router = Router::new(RouterConfig::default()).unwrap();
        for m in ["on", "off"] {
            let pod = PodSpec {
                name: m,
                address: if m == "on" {
                    "10.0.0.1:80"
                } else {
                    "10.0.0.2:80"
                },
                ready: true,
            };
            router.add_pod(m, pod).unwrap();
        }
        router
            .set_admission("on", Some(AdmissionPolicy::default()))
            .unwrap();
        let mut registry = Registry::default();
        let m = AdmissionMetrics::register(&mut registry, Arc::new(Mutex::new(router)));
        m.count("on", Outcome::Shed, "queue_full", -1);
        m.observe_wait("on", 0.25);
        let text = crate::metrics::render(&registry);
        for line in [
            "kvroute_admission_queue_length{model=\"on\"} 0",
            "kvroute_admission_requests_total{model=\"on\",outcome=\"shed\",reason=\"queue_full\",priority=\"sheddable\"} 1",
            "kvroute_admission_queue_wait_seconds_count{model=\"on\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
        assert!(!text.contains("model=\"off\""), "{text}");
    }
}
