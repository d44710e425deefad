//! The admin HTTP server: `GET /metrics` (OpenMetrics text), `/healthz` (the process is up),
//! `/readyz` (serving; 503 before start-up completes, before discovery's first list, and once
//! shutdown began), and JSON introspection ([`crate::introspect`]): `/debug/pods`,
//! `/debug/decisions`, `/debug/config`.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

use crate::connection::Tracked;

use crate::shared::Shared;

fn reply(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    r
}

fn json(v: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut text = serde_json::to_string_pretty(v).unwrap_or_default();
    text.push('\n');
    reply(StatusCode::OK, "application/json", text)
}

/// Answers one admin request.
pub fn handle(
    method: &Method,
    path: &str,
    registry: &Registry,
    shared: &Shared,
) -> Response<Full<Bytes>> {
    const TEXT: &str = "text/plain; charset=utf-8";
    if method != Method::GET && method != Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, TEXT, "GET only\n");
    }
    match path {
        "/metrics" => reply(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            crate::metrics::render(registry),
        ),
        "/healthz" => reply(StatusCode::OK, TEXT, "ok\n"),
        "/readyz" if shared.is_ready() => reply(StatusCode::OK, TEXT, "ready\n"),
        "/readyz" => reply(StatusCode::SERVICE_UNAVAILABLE, TEXT, "not ready\n"),
        "/debug/pods" => {
            let pods = shared.router.lock().pods();
            let engines = shared.engines.lock().clone();
            json(&crate::introspect::pods(&pods, &engines, shared.now()))
        }
        "/debug/decisions" => json(&shared.decisions.to_json()),
        "/debug/config" => json(&crate::introspect::config(&shared.config())),
        _ => reply(StatusCode::NOT_FOUND, TEXT, "not found\n"),
    }
}

/// Serves admin requests on the connections of `incoming` (plain or TLS,
/// [`crate::connection::incoming`]) until `stop` changes.
pub async fn serve(
    mut incoming: ReceiverStream<std::io::Result<Tracked>>,
    registry: Arc<Registry>,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let stream = tokio::select! {
            next = incoming.next() => match next {
                Some(Ok(s)) => s,
                Some(Err(_)) => continue,
                None => return,
            },
            _ = stop.changed() => return,
        };
        let (registry, shared) = (registry.clone(), shared.clone());
        let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
            let r = handle(req.method(), req.uri().path(), &registry, &shared);
            async move { Ok::<_, Infallible>(r) }
        });
        tokio::spawn(async move {
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}
