//! The fake vLLM server: the engine model in (scaled) real time behind an OpenAI-compatible
//! HTTP API, with fault injection for end-to-end tests.
//!
//! ## Contract
//! - Binds `host:port` (port 0 = a free port) and, once accepting, prints the line
//!   `listening on HOST:PORT` to stdout (flushed); it is always the first line. Exits cleanly
//!   on SIGTERM/SIGINT (open streams get up to 2 s to finish).
//! - KV-cache events (a [`KvEventsConfig`]: `--kv-events-endpoint` and friends), as a vLLM
//!   started with `--kv-events-config` publishes them: the ZMQ PUB socket (and the replay
//!   ROUTER socket, if asked for) is bound before the first line is printed, and a second
//!   stdout line follows it (flushed): `kv-events on ENDPOINT`, or `kv-events on ENDPOINT
//!   replay REPLAY_ENDPOINT`, with the endpoints as bound (port 0 resolved). Each engine step
//!   that cached or evicted blocks (and each prime or successful `/reset_prefix_cache`) is
//!   published as one msgpack `KVEventBatch` in the chosen layout: chained stored blocks as one
//!   `BlockStored` (block size = the engine's, medium `GPU`), evicted blocks as one
//!   `BlockRemoved`, a reset as `AllBlocksCleared`, in the engine's order; seqs count from 0
//!   (see [`kv_publish`]). Publishing never stalls the engine; its first error is reported on
//!   stderr. Without it no socket is opened and only the first line is printed.
//! - Every response, errors included, carries `x-kvroute-sim-replica: NAME`.
//! - `POST /v1/completions`, `POST /v1/chat/completions`: streaming (SSE, `[DONE]`, usage chunk
//!   with `prompt_tokens_details.cached_tokens` when `stream_options.include_usage`) and
//!   non-streaming. The fake model always generates exactly `max_tokens` tokens. A model name
//!   other than the served one gets a 404; bad JSON or fields an OpenAI-style 400; a body over
//!   `max_body_bytes` (default 8 MiB) an OpenAI-style 413.
//! - Prompts are tokenized by [`ServeConfig::prompts`]: the built-in model (a chat as
//!   `role: content` lines), or a real tokenizer as vLLM uses it (a completion's text with
//!   special tokens, a chat rendered with the model's chat template and the generation prompt);
//!   `usage.prompt_tokens` counts those ids. A chat the template refuses is an OpenAI-style 400
//!   with the template's message.
//! - Fault injection:
//!   - a request header `x-sim-status: CODE` (400–599) makes any endpoint answer `CODE` with an
//!     OpenAI-style error body, without touching the engine;
//!   - a [`FaultSpec`] (the `--fault-*` flags at start-up; `POST /fault` with a JSON spec,
//!     `DELETE /fault` or `POST /fault {}` to clear, `GET /fault` to read it at run time)
//!     fails, stalls or drops the connection of some requests to `/v1/completions`,
//!     `/v1/chat/completions` and `/v1/models` (and with `health` of `/health` and
//!     `/metrics`); see [`fault`] for the selection rules. A bad spec is an OpenAI-style 400
//!     and leaves the current one in force;
//!   - "close" drops the TCP connection after reading the whole request, before any response
//!     byte (see `serve_connection`): a proxy sees the upstream connection terminate before
//!     response headers.
//! - `GET /v1/models`, `GET /health`, `GET /metrics` (vLLM names, with the time-to-first-token
//!   and end-to-end latency histograms in vLLM's buckets, measured in real time; plus
//!   `kvroute_sim_faults_total{kind="status|stall|close"}`), `POST /reset_prefix_cache`
//!   (200 `{"reset": true}`, or 409 while requests hold cached blocks).

mod driver;
pub mod fault;
pub mod kv_publish;
pub mod metrics;
pub mod openai;

pub use driver::{Driver, Subscription};
pub use fault::{FaultRequest, FaultSpec};
pub use kv_publish::KvEventsConfig;

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::{Listener, ListenerExt};
use axum::Router as AxumRouter;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tokio::sync::{watch, Notify};

use crate::engine::{Engine, EngineConfig, EngineConfigError};
use crate::prompt_tokens::PromptReader;
use fault::{FaultKind, Faults, Target, Then};
use openai::{ApiError, Endpoint, GenRequest, Prompt};

/// The response header naming the replica.
pub const REPLICA_HEADER: &str = "x-kvroute-sim-replica";
/// The fault-injection request header.
pub const STATUS_HEADER: &str = "x-sim-status";
/// The default request body limit: 8 MiB (kvroute's own `max_body_bytes` default is 4 MiB, and
/// Envoy buffers up to twice that).
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 << 20;
/// How much of a body over the limit is still read (and discarded) before the 413 is sent, so
/// that the client, done sending, reads the 413 rather than a connection reset.
const DRAIN_BYTES: u64 = 64 << 20;

/// What the server needs (KV-event publishing, optional, is configured apart: see
/// [`BoundServer::bind_with_kv_events`]).
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Address to bind (default 127.0.0.1).
    pub host: String,
    /// Port to bind; 0 picks a free one.
    pub port: u16,
    /// Replica name, sent in [`REPLICA_HEADER`].
    pub name: String,
    /// The served model name.
    pub model: String,
    /// How much faster than the model's time the engine runs (> 0).
    pub speedup: f64,
    /// The engine.
    pub engine: EngineConfig,
    /// The fault in force at start-up ([`FaultSpec::default`]: none).
    pub fault: FaultSpec,
    /// The largest request body accepted (> 0); a larger one gets a 413.
    pub max_body_bytes: usize,
    /// How prompts become token ids: the built-in model, or a real tokenizer (completions
    /// encoded with special tokens, chats rendered with its chat template, as vLLM does).
    pub prompts: PromptReader,
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The engine configuration is invalid.
    #[error(transparent)]
    Engine(#[from] EngineConfigError),
    /// The speed-up is not a positive finite number.
    #[error("speed-up must be a positive number, got {0}")]
    Speedup(f64),
    /// The replica name cannot be a header value.
    #[error("replica name {0:?} must be visible ASCII")]
    Name(String),
    /// The body limit is 0.
    #[error("the body limit must be at least 1 byte")]
    BodyLimit,
    /// Binding or serving failed.
    #[error("cannot serve on {addr}: {source}")]
    Io {
        /// The address.
        addr: String,
        /// The error.
        source: std::io::Error,
    },
    /// The KV-event sockets could not be bound.
    #[error("cannot publish KV events on {endpoint}: {source}")]
    KvEvents {
        /// The endpoints asked for (and the replay endpoint, if any).
        endpoint: String,
        /// The error.
        source: kvroute_kv_events::TransportError,
    },
}

struct App {
    driver: Arc<Driver>,
    model: String,
    name: HeaderValue,
    faults: Faults,
    max_body_bytes: usize,
    prompts: PromptReader,
}

/// A bound, not yet serving, server.
pub struct BoundServer {
    listener: tokio::net::TcpListener,
    app: AxumRouter,
    driver: Arc<Driver>,
    addr: SocketAddr,
    // The KV-event publisher; dropping it (when serving ends) closes its sockets.
    kv_events: Option<kv_publish::KvPublisher>,
}

impl BoundServer {
    /// Validates the configuration and binds the listener (no KV events are published).
    pub async fn bind(config: ServeConfig) -> Result<BoundServer, ServeError> {
        Self::bind_with_kv_events(config, None).await
    }

    /// As [`BoundServer::bind`], and, with `kv_events`, binds the KV-event sockets and starts
    /// publishing the engine's KV events (see the module docs). Must run inside a tokio runtime.
    pub async fn bind_with_kv_events(
        config: ServeConfig,
        kv_events: Option<KvEventsConfig>,
    ) -> Result<BoundServer, ServeError> {
        if !config.speedup.is_finite() || config.speedup <= 0.0 {
            return Err(ServeError::Speedup(config.speedup));
        }
        let name = HeaderValue::from_str(&config.name)
            .ok()
            .filter(|_| {
                !config.name.is_empty() && config.name.bytes().all(|b| b.is_ascii_graphic())
            })
            .ok_or_else(|| ServeError::Name(config.name.clone()))?;
        if config.max_body_bytes == 0 {
            return Err(ServeError::BodyLimit);
        }
        let engine = Engine::new(config.engine)?;
        let addr = format!("{}:{}", config.host, config.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|source| ServeError::Io {
                addr: addr.clone(),
                source,
            })?;
        let local = listener
            .local_addr()
            .map_err(|source| ServeError::Io { addr, source })?;
        let (driver, kv_events) = match kv_events {
            None => (Driver::new(engine, config.speedup), None),
            Some(kv) => {
                let (publisher, sink) =
                    kv_publish::KvPublisher::start(&kv, config.engine.block_size)
                        .await
                        .map_err(|source| ServeError::KvEvents {
                            endpoint: match &kv.replay_endpoint {
                                Some(r) => format!("{} (replay {r})", kv.endpoint),
                                None => kv.endpoint.clone(),
                            },
                            source,
                        })?;
                let driver = Driver::with_kv_sink(engine, config.speedup, sink);
                (driver, Some(publisher))
            }
        };
        let app = Arc::new(App {
            driver: Arc::clone(&driver),
            model: config.model,
            name,
            faults: Faults::new(config.fault),
            max_body_bytes: config.max_body_bytes,
            prompts: config.prompts,
        });
        Ok(BoundServer {
            listener,
            app: router(app),
            driver,
            addr: local,
            kv_events,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The KV-event PUB endpoint as bound (port 0 resolved), when publishing.
    pub fn kv_events_endpoint(&self) -> Option<&str> {
        self.kv_events.as_ref().map(|p| p.endpoint())
    }

    /// The KV-event replay ROUTER endpoint as bound, when publishing with one.
    pub fn kv_events_replay_endpoint(&self) -> Option<&str> {
        self.kv_events.as_ref().and_then(|p| p.replay_endpoint())
    }

    /// The engine driver (for tests and in-process use).
    pub fn driver(&self) -> Arc<Driver> {
        Arc::clone(&self.driver)
    }

    /// Serves until `shutdown` completes, then gives open streams up to 2 s.
    pub async fn serve(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let engine_task = tokio::spawn(Arc::clone(&self.driver).run());
        // TCP_NODELAY, as vLLM's uvicorn sets it: without it, every SSE event written after a
        // small one waits for the peer's delayed ACK (up to 40 ms). A socket that refuses the
        // option is served anyway.
        let mut listener = self.listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        // Connections are served one task each (not with `axum::serve`) so that a "close"
        // fault can drop its connection; see `serve_connection`.
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut connections = tokio::task::JoinSet::new();
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            tokio::select! {
                // `Listener::accept` retries (after a pause) on accept errors.
                (io, _) = listener.accept() => {
                    connections.spawn(serve_connection(io, self.app.clone(), stop_rx.clone()));
                }
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
                () = &mut shutdown => break,
            }
        }
        drop(listener);
        // Idle connections close at once; open responses get up to 2 s, then are dropped.
        let _ = stop_tx.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while connections.join_next().await.is_some() {}
        })
        .await;
        connections.abort_all();
        engine_task.abort();
        // Stops publishing and closes the KV-event sockets.
        drop(self.kv_events);
        Ok(())
    }
}

/// A connection's kill switch: the connection task puts one in every request's extensions;
/// [`ConnKill::close`] makes the task drop the connection.
#[derive(Clone)]
struct ConnKill(Arc<Notify>);

impl ConnKill {
    fn close(&self) {
        // `notify_one` keeps a permit if the task is not waiting at this instant.
        self.0.notify_one();
    }
}

/// Serves one HTTP/1.1 connection until it ends, the server stops (`stop` turns true: hyper's
/// graceful shutdown, which lets an open response finish), or a handler pulls its
/// [`ConnKill`].
///
/// Why a kill switch: a "close" fault must drop the TCP connection without writing any
/// response, and an axum handler can only return a response. Here the handler pulls the
/// switch and then never completes; this task, selecting on the switch, returns, which drops
/// the hyper connection and with it the socket. Nothing has been written on it for that
/// request (hyper writes a response head only when the handler returns one; the one exception
/// is an interim `100 Continue` when a client sent `Expect: 100-continue`), and the handler
/// has read the whole request first, so the kernel sends a FIN (an RST if the client had sent
/// more bytes, e.g. a pipelined request). Envoy then reports the upstream connection
/// terminated before response headers (`upstream_reset_before_response_started
/// {connection_termination}`), as for an engine that died mid-request. This relies on nothing
/// but dropping the connection future, so it cannot half-write a response.
async fn serve_connection(
    io: tokio::net::TcpStream,
    app: AxumRouter,
    mut stop: watch::Receiver<bool>,
) {
    let kill = ConnKill(Arc::new(Notify::new()));
    let router = hyper_util::service::TowerToHyperService::new(app);
    let switch = kill.clone();
    let service =
        hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
            req.extensions_mut().insert(switch.clone());
            hyper::service::Service::call(&router, req)
        });
    let conn = hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(io), service);
    let mut conn = std::pin::pin!(conn);
    let mut stopping = false;
    loop {
        tokio::select! {
            // Ends with the connection (an error is the client's problem: nothing to do).
            _ = conn.as_mut() => return,
            // Returning drops `conn`, and with it the socket, without a response.
            () = kill.0.notified() => return,
            _ = stop.wait_for(|s| *s), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// Binds, prints `listening on HOST:PORT` (and, when publishing KV events, `kv-events on
/// ENDPOINT[ replay REPLAY_ENDPOINT]`), and serves until SIGTERM or SIGINT.
pub async fn run(config: ServeConfig, kv_events: Option<KvEventsConfig>) -> Result<(), ServeError> {
    let server = BoundServer::bind_with_kv_events(config, kv_events).await?;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "listening on {}", server.local_addr());
    if let Some(endpoint) = server.kv_events_endpoint() {
        let _ = match server.kv_events_replay_endpoint() {
            Some(replay) => writeln!(out, "kv-events on {endpoint} replay {replay}"),
            None => writeln!(out, "kv-events on {endpoint}"),
        };
    }
    let _ = out.flush();
    drop(out);
    server.serve(shutdown_signal()).await
}

/// Completes on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

fn router(app: Arc<App>) -> AxumRouter {
    AxumRouter::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics_handler))
        .route("/reset_prefix_cache", post(reset_prefix_cache))
        .route("/fault", get(get_fault).post(set_fault).delete(clear_fault))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(
            Arc::clone(&app),
            common_layer,
        ))
        .with_state(app)
}

fn error_response(e: &ApiError) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, axum::Json(e.body())).into_response()
}

/// Adds the replica header to every response (none is sent for a "close" fault) and applies
/// the faults.
async fn common_layer(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let mut resp = apply_faults(&app, req, next).await;
    resp.headers_mut().insert(REPLICA_HEADER, app.name.clone());
    resp
}

fn injected_error(code: u16, why: &str) -> Response {
    error_response(&ApiError {
        status: code,
        message: format!("injected failure ({why})"),
    })
}

/// `x-sim-status`, then the fault spec, then the endpoint. A faulted request is read whole
/// before it is answered (or dropped), so the client has finished sending and reads the answer
/// rather than a reset; it never reaches the engine unless it is a stall that then proceeds.
async fn apply_faults(app: &App, req: Request, next: Next) -> Response {
    if let Some(v) = req.headers().get(STATUS_HEADER) {
        let code = v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u16>().ok())
            .filter(|c| (400..=599).contains(c));
        let _ = read_body(req.into_body(), app.max_body_bytes).await;
        return match code {
            Some(code) => {
                app.faults.record(FaultKind::Status);
                injected_error(code, &format!("{STATUS_HEADER}: {code}"))
            }
            None => error_response(&ApiError::bad_request(format!(
                "{STATUS_HEADER} must be a status code between 400 and 599"
            ))),
        };
    }
    let fault = Target::of_path(req.uri().path()).and_then(|t| app.faults.decide(t));
    let Some(fault) = fault else {
        return next.run(req).await;
    };
    let (parts, body) = req.into_parts();
    let body = match read_body(body, app.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => return error_response(&e),
    };
    if !fault.stall.is_zero() {
        app.faults.record(FaultKind::Stall);
        tokio::time::sleep(fault.stall).await;
    }
    match fault.then {
        Then::Proceed => next.run(Request::from_parts(parts, Body::from(body))).await,
        Then::Status(code) => {
            app.faults.record(FaultKind::Status);
            injected_error(code, "fault spec")
        }
        Then::Close => match parts.extensions.get::<ConnKill>() {
            Some(kill) => {
                app.faults.record(FaultKind::Close);
                kill.close();
                // The connection task drops this future with the connection.
                std::future::pending::<Response>().await
            }
            None => error_response(&ApiError {
                status: 500,
                message: "cannot drop this connection (not served by BoundServer::serve)".into(),
            }),
        },
    }
}

/// Reads a request body of at most `limit` bytes. A longer one is an OpenAI-style 413; it is
/// still read (and discarded) up to [`DRAIN_BYTES`] more, so that the client reads the 413
/// rather than a connection reset.
async fn read_body(mut body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let mut buf = bytes::BytesMut::new();
    let mut total: u64 = 0;
    let limit64 = limit as u64;
    while let Some(frame) = body.frame().await {
        let frame = frame
            .map_err(|e| ApiError::bad_request(format!("cannot read the request body: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        total += data.len() as u64;
        if total <= limit64 {
            buf.extend_from_slice(&data);
        } else {
            buf = bytes::BytesMut::new();
            if total > limit64.saturating_add(DRAIN_BYTES) {
                break;
            }
        }
    }
    if total > limit64 {
        return Err(ApiError {
            status: 413,
            message: format!(
                "request body larger than {limit} bytes (the server's --max-body-bytes)"
            ),
        });
    }
    Ok(buf.freeze())
}

async fn get_fault(State(app): State<Arc<App>>) -> Response {
    axum::Json(app.faults.spec()).into_response()
}

async fn set_fault(State(app): State<Arc<App>>, req: Request) -> Response {
    let body = match read_body(req.into_body(), app.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => return error_response(&e),
    };
    match FaultSpec::from_json(&body) {
        Ok(spec) => {
            app.faults.set(spec.clone());
            axum::Json(spec).into_response()
        }
        Err(message) => error_response(&ApiError::bad_request(message)),
    }
}

async fn clear_fault(State(app): State<Arc<App>>) -> Response {
    app.faults.set(FaultSpec::default());
    axum::Json(FaultSpec::default()).into_response()
}

async fn not_found() -> Response {
    error_response(&ApiError {
        status: 404,
        message: "not found".into(),
    })
}

async fn health() -> StatusCode {
    StatusCode::OK
}

async fn models(State(app): State<Arc<App>>) -> Response {
    let max_model_len = EngineConfig::default().max_model_len;
    axum::Json(json!({
        "object": "list",
        "data": [{ "id": app.model, "object": "model", "created": unix_now(), "owned_by": "kvroute-sim",
                   "root": app.model, "max_model_len": max_model_len }],
    }))
    .into_response()
}

async fn metrics_handler(State(app): State<Arc<App>>) -> Response {
    let (c, total) = app.driver.counters();
    let latencies = app.driver.latencies();
    let mut text = metrics::render(&app.model, &c, total, app.driver.speedup(), &latencies);
    text.push_str(&metrics::render_faults(&app.faults.injected()));
    (
        [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
        text,
    )
        .into_response()
}

async fn reset_prefix_cache(State(app): State<Arc<App>>) -> Response {
    if app.driver.reset_prefix_cache() {
        axum::Json(json!({ "reset": true })).into_response()
    } else {
        error_response(&ApiError {
            status: 409,
            message: "requests are holding cached blocks; try again when idle".into(),
        })
    }
}

async fn completions(State(app): State<Arc<App>>, req: Request) -> Response {
    match read_body(req.into_body(), app.max_body_bytes).await {
        Ok(body) => generate(app, Endpoint::Completions, &body).await,
        Err(e) => error_response(&e),
    }
}

async fn chat_completions(State(app): State<Arc<App>>, req: Request) -> Response {
    match read_body(req.into_body(), app.max_body_bytes).await {
        Ok(body) => generate(app, Endpoint::Chat, &body).await,
        Err(e) => error_response(&e),
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

async fn generate(app: Arc<App>, endpoint: Endpoint, body: &[u8]) -> Response {
    let req = match openai::parse(endpoint, body) {
        Ok(r) => r,
        Err(e) => return error_response(&e),
    };
    if req.model != app.model {
        return error_response(&ApiError {
            status: 404,
            message: format!("The model `{}` does not exist.", req.model),
        });
    }
    let tokens = match &req.prompt {
        Prompt::Text(t) => app.prompts.completion(t),
        Prompt::Tokens(ids) => Ok(ids.clone()),
        Prompt::Chat { messages, rendered } => app.prompts.chat(messages, rendered),
    };
    // vLLM answers a chat its template refuses (a bad role, roles not alternating, ...) with a
    // 400 that carries the template's message.
    let tokens = match tokens {
        Ok(t) => t,
        Err(e) => return error_response(&ApiError::bad_request(e.to_string())),
    };
    let sub = match app.driver.submit(&tokens, req.max_tokens) {
        Ok(s) => s,
        Err(e) => return error_response(&ApiError::bad_request(e.to_string())),
    };
    // The prompt is the engine's now; the response (which clones the request per streamed
    // chunk) does not need it.
    let req = GenRequest {
        prompt: Prompt::Tokens(Vec::new()),
        ..req
    };
    let prefix = if endpoint == Endpoint::Chat {
        "chatcmpl"
    } else {
        "cmpl"
    };
    let id = format!("{prefix}-{}-{}", app.name.to_str().unwrap_or("sim"), sub.id);
    if req.stream {
        stream_response(req, sub, id)
    } else {
        whole_response(req, sub, id).await
    }
}

async fn whole_response(req: GenRequest, mut sub: Subscription, id: String) -> Response {
    let mut text = String::new();
    let mut last = None;
    while let Some(ev) = sub.next().await {
        text.push_str(openai::token_text(ev.generated));
        last = Some(ev);
    }
    let Some(ev) = last.filter(|e| e.finished) else {
        return error_response(&ApiError {
            status: 500,
            message: "the engine stopped before the request finished".into(),
        });
    };
    let usage = openai::usage(ev.prompt_tokens, ev.generated, ev.cached_tokens);
    axum::Json(openai::full_response(
        req.endpoint,
        &id,
        unix_now(),
        &req.model,
        &text,
        usage,
    ))
    .into_response()
}

fn sse(v: &Value) -> Result<Bytes, Infallible> {
    Ok(Bytes::from(format!("data: {v}\n\n")))
}

fn stream_response(req: GenRequest, sub: Subscription, id: String) -> Response {
    let created = unix_now();
    let state = (sub, false);
    let stream = futures_util::stream::unfold(state, move |(mut sub, done)| {
        let (req, id) = (req.clone(), id.clone());
        async move {
            if done {
                return None;
            }
            match sub.next().await {
                Some(ev) => {
                    let mut out = String::new();
                    let finish = ev.finished.then_some("length");
                    let c = openai::chunk(
                        req.endpoint,
                        &id,
                        created,
                        &req.model,
                        openai::token_text(ev.generated),
                        ev.generated == 1,
                        finish,
                    );
                    out.push_str(&format!("data: {c}\n\n"));
                    if ev.finished {
                        if req.include_usage {
                            let u = openai::usage(ev.prompt_tokens, ev.generated, ev.cached_tokens);
                            out.push_str(&format!(
                                "data: {}\n\n",
                                openai::usage_chunk(req.endpoint, &id, created, &req.model, u)
                            ));
                        }
                        out.push_str("data: [DONE]\n\n");
                    }
                    Some((
                        Ok::<Bytes, Infallible>(Bytes::from(out)),
                        (sub, ev.finished),
                    ))
                }
                None => {
                    let e = ApiError {
                        status: 500,
                        message: "the engine stopped".into(),
                    };
                    Some((sse(&e.body()), (sub, true)))
                }
            }
        }
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| {
            error_response(&ApiError {
                status: 500,
                message: "response build failed".into(),
            })
        })
}
