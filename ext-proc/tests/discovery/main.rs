//! Kubernetes discovery end to end: the real `kvroute-ext-proc` binary, with its real `kube`
//! client, lists and watches a fake API server (`support::k8s`) that speaks the real
//! list/watch protocol over HTTP. Checked through `/readyz`, the metrics, the log, and real
//! routing decisions over gRPC (a `GET /v1/models` side stream, no Envoy), except [`envoy`]'s
//! test, which sends traffic through a real Envoy to two `kvroute-sim` replicas
//! (`#[ignore]`d: run by `make test-e2e`). This file holds the harness; the tests are in
//! [`lists`] (readiness, watches, relists), [`pods`] (pods coming and going) and [`pools`]
//! (InferencePools).

#[path = "../support/mod.rs"]
mod support;

mod envoy;
mod lists;
mod pods;
mod pools;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_response::Response, ProcessingRequest, ProcessingResponse,
};
use envoy_types::pb::google::protobuf::value::Kind;
use support::k8s::{FakeApi, InferencePool, VllmPod};
use support::*;

/// kvroute-ext-proc with `[discovery] source = "kubernetes"` against a fake API server.
struct Kv {
    ext: ExtProc,
    config: std::path::PathBuf,
    _dir: TempDir,
}

impl Kv {
    /// `kube`: the `[discovery.kubernetes]` lines besides `api_server`. No pod is ever
    /// contacted (no scrape, no health check); the strategy is `random`, so that every
    /// routable pod gets requests.
    fn start(api: &FakeApi, tag: &str, kube: &str) -> Kv {
        let dir = TempDir::new(tag);
        let config = dir.path("kvroute.toml");
        let text = format!(
            "[listen]\ngrpc = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n[routing]\nseed = 7\ndefault_strategy = \"random\"\n[engine_metrics]\nscrape_interval_ms = 0\n[health]\ncheck_interval_ms = 0\n[discovery]\nsource = \"kubernetes\"\n[discovery.kubernetes]\napi_server = \"{}\"\n{kube}\n",
            api.url
        );
        std::fs::write(&config, text).unwrap();
        let ext = ExtProc::start(&dir, &config, None);
        Kv {
            ext,
            config,
            _dir: dir,
        }
    }

    fn metrics(&self) -> String {
        self.ext.metrics()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.ext.log).unwrap_or_default()
    }

    fn readyz(&self) -> u16 {
        http(&self.ext.admin, "GET", "/readyz", &[], b"").status
    }

    /// `kvroute_discovery_pods{model,state}`.
    fn pods(&self, model: &str, state: &str) -> u64 {
        let series = format!("kvroute_discovery_pods{{model=\"{model}\",state=\"{state}\"}} ");
        metric_sum(&self.metrics(), &series)
    }

    fn tickets_open(&self) -> u64 {
        metric_sum(&self.metrics(), "kvroute_tickets_open ")
    }

    fn errors(&self) -> u64 {
        metric_sum(&self.metrics(), "kvroute_discovery_errors_total ")
    }

    /// Waits until `failures` failed lists are counted, then asserts `/readyz` says not ready
    /// (`why` explains the expectation).
    fn assert_not_ready_after(&self, api: &FakeApi, failures: u64, why: &str) {
        self.wait(&format!("{failures} failed list(s) counted"), || {
            self.errors() >= failures
        });
        let r = http(&self.ext.admin, "GET", "/readyz", &[], b"");
        println!(
            "{} list calls, {} counted failed: /readyz {}",
            api.list_calls(),
            self.errors(),
            r.status
        );
        assert_eq!((r.status, r.text().as_str()), (503, "not ready\n"), "{why}");
    }

    /// Waits (5 s) until `f` holds; panics with the metrics and the log otherwise.
    fn wait(&self, what: &str, f: impl FnMut() -> bool) -> Duration {
        self.wait_secs(what, 5, f)
    }

    fn wait_secs(&self, what: &str, secs: u64, mut f: impl FnMut() -> bool) -> Duration {
        let t0 = Instant::now();
        if wait_for(Duration::from_secs(secs), || f().then_some(())).is_none() {
            panic!(
                "{what}: not within {secs} s\n{}\nlog:\n{}",
                self.metrics(),
                self.log()
            );
        }
        t0.elapsed()
    }

    fn wait_pods(&self, model: &str, ready: u64, unready: u64) -> Duration {
        self.wait(
            &format!("{model}: {ready} ready, {unready} unready"),
            || self.pods(model, "ready") == ready && self.pods(model, "unready") == unready,
        )
    }
}

/// Real routing decisions: one ext_proc side stream per request, over one gRPC connection.
struct Grpc {
    rt: tokio::runtime::Runtime,
    client: ExternalProcessorClient<tonic::transport::Channel>,
}

/// An open side stream (a request in flight until it is closed).
type Open = (
    tokio::sync::mpsc::Sender<ProcessingRequest>,
    tonic::Streaming<ProcessingResponse>,
);

/// `Ok(ip:port)` from `envoy.lb/x-gateway-destination-endpoint`, or `Err(status)` of an
/// `ImmediateResponse`.
type Decision = Result<String, u16>;

impl Grpc {
    fn connect(addr: &str) -> Grpc {
        // A worker thread drives the connection between calls (a stream's end reaches
        // kvroute even when no request follows it).
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let client = rt
            .block_on(ExternalProcessorClient::connect(format!("http://{addr}")))
            .expect("connect to kvroute-ext-proc");
        Grpc { rt, client }
    }

    /// Routes `GET /v1/models` with header `model`, keeping the stream open.
    fn open(&mut self, model: &str) -> (Open, Decision) {
        let (open, reply) = self.open_reply(model);
        (open, decision(&reply))
    }

    /// Asserts that `model`'s request is refused as for a model no pod serves: an
    /// `ImmediateResponse` 400 with an OpenAI-style `model_not_found` error.
    fn assert_model_not_found(&mut self, model: &str) {
        let (open, reply) = self.open_reply(model);
        self.close(open);
        let Some(Response::ImmediateResponse(i)) = &reply.response else {
            panic!("not rejected: {reply:?}");
        };
        let status = i.status.as_ref().map_or(0, |s| s.code);
        let body: serde_json::Value = serde_json::from_slice(&i.body).expect("a JSON body");
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["code"], "model_not_found", "{body}");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    }

    /// Sends the request headers of `GET /v1/models` with header `model`; the stream and
    /// kvroute's reply.
    fn open_reply(&mut self, model: &str) -> (Open, ProcessingResponse) {
        let first = get_models_headers(model);
        let client = &mut self.client;
        self.rt.block_on(async {
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            tx.send(first).await.unwrap();
            let mut replies = client
                .process(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await
                .expect("process")
                .into_inner();
            let reply = tokio::time::timeout(Duration::from_secs(5), replies.message())
                .await
                .expect("no reply within 5 s")
                .expect("gRPC error")
                .expect("a reply");
            ((tx, replies), reply)
        })
    }

    /// Ends the stream (as Envoy does at a request's end).
    fn close(&self, open: Open) {
        self.rt.block_on(async move { drop(open) });
    }

    fn route(&mut self, model: &str) -> Decision {
        let (open, d) = self.open(model);
        self.close(open);
        d
    }

    /// Where `n` requests went (`"503"`-style keys for rejections).
    fn spread(&mut self, models: &[&str], n: usize) -> BTreeMap<String, usize> {
        let mut seen = BTreeMap::new();
        for i in 0..n {
            let key = match self.route(models[i % models.len()]) {
                Ok(a) => a,
                Err(s) => s.to_string(),
            };
            *seen.entry(key).or_insert(0) += 1;
        }
        seen
    }

    /// Routes every 2 ms until a decision names `want`; the time that took.
    fn until(&mut self, model: &str, want: &str, timeout: Duration) -> Option<Duration> {
        let t0 = Instant::now();
        while t0.elapsed() < timeout {
            let d = self.route(model);
            if d.as_deref() == Ok(want) {
                return Some(t0.elapsed());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        None
    }

    /// Routes until the decisions over 40 requests are exactly the addresses `want`.
    fn until_spread(&mut self, models: &[&str], want: &[&str]) -> Duration {
        let t0 = Instant::now();
        let want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
        loop {
            let seen = self.spread(models, 40);
            if seen.keys().cloned().collect::<Vec<_>>() == want {
                return t0.elapsed();
            }
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "routes never became {want:?}: {seen:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn decision(reply: &ProcessingResponse) -> Decision {
    if let Some(md) = &reply.dynamic_metadata {
        let lb = md.fields.get("envoy.lb").and_then(|v| match &v.kind {
            Some(Kind::StructValue(s)) => s.fields.get("x-gateway-destination-endpoint"),
            _ => None,
        });
        match lb.and_then(|v| v.kind.as_ref()) {
            Some(Kind::StringValue(a)) => return Ok(a.clone()),
            _ => panic!("metadata without a destination: {reply:?}"),
        }
    }
    match &reply.response {
        Some(Response::ImmediateResponse(i)) => Err(i.status.as_ref().map_or(0, |s| s.code as u16)),
        _ => panic!("neither routed nor rejected: {reply:?}"),
    }
}

const AIBRIX: &str = "mode = \"aibrix\"";
