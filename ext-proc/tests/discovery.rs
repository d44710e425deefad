//! Kubernetes discovery end to end: the real `kvroute-ext-proc` binary, with its real `kube`
//! client, lists and watches a fake API server (`support::k8s`) that speaks the real
//! list/watch protocol over HTTP. Checked through `/readyz`, the metrics, the log, and real
//! routing decisions over gRPC (a `GET /v1/models` side stream, no Envoy), except the last
//! test, which sends traffic through a real Envoy to two `kvroute-sim` replicas
//! (`#[ignore]`d: run by `make test-e2e`).

mod support;

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

#[test]
fn readyz_is_503_until_the_first_complete_list() {
    let api = FakeApi::start();
    let ips = ["10.0.0.1", "10.0.0.2", "10.0.0.3"];
    for (i, ip) in ips.iter().enumerate() {
        let ns = ["a", "b", "c"][i];
        api.add_pod(&VllmPod::aibrix(&format!("vllm-{i}"), "llama", ip).ns(ns));
    }
    // A pod without the model label is not selected.
    api.add_pod(&VllmPod::new("other", Some("10.0.0.9")));
    // Every list fails until the test lets them succeed: nothing is listed before then.
    api.fail_lists(u32::MAX);
    api.set_page_size(1); // three pages: the continue tokens are followed
    let kv = Kv::start(&api, "readyz", AIBRIX);
    let mut grpc = Grpc::connect(&kv.ext.grpc);
    // After the first failed list and after its retry (kube backs off from 0.8 s), /readyz
    // says not ready, and a request for the model is refused as for a model no pod serves
    // (README, Discovery: 400 `model_not_found` until one of its pods has been seen).
    for failures in 1..=2 {
        kv.assert_not_ready_after(&api, failures, "ready before any list succeeded");
        grpc.assert_model_not_found("llama");
    }
    // Lists succeed from now on: ready at the next retry, and the three pods take requests.
    api.fail_lists(0);
    let waited = kv.wait_secs("/readyz 200", 10, || kv.readyz() == 200);
    let m = kv.metrics();
    let failed = metric_sum(&m, "kvroute_discovery_errors_total ");
    println!(
        "ready {waited:?} after lists were let succeed; {failed} failed lists; list calls {}",
        api.list_calls()
    );
    assert!(failed >= 2, "{m}");
    assert_eq!(kv.pods("llama", "ready"), 3, "{m}");
    let want: Vec<String> = ips.iter().map(|ip| format!("{ip}:8000")).collect();
    let want: Vec<&str> = want.iter().map(String::as_str).collect();
    grpc.until_spread(&["llama"], &want);
    // Each failed list was one call counted once; then one list of three one-item pages.
    // Every namespace (/api/v1/pods).
    assert_eq!(api.list_calls(), failed + 3, "{m}");
    let lists: Vec<String> = (api.requests().into_iter())
        .filter(|r| !r.contains("watch=true"))
        .collect();
    assert!(
        lists.iter().all(|r| r.starts_with("/api/v1/pods?")
            && r.contains("labelSelector=model.aibrix.ai%2Fname")),
        "{lists:?}"
    );
    let firsts = lists.iter().filter(|r| !r.contains("continue=")).count();
    assert_eq!(firsts as u64, failed + 1, "{lists:?}");
    assert_eq!(lists.iter().filter(|r| r.contains("continue=")).count(), 2);
    assert!(kv.log().contains("discovery: first list complete"));
}

#[test]
fn an_added_pod_is_routable_within_a_second() {
    let api = FakeApi::start();
    let kv = Kv::start(&api, "added", AIBRIX);
    kv.wait("/readyz 200", || kv.readyz() == 200);
    let mut grpc = Grpc::connect(&kv.ext.grpc);
    assert_eq!(grpc.route("llama"), Err(400), "a model no pod serves");
    kv.wait("the watch open", || api.open_watches() == 1);
    let lists = api.list_calls();
    let t0 = Instant::now();
    api.add_pod(&VllmPod::aibrix("vllm-0", "llama", "10.0.0.1"));
    let took = grpc.until("llama", "10.0.0.1:8000", Duration::from_secs(2));
    let took = took
        .map(|_| t0.elapsed())
        .expect("never routed to the added pod");
    println!("added pod routable after {took:?}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert_eq!(api.list_calls(), lists, "arrived by a list, not the watch");
    assert_eq!(kv.pods("llama", "ready"), 1);
    assert!(kv.log().contains("discovery: pod added"));

    // The port label; a pod that has no IP yet has no endpoint until it gets one.
    let pending = VllmPod {
        ip: None,
        phase: "Pending".into(),
        ready: false,
        ..VllmPod::aibrix("vllm-1", "qwen", "10.0.0.2").label("model.aibrix.ai/port", "8080")
    };
    api.add_pod(&pending);
    api.add_pod(&VllmPod::aibrix("marker", "marker", "10.0.0.3"));
    kv.wait_pods("marker", 1, 0);
    assert_eq!(
        grpc.route("qwen"),
        Err(400),
        "a pod without an IP is not a pod yet"
    );
    let t0 = Instant::now();
    let scheduled = VllmPod {
        ip: Some("10.0.0.2".into()),
        phase: "Running".into(),
        ready: true,
        ..pending
    };
    api.modify_pod(&scheduled);
    let took = grpc.until("qwen", "10.0.0.2:8080", Duration::from_secs(2));
    println!(
        "scheduled pod routable after {:?}",
        took.map(|_| t0.elapsed())
    );
    assert!(took.is_some());
}

#[test]
fn a_labelled_data_parallel_pod_is_routed_engine_by_engine() {
    let api = FakeApi::start();
    let kv = Kv::start(&api, "data-parallel", AIBRIX);
    kv.wait("/readyz 200", || kv.readyz() == 200);
    let dp =
        VllmPod::aibrix("vllm-0", "llama", "10.0.0.1").label("kvroute.io/data-parallel-size", "2");
    api.add_pod(&dp);
    kv.wait_pods("llama", 1, 0);
    let mut grpc = Grpc::connect(&kv.ext.grpc);
    let routed = |kv: &Kv, pod: &str| {
        metric_sum(
            &kv.metrics(),
            &format!("kvroute_pod_routed_total{{pod=\"{pod}\",address=\"10.0.0.1:8000\"}}"),
        )
    };
    // Random over the two engines of the one pod, both at its address.
    assert_eq!(grpc.spread(&["llama"], 40).get("10.0.0.1:8000"), Some(&40));
    let (a, b) = (
        routed(&kv, "default/vllm-0/dp0"),
        routed(&kv, "default/vllm-0/dp1"),
    );
    assert!(
        a > 0 && b > 0 && a + b == 40,
        "{a} + {b}:\n{}",
        kv.metrics()
    );
    // The label gone: one engine again, under the pod's own name.
    api.modify_pod(&VllmPod::aibrix("vllm-0", "llama", "10.0.0.1"));
    kv.wait("the engines replaced by the pod", || {
        let m = kv.metrics();
        m.contains("kvroute_pod_in_flight{pod=\"default/vllm-0\"")
            && !m.contains("kvroute_pod_in_flight{pod=\"default/vllm-0/dp")
    });
    grpc.spread(&["llama"], 4);
    assert_eq!(routed(&kv, "default/vllm-0"), 4);
}

#[test]
fn an_unready_or_terminating_pod_gets_no_new_request() {
    let api = FakeApi::start();
    let zero = VllmPod::aibrix("vllm-0", "llama", "10.0.0.1");
    let one = VllmPod::aibrix("vllm-1", "llama", "10.0.0.2");
    api.add_pod(&zero);
    api.add_pod(&one);
    let kv = Kv::start(&api, "unready", AIBRIX);
    kv.wait_pods("llama", 2, 0);
    let mut grpc = Grpc::connect(&kv.ext.grpc);
    let both = grpc.spread(&["llama"], 40);
    assert_eq!(both.len(), 2, "both pods get requests: {both:?}");

    api.modify_pod(&VllmPod {
        ready: false,
        ..one.clone()
    });
    let took = kv.wait_pods("llama", 1, 1);
    let after = grpc.spread(&["llama"], 20);
    println!("Ready=False seen in {took:?}; 20 requests: {after:?}");
    assert_eq!(after, BTreeMap::from([("10.0.0.1:8000".to_owned(), 20)]));
    assert!(kv.log().contains("discovery: pod readiness changed"));

    api.modify_pod(&one);
    kv.wait_pods("llama", 2, 0);
    assert_eq!(grpc.spread(&["llama"], 40).len(), 2);

    // Terminating (deletionTimestamp set), still Ready: no new request either.
    api.modify_pod(&VllmPod {
        deleting: true,
        ..one.clone()
    });
    kv.wait_pods("llama", 1, 1);
    let after = grpc.spread(&["llama"], 20);
    println!("terminating: 20 requests: {after:?}");
    assert_eq!(after, BTreeMap::from([("10.0.0.1:8000".to_owned(), 20)]));
}

#[test]
fn a_deleted_pod_releases_its_request_in_flight_once() {
    let api = FakeApi::start();
    api.add_pod(&VllmPod::aibrix("vllm-0", "llama", "10.0.0.1"));
    let kv = Kv::start(&api, "deleted", AIBRIX);
    kv.wait_pods("llama", 1, 0);
    let mut grpc = Grpc::connect(&kv.ext.grpc);
    let (open, d) = grpc.open("llama");
    assert_eq!(d.as_deref(), Ok("10.0.0.1:8000"));
    assert_eq!(kv.ext.in_flight(), 1);

    api.delete_pod("default", "vllm-0");
    let took = kv.wait_pods("llama", 0, 0);
    println!("deletion seen in {took:?}");
    let log = kv.log();
    let removed = log.lines().find(|l| l.contains("discovery: pod removed"));
    assert!(removed.is_some_and(|l| l.contains("in_flight=1")), "{log}");
    assert_eq!(grpc.route("llama"), Err(503), "a known model without pods");
    let m = kv.metrics();
    assert_eq!(metric_sum(&m, "kvroute_tickets_open "), 1, "{m}");
    assert_eq!(metric_sum(&m, "kvroute_tickets_orphaned_total "), 0, "{m}");

    grpc.close(open);
    kv.wait("the orphan released", || kv.tickets_open() == 0);
    std::thread::sleep(Duration::from_millis(300));
    let m = kv.metrics();
    assert_eq!(metric_sum(&m, "kvroute_tickets_orphaned_total "), 1, "{m}");
    assert_eq!(
        metric_sum(&m, "kvroute_ticket_release_errors_total "),
        0,
        "{m}"
    );
    assert_eq!(metric_sum(&m, "kvroute_tickets_rejected_total "), 0, "{m}");
    assert_eq!(metric_sum(&m, "kvroute_pod_in_flight{"), 0, "{m}");
}

#[test]
fn a_rescheduled_pod_is_routed_to_its_new_address() {
    let api = FakeApi::start();
    let pod = VllmPod::aibrix("vllm-0", "llama", "127.0.0.2");
    api.add_pod(&pod);
    let kv = Kv::start(&api, "resched", AIBRIX);
    kv.wait_pods("llama", 1, 0);
    let mut grpc = Grpc::connect(&kv.ext.grpc);
    assert_eq!(grpc.route("llama").as_deref(), Ok("127.0.0.2:8000"));
    kv.wait("the probe released", || kv.tickets_open() == 0);

    // A StatefulSet reschedule: deleted, recreated Pending without an IP, then Running.
    let t0 = Instant::now();
    api.delete_pod("default", "vllm-0");
    let again = VllmPod {
        ip: None,
        phase: "Pending".into(),
        ready: false,
        ..pod.clone()
    };
    api.add_pod(&again);
    api.modify_pod(&VllmPod {
        ip: Some("127.0.0.3".into()),
        ..pod.clone()
    });
    let took = grpc.until("llama", "127.0.0.3:8000", Duration::from_secs(2));
    println!(
        "rescheduled pod routed to its new IP after {:?}",
        took.map(|_| t0.elapsed())
    );
    assert!(took.is_some(), "{}", kv.log());
    let spread = grpc.spread(&["llama"], 10);
    assert_eq!(spread, BTreeMap::from([("127.0.0.3:8000".to_owned(), 10)]));

    // The IP changing in place keeps the pod and its request in flight. (A probe above may
    // have been routed to the old pod just before its deletion was seen: an orphan.)
    kv.wait("the probes released", || kv.tickets_open() == 0);
    let orphans = metric_sum(&kv.metrics(), "kvroute_tickets_orphaned_total ");
    let (open, d) = grpc.open("llama");
    assert_eq!(d.as_deref(), Ok("127.0.0.3:8000"));
    api.modify_pod(&VllmPod {
        ip: Some("127.0.0.4".into()),
        ..pod.clone()
    });
    let took = grpc.until("llama", "127.0.0.4:8000", Duration::from_secs(2));
    println!("in-place address change routed after {took:?}");
    assert!(took.is_some());
    assert!(kv.log().contains("discovery: pod address changed"));
    // The probes' stream ends are asynchronous: wait for them, then only ours is left.
    kv.wait("the request in flight kept", || kv.ext.in_flight() == 1);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(kv.ext.in_flight(), 1, "the request in flight was dropped");
    grpc.close(open);
    kv.wait("released", || kv.ext.in_flight() == 0);
    let m = kv.metrics();
    let log = kv.log();
    let now = metric_sum(&m, "kvroute_tickets_orphaned_total ");
    assert_eq!(now, orphans, "orphaned by an address change: {m}\n{log}");
    assert_eq!(
        metric_sum(&m, "kvroute_ticket_release_errors_total "),
        0,
        "{m}"
    );
}

#[test]
fn a_dropped_watch_resumes_without_a_relist() {
    let api = FakeApi::start();
    api.add_pod(&VllmPod::aibrix("vllm-0", "llama", "10.0.0.1"));
    let kv = Kv::start(&api, "resume", AIBRIX);
    kv.wait_pods("llama", 1, 0);
    kv.wait("the watch open", || api.open_watches() == 1);
    let mut grpc = Grpc::connect(&kv.ext.grpc);
    let (lists, watches, errors) = (api.list_calls(), api.watch_calls(), kv.errors());

    for round in 1..=2 {
        api.drop_watches();
        // Most likely before the client has even seen the cut: replayed from its RV.
        let t0 = Instant::now();
        let name = format!("vllm-{round}");
        let ip = format!("10.0.0.{}", round + 1);
        api.add_pod(&VllmPod::aibrix(&name, &name, &ip));
        let took = grpc.until(&name, &format!("{ip}:8000"), Duration::from_secs(3));
        let took = took
            .map(|_| t0.elapsed())
            .expect("the pod added across the cut");
        println!("round {round}: pod added across a dropped watch routable after {took:?}");
    }
    let resumed: Vec<String> = (api.requests().into_iter())
        .filter(|r| r.contains("watch=true"))
        .collect();
    println!(
        "list calls {} -> {}, watch calls {watches} -> {}, errors {errors} -> {}",
        lists,
        api.list_calls(),
        api.watch_calls(),
        kv.errors()
    );
    assert!(api.watch_calls() >= watches + 2, "{resumed:?}");
    assert_eq!(
        api.list_calls(),
        lists,
        "the watcher listed again: {resumed:?}"
    );
    assert!(resumed.iter().all(|r| !r.contains("resourceVersion=0&")));
    assert_eq!(kv.errors(), errors, "a clean resume counts no error");
    assert_eq!(kv.pods("llama", "ready"), 1);
}

#[test]
fn a_410_relist_loses_no_pod() {
    let api = FakeApi::start();
    api.add_pod(&VllmPod::aibrix("vllm-a", "llama", "10.0.0.1"));
    api.add_pod(&VllmPod::aibrix("vllm-b", "llama", "10.0.0.2"));
    let kv = Kv::start(&api, "gone", AIBRIX);
    kv.wait_pods("llama", 2, 0);
    kv.wait("the watch open", || api.open_watches() == 1);
    let mut grpc = Grpc::connect(&kv.ext.grpc);
    let (lists, errors) = (api.list_calls(), kv.errors());

    api.compact();
    api.drop_watches();
    let t0 = Instant::now();
    // While the client resumes (and gets 410 Expired), one pod goes and one comes.
    api.delete_pod("default", "vllm-a");
    api.add_pod(&VllmPod::aibrix("vllm-c", "llama", "10.0.0.3"));
    let took = grpc.until_spread(&["llama"], &["10.0.0.2:8000", "10.0.0.3:8000"]);
    println!(
        "relisted after 410 in {:?} (routes settled {took:?} after the loop began); list calls {lists} -> {}, errors {errors} -> {}",
        t0.elapsed(),
        api.list_calls(),
        kv.errors()
    );
    assert!(api.list_calls() > lists, "no relist");
    assert!(kv.errors() > errors, "the 410 was not counted");
    kv.wait_pods("llama", 2, 0);
    let log = kv.log();
    assert!(
        log.lines()
            .any(|l| l.contains("discovery: pod removed") && l.contains("vllm-a")),
        "{log}"
    );
    let expired = api
        .requests()
        .into_iter()
        .filter(|r| r.contains("watch=true"));
    assert!(
        expired.count() >= 3,
        "initial watch, the expired one, the new one"
    );
}

#[test]
fn two_namespaces_are_watched_and_both_must_list() {
    let api = FakeApi::start();
    api.add_pod(&VllmPod::aibrix("vllm-a", "llama", "10.0.0.1").ns("a"));
    api.add_pod(&VllmPod::aibrix("vllm-b", "llama", "10.0.0.2").ns("b"));
    // A model served in namespace b only.
    api.add_pod(&VllmPod::aibrix("qwen-b", "qwen", "10.0.0.6").ns("b"));
    api.add_pod(&VllmPod::aibrix("vllm-c", "llama", "10.0.0.3").ns("c"));
    // Namespace b's lists fail until the test lets them succeed; a's succeed.
    api.fail_lists_in("b", u32::MAX);
    let kv = Kv::start(
        &api,
        "two-ns",
        &format!("{AIBRIX}\nnamespaces = [\"a\", \"b\"]"),
    );
    let mut grpc = Grpc::connect(&kv.ext.grpc);
    kv.wait_pods("llama", 1, 0); // namespace a listed
                                 // After b's first failed list and after its retry (kube backs off from 0.8 s): not ready
                                 // (`/readyz` waits for every watched namespace's first list). Requests are routed over the
                                 // pods seen so far (routing does not wait for readiness): llama to a's pod, and qwen, none
                                 // of whose pods has been seen, gets 400 `model_not_found` (README, Discovery).
    for failures in 1..=2 {
        kv.assert_not_ready_after(&api, failures, "ready with only namespace a listed");
        let spread = grpc.spread(&["llama"], 10);
        assert_eq!(spread, BTreeMap::from([("10.0.0.1:8000".into(), 10)]));
        grpc.assert_model_not_found("qwen");
        assert_eq!(
            (kv.pods("llama", "ready"), kv.pods("qwen", "ready")),
            (1, 0)
        );
    }
    // b's lists succeed from now on: ready at its next retry, over both namespaces' pods.
    api.fail_lists_in("b", 0);
    let took = kv.wait_secs("/readyz 200", 10, || kv.readyz() == 200);
    let failed = kv.errors();
    println!(
        "namespace b's lists failed {failed} times: ready {took:?} after they were let succeed"
    );
    assert!(failed >= 2, "{}", kv.metrics());
    kv.wait_pods("llama", 2, 0);
    kv.wait_pods("qwen", 1, 0);
    let spread = grpc.spread(&["llama"], 40);
    let keys: Vec<&str> = spread.keys().map(String::as_str).collect();
    assert_eq!(keys, ["10.0.0.1:8000", "10.0.0.2:8000"], "{spread:?}");
    assert_eq!(grpc.route("qwen"), Ok("10.0.0.6:8000".into()));
    // Each failed list was one call counted once; a listed once, b once more when let.
    let lists = |ns: &str| {
        let path = format!("/api/v1/namespaces/{ns}/pods?");
        (api.requests().iter())
            .filter(|r| r.starts_with(&path) && !r.contains("watch=true"))
            .count() as u64
    };
    assert_eq!((lists("a"), lists("b")), (1, failed + 1));
    assert_eq!(api.list_calls(), failed + 2);
    for r in api.requests() {
        assert!(
            r.starts_with("/api/v1/namespaces/a/pods?")
                || r.starts_with("/api/v1/namespaces/b/pods?"),
            "{r}"
        );
    }
    // Changes in either namespace are followed, in none other.
    api.delete_pod("a", "vllm-a");
    api.add_pod(&VllmPod::aibrix("vllm-b2", "llama", "10.0.0.4").ns("b"));
    api.add_pod(&VllmPod::aibrix("vllm-c2", "llama", "10.0.0.5").ns("c"));
    grpc.until_spread(&["llama"], &["10.0.0.2:8000", "10.0.0.4:8000"]);
    kv.wait_pods("llama", 2, 0);
}

#[test]
fn an_inference_pool_routes_every_model_over_its_selected_pods() {
    let api = FakeApi::start();
    let kv = Kv::start(
        &api,
        "pool",
        "mode = \"inference-pool\"\npool_name = \"vllm-pool\"\npool_namespace = \"default\"",
    );
    kv.wait("/readyz 200 (no pool yet)", || kv.readyz() == 200);
    let mut grpc = Grpc::connect(&kv.ext.grpc);
    assert_eq!(
        grpc.route("whatever"),
        Err(503),
        "before any pod: 503, not 400"
    );

    let one0 = VllmPod::new("one-0", Some("10.0.1.1")).label("app", "one");
    api.add_pod(&one0);
    api.add_pod(&VllmPod::new("one-1", Some("10.0.1.2")).label("app", "one"));
    api.add_pod(&VllmPod::new("two-0", Some("10.0.2.1")).label("app", "two"));
    api.add_pod(&VllmPod::new("plain", Some("10.0.9.9")));
    let mut pool = InferencePool::new("vllm-pool", &[("app", "one")], &[8000]);
    // Another namespace's pool of the same name, and another pool: not ours.
    let mut elsewhere = InferencePool::new("vllm-pool", &[("app", "two")], &[7000]);
    elsewhere.namespace = "other".into();
    api.put_pool(&elsewhere);
    api.put_pool(&InferencePool::new(
        "other-pool",
        &[("app", "two")],
        &[7000],
    ));
    assert_eq!(grpc.route("whatever"), Err(503), "pods but no pool yet");
    let t0 = Instant::now();
    api.put_pool(&pool);
    let models = ["whatever", "llama", "qwen"];
    grpc.until_spread(&models, &["10.0.1.1:8000", "10.0.1.2:8000"]);
    println!("pool created: its pods routed after {:?}", t0.elapsed());
    kv.wait_pods("vllm-pool", 2, 0);

    let t0 = Instant::now();
    pool.match_labels = BTreeMap::from([("app".into(), "two".into())]);
    api.put_pool(&pool);
    grpc.until_spread(&models, &["10.0.2.1:8000"]);
    println!("selector app=one -> app=two followed in {:?}", t0.elapsed());
    kv.wait_pods("vllm-pool", 1, 0);

    let t0 = Instant::now();
    pool.target_ports = vec![9000];
    api.put_pool(&pool);
    grpc.until_spread(&models, &["10.0.2.1:9000"]);
    println!("target port 8000 -> 9000 followed in {:?}", t0.elapsed());
    pool.target_ports = vec![9000, 9001];
    api.put_pool(&pool);
    grpc.until_spread(&models, &["10.0.2.1:9000", "10.0.2.1:9001"]);
    kv.wait_pods("vllm-pool", 2, 0);

    // A pod relabelled into the pool joins it (the watch says ADDED), out of it leaves it.
    api.modify_pod(&one0.clone().label("app", "two"));
    grpc.until_spread(
        &models,
        &[
            "10.0.1.1:9000",
            "10.0.1.1:9001",
            "10.0.2.1:9000",
            "10.0.2.1:9001",
        ],
    );
    api.modify_pod(&one0);
    grpc.until_spread(&models, &["10.0.2.1:9000", "10.0.2.1:9001"]);

    api.delete_pool("default", "vllm-pool");
    kv.wait_pods("vllm-pool", 0, 0);
    assert_eq!(grpc.route("whatever"), Err(503), "pool deleted: 503");
    let log = kv.log();
    assert!(log.contains("discovery: InferencePool deleted"), "{log}");
    let pools: Vec<String> = (api.requests().into_iter())
        .filter(|r| r.contains("inferencepools"))
        .collect();
    assert!(
        pools.iter().all(|r| r.starts_with(
            "/apis/inference.networking.k8s.io/v1/namespaces/default/inferencepools?"
        ) && r.contains("fieldSelector=metadata.name%3Dvllm-pool")),
        "{pools:?}"
    );
}

#[test]
fn an_inference_pool_deleted_during_a_410_gap_is_noticed_on_the_relist() {
    let api = FakeApi::start();
    let kv = Kv::start(
        &api,
        "pool-gap",
        "mode = \"inference-pool\"\npool_name = \"p\"",
    );
    api.add_pod(&VllmPod::new("one-0", Some("10.0.1.1")).label("app", "one"));
    api.put_pool(&InferencePool::new("p", &[("app", "one")], &[8000]));
    kv.wait_pods("p", 1, 0);
    kv.wait("both watches open", || api.open_watches() == 2);
    let lists = api.list_calls();
    api.compact();
    api.drop_watches();
    api.delete_pool("default", "p");
    // The pool's relist (which may drop the pods' watch before it relists: the pool is gone).
    kv.wait("the pool relisted", || api.list_calls() > lists);
    let mut grpc = Grpc::connect(&kv.ext.grpc);
    kv.wait("the deleted pool's pods removed", || {
        kv.pods("p", "ready") == 0 && grpc.route("x") == Err(503)
    });
}

#[test]
fn same_named_pods_of_two_namespaces_are_two_pods() {
    let api = FakeApi::start();
    api.add_pod(&VllmPod::aibrix("vllm-0", "llama", "10.0.0.1").ns("a"));
    api.add_pod(&VllmPod::aibrix("vllm-0", "llama", "10.0.0.2").ns("b"));
    let kv = Kv::start(
        &api,
        "same-name",
        &format!("{AIBRIX}\nnamespaces = [\"a\", \"b\"]"),
    );
    kv.wait_pods("llama", 2, 0);
    let mut grpc = Grpc::connect(&kv.ext.grpc);
    let spread = grpc.spread(&["llama"], 40);
    assert_eq!(spread.len(), 2, "2 pods listed, routed to: {spread:?}");
    api.delete_pod("a", "vllm-0");
    kv.wait_pods("llama", 1, 0);
    grpc.until_spread(&["llama"], &["10.0.0.2:8000"]);
}

/// One request through Envoy: when it started and ended, its status, the replica that served it.
struct Sent {
    start: Instant,
    status: u16,
    replica: String,
}

#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn discovered_pods_take_traffic_through_envoy() {
    let api = FakeApi::start();
    let dir = TempDir::new("disc-envoy");
    let a = Sim::start(&dir, "replica-a", 5.0);
    let b = Sim::start(&dir, "replica-b", 5.0);
    let pod = |s: &Sim| {
        let port = s.addr.rsplit(':').next().unwrap().to_owned();
        VllmPod::aibrix(&s.name, "study", "127.0.0.1").label("model.aibrix.ai/port", &port)
    };
    api.add_pod(&pod(&a));
    let kv = Kv::start(&api, "disc-envoy-kv", AIBRIX);
    kv.wait_pods("study", 1, 0);
    let envoy = Envoy::start(&dir, &kv.config, &kv.ext.grpc, true);

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(Mutex::new(Vec::<Sent>::new()));
    let current = Arc::new(Mutex::new(vec![Instant::now(); 3]));
    let workers: Vec<_> = (0..3)
        .map(|w| {
            let (stop, sent, current) = (stop.clone(), sent.clone(), current.clone());
            let listen = envoy.listen.clone();
            std::thread::spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let body = completion("study", &prompt(&format!("w{w}"), i, 300), 8, false);
                    let start = Instant::now();
                    current.lock().unwrap()[w] = start;
                    let r = try_http(&listen, "POST", "/v1/completions", &[], &body);
                    let (status, replica) = match r {
                        Ok(r) => {
                            let replica =
                                r.header("x-kvroute-sim-replica").unwrap_or("").to_owned();
                            (r.status, replica)
                        }
                        Err(_) => (0, String::new()),
                    };
                    sent.lock().unwrap().push(Sent {
                        start,
                        status,
                        replica,
                    });
                }
            })
        })
        .collect();
    let count = |f: &dyn Fn(&Sent) -> bool| sent.lock().unwrap().iter().filter(|s| f(s)).count();

    std::thread::sleep(Duration::from_millis(800));
    let t_b = Instant::now();
    api.add_pod(&pod(&b));
    let b_seen = wait_for(Duration::from_secs(5), || {
        (count(&|s| s.replica == "replica-b") > 0).then(|| t_b.elapsed())
    })
    .expect("replica-b never got a request");
    println!("replica-b took its first request {b_seen:?} after its pod was added");
    std::thread::sleep(Duration::from_millis(800));

    let t_del = Instant::now();
    api.delete_pod("default", "replica-a");
    kv.wait_pods("study", 1, 0);
    let t_seen = Instant::now();
    println!("replica-a's deletion applied {:?} after it", t_seen - t_del);
    // Every request that started before then has ended: stop replica-a, so any request
    // still sent to it would fail.
    wait_for(Duration::from_secs(10), || {
        current
            .lock()
            .unwrap()
            .iter()
            .all(|s| *s > t_seen)
            .then_some(())
    })
    .expect("requests in flight never ended");
    let mut a = a;
    a.proc.kill();
    std::thread::sleep(Duration::from_millis(1000));
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }

    let all = sent.lock().unwrap();
    let phase1: Vec<&Sent> = all.iter().filter(|s| s.start < t_b).collect();
    let on_a_late = all
        .iter()
        .filter(|s| s.start > t_del && s.start < t_seen && s.replica == "replica-a")
        .count();
    let after: Vec<&Sent> = all.iter().filter(|s| s.start > t_seen).collect();
    let errors: Vec<u16> = all
        .iter()
        .filter(|s| s.status != 200)
        .map(|s| s.status)
        .collect();
    println!(
        "{} requests: {} before replica-b, {} after replica-a's deletion was applied ({} sent to replica-a between its deletion and then), errors {errors:?}",
        all.len(),
        phase1.len(),
        after.len(),
        on_a_late
    );
    assert!(phase1.len() >= 5 && phase1.iter().all(|s| s.replica == "replica-a"));
    assert!(all
        .iter()
        .any(|s| s.start > t_b && s.start < t_del && s.replica == "replica-b"));
    assert!(after.len() >= 5 && after.iter().all(|s| s.replica == "replica-b"));
    assert!(errors.is_empty(), "client errors: {errors:?}");
    kv.wait("in flight back to 0", || kv.tickets_open() == 0);
    let m = kv.metrics();
    assert_eq!(metric_sum(&m, "kvroute_pod_in_flight{"), 0, "{m}");
    assert_eq!(
        metric_sum(&m, "kvroute_ticket_release_errors_total "),
        0,
        "{m}"
    );
}
