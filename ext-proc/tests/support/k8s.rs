//! A fake Kubernetes API server for the discovery tests: HTTP/1.1 on 127.0.0.1 on its own
//! runtime thread, the real list/watch protocol for pods and `InferencePool`s, and a control
//! API (plain methods) for the tests.
//!
//! - `GET /api/v1/pods`, `/api/v1/namespaces/NS/pods`, and
//!   `/apis/inference.networking.k8s.io/v1[/namespaces/NS]/inferencepools`: a list
//!   (`labelSelector` `k`, `!k`, `k=v`, `k==v`, `k!=v`; `fieldSelector` on `metadata.name` or
//!   `metadata.namespace`; `limit`/`continue` pages, capped by [`FakeApi::set_page_size`]).
//! - The same with `watch=true&resourceVersion=RV`: chunked newline-delimited JSON events
//!   after RV (an object that starts or stops matching the selector is ADDED or DELETED, as
//!   the API server's watch cache says), a BOOKMARK every second with
//!   `allowWatchBookmarks=true`, closed after `timeoutSeconds`. An RV older than the
//!   compaction point ([`FakeApi::compact`]) gets one `ERROR` event: `Status` 410 `Expired`.
//! - Objects are `k8s-openapi` types serialized with serde_json; every write takes the next
//!   value of one global resourceVersion. Bad client input gets a 400/404/405 `Status`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::Frame;
use k8s_openapi::api::core::v1::{Container, ContainerPort, Pod, PodCondition, PodSpec};
use k8s_openapi::api::core::v1::{PodIP, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot, watch};

type Body = BoxBody<Bytes, std::io::Error>;
type Chunk = Result<Frame<Bytes>, std::io::Error>;
const POOL_API: &str = "inference.networking.k8s.io/v1";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Pod,
    Pool,
}

impl Kind {
    /// `(apiVersion, kind)`.
    fn types(self) -> (&'static str, &'static str) {
        match self {
            Kind::Pod => ("v1", "Pod"),
            Kind::Pool => (POOL_API, "InferencePool"),
        }
    }
}

/// One write: the object after it (`deleted`: the object as deleted) and before it.
struct Change {
    rv: u64,
    kind: Kind,
    deleted: bool,
    object: Value,
    prev: Option<Value>,
}

#[derive(Default)]
struct Store {
    rv: u64,
    uids: u64,
    compacted: u64,
    objects: BTreeMap<(Kind, String, String), Value>,
    log: Vec<Change>,
    fail_lists: u32,
    /// Per namespace: the next list calls of `/namespaces/NS/...` that fail (before
    /// `fail_lists`).
    fail_lists_in: BTreeMap<String, u32>,
    page_size: Option<usize>,
    /// Bumped by `drop_watches`: streams opened before end.
    drops: u64,
    open_watches: usize,
    lists: u64,
    watches: u64,
    requests: Vec<String>,
}

struct State {
    store: Mutex<Store>,
    changed: watch::Sender<u64>,
}

/// The fake API server; stopped (every stream cut) on drop.
pub struct FakeApi {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    state: Arc<State>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeApi {
    pub fn start() -> FakeApi {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the fake API");
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (changed, _) = watch::channel(0);
        let state = Arc::new(State {
            store: Mutex::default(),
            changed,
        });
        let (stop, stop_rx) = oneshot::channel();
        let s = state.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            rt.expect("fake API runtime")
                .block_on(serve(listener, s, stop_rx));
        });
        let (stop, thread) = (Some(stop), Some(thread));
        FakeApi {
            url,
            state,
            stop,
            thread,
        }
    }

    /// Adds a pod (ADDED; panics if it exists); returns the new resourceVersion.
    pub fn add_pod(&self, pod: &VllmPod) -> u64 {
        self.put(Kind::Pod, pod.value(), Some(false))
    }
    /// Replaces a pod (MODIFIED; panics if it does not exist).
    pub fn modify_pod(&self, pod: &VllmPod) -> u64 {
        self.put(Kind::Pod, pod.value(), Some(true))
    }
    pub fn delete_pod(&self, namespace: &str, name: &str) -> u64 {
        self.delete(Kind::Pod, namespace, name)
    }
    /// Adds or replaces an InferencePool.
    pub fn put_pool(&self, pool: &InferencePool) -> u64 {
        self.put(Kind::Pool, pool.to_value(), None)
    }
    pub fn delete_pool(&self, namespace: &str, name: &str) -> u64 {
        self.delete(Kind::Pool, namespace, name)
    }

    /// Cuts every open watch stream abruptly (the chunked body ends without its last chunk).
    pub fn drop_watches(&self) {
        self.state.store.lock().drops += 1;
        self.state.changed.send_modify(|n| *n += 1);
    }
    /// Compacts at a new resourceVersion: every RV handed out so far is expired, so a watch
    /// resuming from one gets the 410 `ERROR` event (in a real cluster other writes move the
    /// revision on, so a client never holds the compaction point). Open watches go on.
    pub fn compact(&self) {
        let mut st = self.state.store.lock();
        st.rv += 1;
        st.compacted = st.rv;
    }
    /// The next `n` list calls answer 500 with a `Status`.
    pub fn fail_lists(&self, n: u32) {
        self.state.store.lock().fail_lists = n;
    }
    /// The next `n` list calls in namespace `ns` (paths `/namespaces/NS/...`, not the
    /// cluster-wide ones) answer 500 with a `Status`; other namespaces' lists are untouched.
    /// Counted apart from (and before) [`FakeApi::fail_lists`].
    pub fn fail_lists_in(&self, ns: &str, n: u32) {
        self.state
            .store
            .lock()
            .fail_lists_in
            .insert(ns.to_owned(), n);
    }
    /// Pages of at most `n` items when the client asks for pages (a server may return fewer
    /// than `limit`).
    pub fn set_page_size(&self, n: usize) {
        self.state.store.lock().page_size = Some(n.max(1));
    }
    /// List calls made (one per page; failed ones too).
    pub fn list_calls(&self) -> u64 {
        self.state.store.lock().lists
    }
    pub fn watch_calls(&self) -> u64 {
        self.state.store.lock().watches
    }
    pub fn open_watches(&self) -> usize {
        self.state.store.lock().open_watches
    }
    /// Every request's `path?query`, in order.
    pub fn requests(&self) -> Vec<String> {
        self.state.store.lock().requests.clone()
    }

    fn put(&self, kind: Kind, mut obj: Value, exists: Option<bool>) -> u64 {
        let meta = &obj["metadata"];
        let ns = meta["namespace"].as_str().unwrap_or("default").to_owned();
        let name = meta["name"].as_str().expect("a name").to_owned();
        let mut st = self.state.store.lock();
        let key = (kind, ns.clone(), name);
        let prev = st.objects.get(&key).cloned();
        if let Some(want) = exists {
            assert_eq!(prev.is_some(), want, "{key:?} exists?");
        }
        st.rv += 1;
        st.uids += 1;
        let rv = st.rv;
        let fresh = json!({ "uid": format!("6f1e6a4c-0000-4000-8000-{:012x}", st.uids),
            "creationTimestamp": Time(k8s_openapi::jiff::Timestamp::now()) });
        let old = prev.as_ref().map_or(&fresh, |p| &p["metadata"]);
        let meta = &mut obj["metadata"];
        meta["namespace"] = json!(ns);
        meta["uid"] = old["uid"].clone();
        meta["creationTimestamp"] = old["creationTimestamp"].clone();
        meta["resourceVersion"] = json!(rv.to_string());
        st.objects.insert(key, obj.clone());
        st.log.push(Change {
            rv,
            kind,
            deleted: false,
            object: obj,
            prev,
        });
        drop(st);
        self.state.changed.send_modify(|n| *n += 1);
        rv
    }

    fn delete(&self, kind: Kind, ns: &str, name: &str) -> u64 {
        let mut st = self.state.store.lock();
        let key = (kind, ns.to_owned(), name.to_owned());
        let mut obj = st.objects.remove(&key).expect("delete: no such object");
        st.rv += 1;
        let rv = st.rv;
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        let prev = Some(obj.clone());
        st.log.push(Change {
            rv,
            kind,
            deleted: true,
            object: obj,
            prev,
        });
        drop(st);
        self.state.changed.send_modify(|n| *n += 1);
        rv
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A vLLM pod as the API server shows it (`to_pod`); change fields with struct update syntax.
#[derive(Clone, Debug)]
pub struct VllmPod {
    pub name: String,
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    pub ip: Option<String>,
    pub ready: bool,
    pub phase: String,
    pub deleting: bool,
}

impl VllmPod {
    /// Running and Ready in `default`, at `ip` (if any), no labels.
    pub fn new(name: &str, ip: Option<&str>) -> VllmPod {
        VllmPod {
            name: name.into(),
            namespace: "default".into(),
            labels: BTreeMap::new(),
            ip: ip.map(Into::into),
            ready: true,
            phase: "Running".into(),
            deleting: false,
        }
    }
    /// Running and Ready in `default`, at `ip`, labelled `model.aibrix.ai/name=model`.
    pub fn aibrix(name: &str, model: &str, ip: &str) -> VllmPod {
        VllmPod::new(name, Some(ip)).label("model.aibrix.ai/name", model)
    }
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.labels.insert(k.into(), v.into());
        self
    }
    /// In namespace `ns`.
    pub fn ns(self, ns: &str) -> Self {
        VllmPod {
            namespace: ns.into(),
            ..self
        }
    }

    fn value(&self) -> Value {
        serde_json::to_value(self.to_pod()).expect("a pod serializes")
    }

    pub fn to_pod(&self) -> Pod {
        let now = || Time(k8s_openapi::jiff::Timestamp::now());
        let condition = |t: &str, ok: bool| PodCondition {
            type_: t.into(),
            status: if ok { "True" } else { "False" }.into(),
            last_transition_time: Some(now()),
            ..Default::default()
        };
        let port = self
            .labels
            .get("model.aibrix.ai/port")
            .and_then(|p| p.parse().ok());
        let container = Container {
            name: "vllm".into(),
            image: Some("vllm/vllm-openai:v0.10.1".into()),
            ports: Some(vec![ContainerPort {
                container_port: port.unwrap_or(8000),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let scheduled = self.ip.is_some();
        Pod {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                labels: Some(self.labels.clone()),
                deletion_timestamp: self.deleting.then(now),
                deletion_grace_period_seconds: self.deleting.then_some(30),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![container],
                node_name: scheduled.then(|| "node-1".into()),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some(self.phase.clone()),
                pod_ip: self.ip.clone(),
                pod_ips: self.ip.clone().map(|ip| vec![PodIP { ip }]),
                host_ip: scheduled.then(|| "192.168.0.10".into()),
                start_time: scheduled.then(now),
                conditions: Some(vec![
                    condition("PodScheduled", scheduled),
                    condition("ContainersReady", self.ready),
                    condition("Ready", self.ready),
                ]),
                ..Default::default()
            }),
        }
    }
}

/// An `InferencePool` (`inference.networking.k8s.io/v1`).
#[derive(Clone, Debug)]
pub struct InferencePool {
    pub name: String,
    pub namespace: String,
    pub match_labels: BTreeMap<String, String>,
    pub target_ports: Vec<u16>,
}

impl InferencePool {
    /// In `default`.
    pub fn new(name: &str, labels: &[(&str, &str)], ports: &[u16]) -> InferencePool {
        InferencePool {
            name: name.into(),
            namespace: "default".into(),
            match_labels: labels
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
            target_ports: ports.to_vec(),
        }
    }

    fn to_value(&self) -> Value {
        let meta = ObjectMeta {
            name: Some(self.name.clone()),
            namespace: Some(self.namespace.clone()),
            ..Default::default()
        };
        let ports: Vec<Value> = self
            .target_ports
            .iter()
            .map(|n| json!({ "number": n }))
            .collect();
        json!({ "apiVersion": POOL_API, "kind": "InferencePool", "metadata": meta,
            "spec": { "selector": { "matchLabels": self.match_labels }, "targetPorts": ports,
                "endpointPickerRef": { "kind": "Service", "name": "kvroute-epp",
                    "port": { "number": 50052 }, "failureMode": "FailClose" } } })
    }
}

// ----- serving -----

async fn serve(listener: std::net::TcpListener, state: Arc<State>, stop: oneshot::Receiver<()>) {
    let listener = tokio::net::TcpListener::from_std(listener).expect("fake API listener");
    let accept = async {
        while let Ok((tcp, _)) = listener.accept().await {
            let state = state.clone();
            let service = hyper::service::service_fn(move |req| {
                let response = handle(&state, &req);
                async move { Ok::<_, std::convert::Infallible>(response) }
            });
            let io = hyper_util::rt::TokioIo::new(tcp);
            let conn = hyper::server::conn::http1::Builder::new().serve_connection(io, service);
            tokio::spawn(conn);
        }
    };
    tokio::select! {
        _ = accept => {}
        _ = stop => {}
    }
}

fn respond(code: u16, body: Body) -> hyper::Response<Body> {
    let mut r = hyper::Response::new(body);
    *r.status_mut() = hyper::StatusCode::from_u16(code).unwrap_or_default();
    r.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    r
}

fn json_response(code: u16, body: &Value) -> hyper::Response<Body> {
    let full = Full::new(Bytes::from(body.to_string())).map_err(|e| match e {});
    respond(code, full.boxed())
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({ "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code })
}

fn fail(code: u16, reason: &str, message: &str) -> hyper::Response<Body> {
    json_response(code, &status(code, reason, message))
}

fn handle<B>(state: &Arc<State>, req: &hyper::Request<B>) -> hyper::Response<Body> {
    let (path, query) = (req.uri().path(), req.uri().query().unwrap_or(""));
    state.store.lock().requests.push(format!("{path}?{query}"));
    if req.method() != hyper::Method::GET {
        return fail(405, "MethodNotAllowed", "only GET is served here");
    }
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (kind, ns) = match segments.as_slice() {
        ["api", "v1", "pods"] => (Kind::Pod, None),
        ["api", "v1", "namespaces", ns, "pods"] => (Kind::Pod, Some(*ns)),
        ["apis", "inference.networking.k8s.io", "v1", "inferencepools"] => (Kind::Pool, None),
        ["apis", "inference.networking.k8s.io", "v1", "namespaces", ns, "inferencepools"] => {
            (Kind::Pool, Some(*ns))
        }
        _ => {
            return fail(
                404,
                "NotFound",
                "the server could not find the requested resource",
            )
        }
    };
    let mut params = BTreeMap::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let (Some(k), Some(v)) = (decode(k), decode(v)) else {
            return fail(
                400,
                "BadRequest",
                &format!("malformed query parameter {pair:?}"),
            );
        };
        params.insert(k, v);
    }
    let number = |key: &str| match params.get(key).map(String::as_str) {
        None | Some("") => Ok(None),
        Some(v) => v
            .parse::<u64>()
            .map(Some)
            .map_err(|_| format!("invalid {key}: {v:?}")),
    };
    let result = Selector::parse(kind, ns, &params).and_then(|sel| {
        if params.get("watch").is_some_and(|w| w == "true" || w == "1") {
            let timeout = number("timeoutSeconds")?.unwrap_or(1800);
            let bookmarks = params
                .get("allowWatchBookmarks")
                .is_some_and(|b| b == "true");
            Ok(start_watch(
                state,
                sel,
                number("resourceVersion")?,
                timeout,
                bookmarks,
            ))
        } else {
            let (limit, token) = (number("limit")?, params.get("continue"));
            Ok(list(state, ns, &sel, limit, token))
        }
    });
    result.unwrap_or_else(|e| fail(400, "BadRequest", &e))
}

fn list(
    state: &State,
    ns: Option<&str>,
    sel: &Selector,
    limit: Option<u64>,
    token: Option<&String>,
) -> hyper::Response<Body> {
    let mut st = state.store.lock();
    st.lists += 1;
    let in_ns = ns
        .and_then(|ns| st.fail_lists_in.get_mut(ns))
        .filter(|n| **n > 0);
    let failing = if let Some(n) = in_ns {
        *n -= 1;
        true
    } else if st.fail_lists > 0 {
        st.fail_lists -= 1;
        true
    } else {
        false
    };
    if failing {
        return fail(
            500,
            "InternalError",
            "etcdserver: request timed out (injected)",
        );
    }
    // The continue token: the first page's resourceVersion, then the last key served.
    let (rv, after) = match token.filter(|t| !t.is_empty()) {
        None => (st.rv, None),
        Some(t) => {
            let mut parts = t.splitn(3, '/');
            let (rv, ns, name) = (parts.next(), parts.next(), parts.next());
            let (Some(Ok(rv)), Some(ns), Some(name)) = (rv.map(str::parse::<u64>), ns, name) else {
                return fail(400, "BadRequest", &format!("invalid continue token {t:?}"));
            };
            if rv < st.compacted {
                let msg = "The provided continue parameter is too old to display a consistent list result.";
                return fail(410, "Expired", msg);
            }
            (rv, Some((ns.to_owned(), name.to_owned())))
        }
    };
    let limit = limit.filter(|l| *l > 0).map(|l| {
        let l = usize::try_from(l).unwrap_or(usize::MAX);
        st.page_size.map_or(l, |p| l.min(p))
    });
    let (mut items, mut last, mut more) = (Vec::new(), None, false);
    for ((kind, ns, name), obj) in &st.objects {
        let past = after
            .as_ref()
            .is_none_or(|(a_ns, a_name)| (ns, name) > (a_ns, a_name));
        if *kind != sel.kind || !past || !sel.matches(obj) {
            continue;
        }
        if limit.is_some_and(|l| items.len() == l) {
            more = true;
            break;
        }
        let mut item = obj.clone();
        if let (Kind::Pod, Some(m)) = (kind, item.as_object_mut()) {
            // A built-in type's list items carry no apiVersion/kind (a custom resource's do).
            m.remove("apiVersion");
            m.remove("kind");
        }
        items.push(item);
        last = Some((ns, name));
    }
    let next = last
        .filter(|_| more)
        .map(|(ns, name)| format!("{rv}/{ns}/{name}"));
    let (api_version, kind) = sel.kind.types();
    let mut meta = json!({ "resourceVersion": rv.to_string() });
    if let Some(token) = next {
        meta["continue"] = json!(token);
    }
    let body = json!({ "kind": format!("{kind}List"), "apiVersion": api_version,
        "metadata": meta, "items": items });
    json_response(200, &body)
}

fn event(kind: &str, object: &Value) -> Chunk {
    let mut line = json!({ "type": kind, "object": object }).to_string();
    line.push('\n');
    Ok(Frame::data(Bytes::from(line)))
}

/// A watch: 200 and a chunked stream of events after `from`, fed by [`stream_events`].
fn start_watch(
    state: &Arc<State>,
    sel: Selector,
    from: Option<u64>,
    timeout: u64,
    bookmarks: bool,
) -> hyper::Response<Body> {
    let (tx, rx) = mpsc::channel::<Chunk>(256);
    let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    let response = respond(200, BodyExt::boxed(body));
    let mut st = state.store.lock();
    st.watches += 1;
    let cursor = match from {
        Some(rv) if rv < st.compacted => {
            let msg = format!("too old resource version: {rv} ({})", st.compacted);
            let _ = tx.try_send(event("ERROR", &status(410, "Expired", &msg)));
            return response; // `tx` dropped: the stream ends after the event.
        }
        Some(rv) => rv,
        None => {
            // resourceVersion absent or 0: the current objects first, as ADDED.
            for ((kind, _, _), obj) in &st.objects {
                if *kind == sel.kind && sel.matches(obj) {
                    let _ = tx.try_send(event("ADDED", obj));
                }
            }
            st.rv
        }
    };
    st.open_watches += 1;
    let generation = st.drops;
    drop(st);
    let watch = Watch {
        state: state.clone(),
        sel,
        generation,
        bookmarks,
    };
    tokio::spawn(watch.stream_events(tx, cursor, Duration::from_secs(timeout)));
    response
}

struct Watch {
    state: Arc<State>,
    sel: Selector,
    generation: u64,
    bookmarks: bool,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.state.store.lock().open_watches -= 1;
    }
}

impl Watch {
    /// The events after `cursor` (`None`: the stream was dropped); moves `cursor` to now.
    fn pending(&self, cursor: &mut u64) -> Option<Vec<Chunk>> {
        let st = self.state.store.lock();
        if st.drops != self.generation {
            return None;
        }
        let mut events = Vec::new();
        for c in st
            .log
            .iter()
            .filter(|c| c.rv > *cursor && c.kind == self.sel.kind)
        {
            let now = !c.deleted && self.sel.matches(&c.object);
            let before = c.prev.as_ref().is_some_and(|p| self.sel.matches(p));
            if now {
                events.push(event(if before { "MODIFIED" } else { "ADDED" }, &c.object));
            } else if let (true, Some(prev)) = (before, &c.prev) {
                // Deleted, or no longer selected: its last state, at this resourceVersion.
                let mut gone = prev.clone();
                gone["metadata"]["resourceVersion"] = json!(c.rv.to_string());
                events.push(event("DELETED", &gone));
            }
        }
        *cursor = st.rv;
        Some(events)
    }

    async fn stream_events(self, tx: mpsc::Sender<Chunk>, mut cursor: u64, timeout: Duration) {
        let mut changed = self.state.changed.subscribe();
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let every = Duration::from_secs(1);
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        loop {
            let Some(events) = self.pending(&mut cursor) else {
                // Abrupt: on a body error hyper closes the connection without the last chunk.
                let _ = tx
                    .send(Err(std::io::Error::other("watch dropped by the test")))
                    .await;
                return;
            };
            for e in events {
                if tx.send(e).await.is_err() {
                    return;
                }
            }
            tokio::select! {
                r = changed.changed() => if r.is_err() { return },
                _ = tick.tick(), if self.bookmarks => {
                    let (api_version, kind) = self.sel.kind.types();
                    let mark = json!({ "apiVersion": api_version, "kind": kind,
                        "metadata": { "resourceVersion": cursor.to_string() } });
                    if tx.send(event("BOOKMARK", &mark)).await.is_err() {
                        return;
                    }
                }
                _ = &mut deadline => return,
                _ = tx.closed() => return,
            }
        }
    }
}

/// `%XX` and `+` decoding of one query component.
fn decode(s: &str) -> Option<String> {
    let (b, mut out, mut i) = (s.as_bytes(), Vec::with_capacity(s.len()), 0);
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                out.push(
                    u8::from_str_radix(hex, 16)
                        .ok()
                        .filter(|_| !hex.starts_with('+'))?,
                );
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// One requirement: a label (`field` None) or a metadata field; a value (None: the label
/// exists), `eq` false for `!=` / `!k`.
struct Req {
    field: Option<&'static str>,
    key: String,
    value: Option<String>,
    eq: bool,
}

struct Selector {
    kind: Kind,
    reqs: Vec<Req>,
}

impl Selector {
    fn parse(
        kind: Kind,
        ns: Option<&str>,
        params: &BTreeMap<String, String>,
    ) -> Result<Selector, String> {
        let valid = |s: &str, key: bool| {
            s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c) || (key && c == '/'))
        };
        let mut reqs = Vec::new();
        for (param, fields) in [("labelSelector", false), ("fieldSelector", true)] {
            for t in params
                .get(param)
                .into_iter()
                .flat_map(|s| s.split(','))
                .map(str::trim)
            {
                let (key, value, eq) = if let Some(k) = t.strip_prefix('!') {
                    (k, None, false)
                } else if let Some((k, v)) = t.split_once("!=") {
                    (k, Some(v), false)
                } else if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
                    (k, Some(v), true)
                } else {
                    (t, None, true)
                };
                let (key, value) = (key.trim(), value.map(str::trim));
                if key.is_empty() || !valid(key, true) || !value.is_none_or(|v| valid(v, false)) {
                    return Err(format!("unable to parse requirement: {t:?}"));
                }
                let field = match (fields, key, value) {
                    (false, ..) => None,
                    (true, "metadata.name", Some(_)) => Some("name"),
                    (true, "metadata.namespace", Some(_)) => Some("namespace"),
                    _ => return Err(format!("field label not supported: {t:?}")),
                };
                let (key, value) = (key.to_owned(), value.map(str::to_owned));
                reqs.push(Req {
                    field,
                    key,
                    value,
                    eq,
                });
            }
        }
        if let Some(ns) = ns {
            let (key, value) = ("metadata.namespace".into(), Some(ns.to_owned()));
            reqs.push(Req {
                field: Some("namespace"),
                key,
                value,
                eq: true,
            });
        }
        Ok(Selector { kind, reqs })
    }

    fn matches(&self, obj: &Value) -> bool {
        self.reqs.iter().all(|r| {
            let got = match r.field {
                Some(f) => obj["metadata"][f].as_str(),
                None => obj["metadata"]["labels"][&r.key].as_str(),
            };
            match &r.value {
                None => got.is_some() == r.eq,
                Some(v) => (got == Some(v.as_str())) == r.eq,
            }
        })
    }
}
