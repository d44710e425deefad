//! The fake vLLM server: the engine model in (scaled) real time behind an OpenAI-compatible
//! HTTP API, with fault injection for end-to-end tests.
//!
//! ## Contract
//! - Binds `host:port` (port 0 = a free port) and, once accepting, prints the line
//!   `listening on HOST:PORT` to stdout (flushed); it is always the first line. Exits cleanly
//!   on SIGTERM/SIGINT (open streams get up to 2 s to finish).
//! - Data parallelism ([`ServeConfig::data_parallel_size`] N, 1–64, default 1;
//!   `--data-parallel-size`), as a vLLM started with `--data-parallel-size N` behind one API
//!   server: N engines ("ranks", each its own engine model built from the one
//!   [`EngineConfig`]: its own KV cache, slots, queue and driver, all in (scaled) real time)
//!   behind the one port. A generation request goes to the rank its `X-data-parallel-rank: R`
//!   header names (any case; not an integer in `[0, N)`: an OpenAI-style 400, no engine
//!   touched; N = 1 checks it too), else to the rank with the lowest `waiting * 4 + running`
//!   (ties: the lowest rank), as vLLM's internal load balancer picks (see [`ranks`]). Faults,
//!   the body limit and the prompt reader are the server's; `/reset_prefix_cache` resets every
//!   engine or none. With N > 1 a completion's id is `cmpl-NAME-rR-ID` (`chatcmpl-` for a
//!   chat), R the rank, ID the engine's own request number; with N = 1 `cmpl-NAME-ID`.
//! - KV-cache events (a [`KvEventsConfig`]: `--kv-events-endpoint` and friends), as a vLLM
//!   started with `--kv-events-config` publishes them: the ZMQ PUB socket (and the replay
//!   ROUTER socket, if asked for) is bound before the first line is printed, and a second
//!   stdout line follows it (flushed): `kv-events on ENDPOINT`, or `kv-events on ENDPOINT
//!   replay REPLAY_ENDPOINT`, with the endpoints as bound (port 0 resolved). Each engine step
//!   that cached or evicted blocks (and each prime or successful `/reset_prefix_cache`) is
//!   published as one msgpack `KVEventBatch` in the chosen layout: chained stored blocks as one
//!   `BlockStored` (block size = the engine's, medium `GPU`), evicted blocks as one
//!   `BlockRemoved`, a reset as `AllBlocksCleared`, in the engine's order; seqs count from 0;
//!   `data_parallel_rank` is the rank (0 with N = 1) (see [`kv_publish`]). Publishing never
//!   stalls the engine; its first error is reported on stderr. Without it no socket is opened
//!   and only the first line is printed.
//!   - With N > 1 every rank R publishes its own engine's events on its own sockets, with its
//!     own seqs from 0: the endpoints with their port offset by R, as vLLM's
//!     `offset_endpoint_port` does (`tcp://*:5557` → rank 1 binds `tcp://*:5558`; the replay
//!     endpoint likewise), except that a port 0 is not offset: each rank binds a free port of
//!     its own (vLLM would bind port R). All ranks' sockets are bound before the first line;
//!     then one line per rank follows it, in rank order (flushed after the last): `kv-events
//!     on ENDPOINT rank R`, or `kv-events on ENDPOINT replay REPLAY_ENDPOINT rank R`, the
//!     endpoints as bound. With N = 1 the one line has no `rank` suffix, as above.
//! - Every response, errors included, carries `x-kvroute-sim-replica: NAME`; every response of
//!   a generation request given to an engine (its stream or body, or the engine's own 400 for
//!   a prompt it refuses) also carries `x-kvroute-sim-rank: R`, the rank that served it (0
//!   with N = 1).
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
//!   and end-to-end latency histograms in vLLM's buckets, measured in real time;
//!   `vllm:cache_config_info` with the engine's block size; plus
//!   `kvroute_sim_faults_total{kind="status|stall|close"}`, server-wide), `POST
//!   /reset_prefix_cache` (200 `{"reset": true}`, or 409 while requests of any engine hold
//!   cached blocks; then no engine is reset).
//! - `/metrics` with N = 1: every engine series labelled `model_name` only (as before data
//!   parallelism). With N > 1: one sample per engine of every `vllm:` series (and of
//!   `kvroute_sim:requests_received_total`), labelled `engine="R"` too, as vLLM labels its
//!   engines, labels sorted by name as `prometheus_client` writes them:
//!   `vllm:num_requests_running{engine="1",model_name="study"} 2`,
//!   `vllm:time_to_first_token_seconds_bucket{engine="1",le="0.5",model_name="study"} 3`.
//!   Each engine's numbers are its own requests' only (see [`metrics::render_engines`]).

mod driver;
pub mod fault;
mod generate;
pub mod kv_publish;
pub mod metrics;
pub mod openai;
pub mod ranks;

pub use driver::{Driver, Subscription};
pub use fault::{FaultRequest, FaultSpec};
pub use kv_publish::{KvEventsConfig, KvPublisher};
pub use ranks::MAX_DATA_PARALLEL_SIZE;

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
use serde_json::json;
use tokio::sync::{watch, Notify};

use crate::engine::{Engine, EngineConfig, EngineConfigError};
use crate::prompt_tokens::PromptReader;
use fault::{FaultKind, Faults, Target, Then};
use openai::ApiError;

/// The response header naming the replica.
pub const REPLICA_HEADER: &str = "x-kvroute-sim-replica";
/// The response header naming the data-parallel rank (engine) that served a generation
/// request.
pub const RANK_HEADER: &str = "x-kvroute-sim-rank";
/// The request header pinning a generation request to a data-parallel rank (vLLM's).
pub const DATA_PARALLEL_RANK_HEADER: &str = "x-data-parallel-rank";
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
    /// How many engines ("ranks", 1–[`MAX_DATA_PARALLEL_SIZE`]) serve behind the port, as
    /// vLLM's `--data-parallel-size`; see the module docs.
    pub data_parallel_size: u32,
}

impl Default for ServeConfig {
    /// 127.0.0.1, a free port, replica `sim`, model `study`, real time, the default engine, no
    /// fault, the default body limit, the built-in prompt reader, one engine.
    fn default() -> ServeConfig {
        ServeConfig {
            host: "127.0.0.1".into(),
            port: 0,
            name: "sim".into(),
            model: "study".into(),
            speedup: 1.0,
            engine: EngineConfig::default(),
            fault: FaultSpec::default(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            prompts: PromptReader::default(),
            data_parallel_size: 1,
        }
    }
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
    /// The data-parallel size is 0 or above [`MAX_DATA_PARALLEL_SIZE`].
    #[error("the data-parallel size must be between 1 and {MAX_DATA_PARALLEL_SIZE}, got {0}")]
    DataParallelSize(u32),
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
    ranks: ranks::Ranks,
    speedup: f64,
    model: String,
    name: HeaderValue,
    faults: Faults,
    max_body_bytes: usize,
    prompts: PromptReader,
    /// `vllm:cache_config_info`, rendered once (the engines' configuration does not change).
    cache_config: String,
}

/// A bound, not yet serving, server.
pub struct BoundServer {
    listener: tokio::net::TcpListener,
    app: AxumRouter,
    // The engines' drivers, in rank order.
    drivers: Vec<Arc<Driver>>,
    addr: SocketAddr,
    // The KV-event publishers, one per rank in rank order (none without KV events); dropping
    // them (when serving ends) closes their sockets.
    kv_events: Vec<KvPublisher>,
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
        let size = config.data_parallel_size;
        if !(1..=MAX_DATA_PARALLEL_SIZE).contains(&size) {
            return Err(ServeError::DataParallelSize(size));
        }
        let engines = (0..size)
            .map(|_| Engine::new(config.engine))
            .collect::<Result<Vec<_>, _>>()?;
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
        let mut drivers = Vec::with_capacity(engines.len());
        let mut publishers = Vec::new();
        for (rank, engine) in (0..size).zip(engines) {
            let Some(kv) = &kv_events else {
                drivers.push(Driver::new(engine, config.speedup));
                continue;
            };
            let (publisher, sink) =
                start_kv_events(kv, config.engine.block_size, rank, size).await?;
            drivers.push(Driver::with_kv_sink(engine, config.speedup, sink));
            publishers.push(publisher);
        }
        let app = Arc::new(App {
            ranks: ranks::Ranks::new(drivers.clone()),
            speedup: config.speedup,
            model: config.model,
            name,
            faults: Faults::new(config.fault),
            max_body_bytes: config.max_body_bytes,
            prompts: config.prompts,
            cache_config: metrics::render_cache_config(&config.engine, size as usize),
        });
        Ok(BoundServer {
            listener,
            app: router(app),
            drivers,
            addr: local,
            kv_events: publishers,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Rank 0's KV-event PUB endpoint as bound (port 0 resolved), when publishing.
    pub fn kv_events_endpoint(&self) -> Option<&str> {
        self.kv_events.first().map(|p| p.endpoint())
    }

    /// Rank 0's KV-event replay ROUTER endpoint as bound, when publishing with one.
    pub fn kv_events_replay_endpoint(&self) -> Option<&str> {
        self.kv_events.first().and_then(|p| p.replay_endpoint())
    }

    /// Every rank's KV-event publisher, in rank order (empty when not publishing).
    pub fn kv_events_publishers(&self) -> &[KvPublisher] {
        &self.kv_events
    }

    /// The stdout lines after `listening on ...` (see the module docs): none without KV
    /// events, `kv-events on ENDPOINT[ replay REPLAY]` for one rank, and that with ` rank R`
    /// appended for each of several, in rank order.
    pub fn kv_events_lines(&self) -> Vec<String> {
        let several = self.kv_events.len() > 1;
        self.kv_events
            .iter()
            .map(|p| {
                let mut line = format!("kv-events on {}", p.endpoint());
                if let Some(replay) = p.replay_endpoint() {
                    line.push_str(&format!(" replay {replay}"));
                }
                if several {
                    line.push_str(&format!(" rank {}", p.rank()));
                }
                line
            })
            .collect()
    }

    /// Rank 0's engine driver (for tests and in-process use).
    pub fn driver(&self) -> Arc<Driver> {
        Arc::clone(&self.drivers[0])
    }

    /// Every rank's engine driver, in rank order.
    pub fn drivers(&self) -> Vec<Arc<Driver>> {
        self.drivers.clone()
    }

    /// Serves until `shutdown` completes, then gives open streams up to 2 s.
    pub async fn serve(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let engine_tasks: Vec<_> = self
            .drivers
            .iter()
            .map(|d| tokio::spawn(Arc::clone(d).run()))
            .collect();
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
        for task in engine_tasks {
            task.abort();
        }
        // Stops publishing and closes the KV-event sockets.
        drop(self.kv_events);
        Ok(())
    }
}

/// Binds rank `rank`'s KV-event sockets (of `size` ranks: see [`KvEventsConfig::for_rank`])
/// and starts its publisher.
async fn start_kv_events(
    kv: &KvEventsConfig,
    block_size: u32,
    rank: u32,
    size: u32,
) -> Result<(KvPublisher, kv_publish::KvSink), ServeError> {
    let error = |c: &KvEventsConfig, source| {
        let mut endpoint = match &c.replay_endpoint {
            Some(r) => format!("{} (replay {r})", c.endpoint),
            None => c.endpoint.clone(),
        };
        if size > 1 {
            endpoint.push_str(&format!(" (rank {rank})"));
        }
        ServeError::KvEvents { endpoint, source }
    };
    let cfg = kv.for_rank(rank).map_err(|source| error(kv, source))?;
    KvPublisher::start(&cfg, block_size, rank)
        .await
        .map_err(|source| error(&cfg, source))
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

/// Binds, prints `listening on HOST:PORT` (and, when publishing KV events,
/// [`BoundServer::kv_events_lines`]), and serves until SIGTERM or SIGINT.
pub async fn run(config: ServeConfig, kv_events: Option<KvEventsConfig>) -> Result<(), ServeError> {
    let server = BoundServer::bind_with_kv_events(config, kv_events).await?;
    let shutdown = shutdown_signal();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "listening on {}", server.local_addr());
    for line in server.kv_events_lines() {
        let _ = writeln!(out, "{line}");
    }
    let _ = out.flush();
    drop(out);
    server.serve(shutdown).await
}

/// Installs the SIGTERM and SIGINT handlers now and returns a future that completes on the
/// first of them. [`run`] calls it before printing `listening on`: until the handlers are
/// installed a SIGTERM kills the process at once, and a caller may send one as soon as it has
/// read that line. Must be called within a Tokio runtime.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let handlers = {
        use tokio::signal::unix::{signal, SignalKind};
        (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        )
    };
    async move {
        #[cfg(unix)]
        if let (Ok(mut term), Ok(mut int)) = handlers {
            tokio::select! {
                _ = term.recv() => {},
                _ = int.recv() => {},
            }
            return;
        }
        let _ = tokio::signal::ctrl_c().await;
    }
}

fn router(app: Arc<App>) -> AxumRouter {
    AxumRouter::new()
        .route("/v1/completions", post(generate::completions))
        .route("/v1/chat/completions", post(generate::chat_completions))
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
    let mut text = metrics::render_engines(&app.model, app.speedup, &app.ranks.stats());
    text.push_str(&app.cache_config);
    text.push_str(&metrics::render_faults(&app.faults.injected()));
    (
        [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
        text,
    )
        .into_response()
}

async fn reset_prefix_cache(State(app): State<Arc<App>>) -> Response {
    if app.ranks.reset_prefix_cache() {
        axum::Json(json!({ "reset": true })).into_response()
    } else {
        error_response(&ApiError {
            status: 409,
            message: "requests are holding cached blocks; try again when idle".into(),
        })
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
