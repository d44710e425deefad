//! The generation endpoints, `POST /v1/completions` and `POST /v1/chat/completions`: a request
//! is parsed, checked, tokenized, given to its data-parallel rank ([`super::ranks`]) and
//! answered with that engine's tokens, streamed (SSE) or whole (see the module docs of
//! [`super`]).

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::openai::{self, ApiError, Endpoint, GenRequest, Prompt};
use super::{error_response, ranks, read_body, unix_now, App, Subscription, RANK_HEADER};

pub(super) async fn completions(State(app): State<Arc<App>>, req: Request) -> Response {
    inference(app, Endpoint::Completions, req).await
}

pub(super) async fn chat_completions(State(app): State<Arc<App>>, req: Request) -> Response {
    inference(app, Endpoint::Chat, req).await
}

/// Reads a generation request (and its `X-data-parallel-rank`) and serves it.
async fn inference(app: Arc<App>, endpoint: Endpoint, req: Request) -> Response {
    let pinned = ranks::requested_rank(req.headers(), app.ranks.size());
    match read_body(req.into_body(), app.max_body_bytes).await {
        Ok(body) => generate(app, endpoint, &body, pinned).await,
        Err(e) => error_response(&e),
    }
}

/// Parses and checks a generation request, submits it to its rank (`pinned`: the rank its
/// header asked for, or why that is no rank) and answers with that engine's tokens.
async fn generate(
    app: Arc<App>,
    endpoint: Endpoint,
    body: &[u8],
    pinned: Result<Option<usize>, ApiError>,
) -> Response {
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
    let pinned = match pinned {
        Ok(p) => p,
        Err(e) => return error_response(&e),
    };
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
    let (rank, sub) = app.ranks.submit(pinned, &tokens, req.max_tokens);
    let mut resp = match sub {
        Ok(sub) => respond(&app, endpoint, req, sub, rank).await,
        Err(e) => error_response(&ApiError::bad_request(e.to_string())),
    };
    resp.headers_mut()
        .insert(RANK_HEADER, HeaderValue::from(rank));
    resp
}

/// The response to a request engine `rank` accepted: its stream, or its whole body.
async fn respond(
    app: &App,
    endpoint: Endpoint,
    req: GenRequest,
    sub: Subscription,
    rank: usize,
) -> Response {
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
    let name = app.name.to_str().unwrap_or("sim");
    let id = if app.ranks.size() > 1 {
        format!("{prefix}-{name}-r{rank}-{}", sub.id)
    } else {
        format!("{prefix}-{name}-{}", sub.id)
    };
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
