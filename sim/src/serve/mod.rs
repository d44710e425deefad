//! The fake vLLM server: the engine model in (scaled) real time behind an OpenAI-compatible
//! HTTP API.
//!
//! ## Contract
//! - Binds `host:port` (port 0 = a free port) and, once accepting, prints exactly one line
//!   `listening on HOST:PORT` to stdout (flushed). Exits cleanly on SIGTERM/SIGINT (open
//!   streams get up to 2 s to finish).
//! - Every response, errors included, carries `x-kvroute-sim-replica: NAME`.
//! - `POST /v1/completions`, `POST /v1/chat/completions`: streaming (SSE, `[DONE]`, usage chunk
//!   with `prompt_tokens_details.cached_tokens` when `stream_options.include_usage`) and
//!   non-streaming. The fake model always generates exactly `max_tokens` tokens. A model name
//!   other than the served one gets a 404; bad JSON or fields an OpenAI-style 400.
//! - Fault injection: a request header `x-sim-status: CODE` (400–599) makes any endpoint answer
//!   `CODE` with an OpenAI-style error body, without touching the engine.
//! - `GET /v1/models`, `GET /health`, `GET /metrics` (vLLM names), `POST /reset_prefix_cache`
//!   (200 `{"reset": true}`, or 409 while requests hold cached blocks).

mod driver;
pub mod metrics;
pub mod openai;

pub use driver::{Driver, Subscription};

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::Router as AxumRouter;
use serde_json::{json, Value};

use crate::engine::{Engine, EngineConfig, EngineConfigError};
use crate::tokenizer;
use openai::{ApiError, Endpoint, GenRequest, Prompt};

/// The response header naming the replica.
pub const REPLICA_HEADER: &str = "x-kvroute-sim-replica";
/// The fault-injection request header.
pub const STATUS_HEADER: &str = "x-sim-status";

/// What the server needs.
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
    /// Binding or serving failed.
    #[error("cannot serve on {addr}: {source}")]
    Io {
        /// The address.
        addr: String,
        /// The error.
        source: std::io::Error,
    },
}

struct App {
    driver: Arc<Driver>,
    model: String,
    name: HeaderValue,
}

/// A bound, not yet serving, server.
pub struct BoundServer {
    listener: tokio::net::TcpListener,
    app: AxumRouter,
    driver: Arc<Driver>,
    addr: SocketAddr,
}

impl BoundServer {
    /// Validates the configuration and binds the listener.
    pub async fn bind(config: ServeConfig) -> Result<BoundServer, ServeError> {
        if !config.speedup.is_finite() || config.speedup <= 0.0 {
            return Err(ServeError::Speedup(config.speedup));
        }
        let name = HeaderValue::from_str(&config.name)
            .ok()
            .filter(|_| {
                !config.name.is_empty() && config.name.bytes().all(|b| b.is_ascii_graphic())
            })
            .ok_or_else(|| ServeError::Name(config.name.clone()))?;
        let engine = Engine::new(config.engine)?;
        let driver = Driver::new(engine, config.speedup);
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
        let app = Arc::new(App {
            driver: Arc::clone(&driver),
            model: config.model,
            name,
        });
        Ok(BoundServer {
            listener,
            app: router(app),
            driver,
            addr: local,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
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
        let addr = self.addr.to_string();
        let engine_task = tokio::spawn(Arc::clone(&self.driver).run());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        // TCP_NODELAY, as vLLM's uvicorn sets it: without it, every SSE event written after a
        // small one waits for the peer's delayed ACK (up to 40 ms). A socket that refuses the
        // option is served anyway.
        let listener = self.listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let server = axum::serve(listener, self.app).with_graceful_shutdown(async move {
            shutdown.await;
            let _ = tx.send(());
        });
        let result = tokio::select! {
            r = server => r,
            _ = async { let _ = rx.await; tokio::time::sleep(Duration::from_secs(2)).await } => Ok(()),
        };
        engine_task.abort();
        result.map_err(|source| ServeError::Io { addr, source })
    }
}

/// Binds, prints `listening on HOST:PORT`, and serves until SIGTERM or SIGINT.
pub async fn run(config: ServeConfig) -> Result<(), ServeError> {
    let server = BoundServer::bind(config).await?;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "listening on {}", server.local_addr());
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

/// Adds the replica header to every response and applies `x-sim-status`.
async fn common_layer(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let injected = req.headers().get(STATUS_HEADER).map(|v| {
        v.to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u16>().ok())
            .filter(|c| (400..=599).contains(c))
    });
    let mut resp = match injected {
        Some(Some(code)) => error_response(&ApiError {
            status: code,
            message: format!("injected failure ({STATUS_HEADER}: {code})"),
        }),
        Some(None) => error_response(&ApiError::bad_request(format!(
            "{STATUS_HEADER} must be a status code between 400 and 599"
        ))),
        None => next.run(req).await,
    };
    resp.headers_mut().insert(REPLICA_HEADER, app.name.clone());
    resp
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
    (
        [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
        metrics::render(&app.model, &c, total, app.driver.speedup()),
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

async fn completions(State(app): State<Arc<App>>, body: Bytes) -> Response {
    generate(app, Endpoint::Completions, &body).await
}

async fn chat_completions(
    State(app): State<Arc<App>>,
    _headers: HeaderMap,
    body: Bytes,
) -> Response {
    generate(app, Endpoint::Chat, &body).await
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
        Prompt::Text(t) => tokenizer::tokenize(t),
        Prompt::Tokens(ids) => ids.clone(),
    };
    let sub = match app.driver.submit(&tokens, req.max_tokens) {
        Ok(s) => s,
        Err(e) => return error_response(&ApiError::bad_request(e.to_string())),
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
