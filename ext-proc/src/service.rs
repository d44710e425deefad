//! The `envoy.service.ext_proc.v3.ExternalProcessor` gRPC service: each `Process` stream
//! (= one HTTP request) is a reply stream that reads Envoy's messages and feeds a
//! [`StreamState`]. A message gets one reply, none, or (with `FULL_DUPLEX_STREAMED` bodies)
//! several: the state queues those beyond the first, and they go out in order before the next
//! message is read.
//!
//! The reply stream ends when Envoy ends the side stream (clean END_STREAM, or the RST it
//! sends at the end of every request: both are normal ends); it is dropped then, or earlier if
//! the connection goes away. Dropping it drops the state and so releases the request's ticket;
//! when the connection went away, the ticket is detached instead ([`crate::connection`]).
//! Which of these ended a stream cannot be told reliably: after Envoy's RST, tonic usually
//! drops the reply stream without polling it again, so kvroute sees neither END_STREAM nor an
//! error. `kvroute_ext_proc_stream_ends_total` therefore counts `how="closed"` (any end
//! Envoy caused), `how="connection_lost"` (the connection to Envoy went away first: the ticket
//! is detached, not released) and `how="error"` (kvroute failed the stream itself).

use std::pin::Pin;
use std::sync::Arc;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessor;
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use futures_util::Stream;
use tonic::{Request, Response, Status, Streaming};

use crate::connection::ConnInfo;
use crate::routing;
use crate::shared::Shared;
use crate::stream::{StreamState, TokenizeJob};
use crate::tokenize::Tokenized;

/// The ext_proc service.
#[derive(Clone, Debug)]
pub struct ExtProc {
    shared: Arc<Shared>,
}

impl ExtProc {
    /// A service over `shared`.
    pub fn new(shared: Arc<Shared>) -> Self {
        ExtProc { shared }
    }
}

type ReplyStream = Pin<Box<dyn Stream<Item = Result<ProcessingResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalProcessor for ExtProc {
    type ProcessStream = ReplyStream;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Self::ProcessStream>, Status> {
        let shared = self.shared.clone();
        shared.metrics.stream_opened();
        let connection = request.extensions().get::<ConnInfo>().cloned();
        let driver = Driver {
            connection,
            end: None,
            inbound: request.into_inner(),
            state: StreamState::new(shared),
            done: false,
            failed: false,
        };
        let replies = futures_util::stream::unfold(driver, |mut d| async move {
            d.next_reply().await.map(|r| (r, d))
        });
        Ok(Response::new(Box::pin(replies)))
    }
}

/// Drives one stream inside the response body that tonic polls (no extra task or channel
/// per request). Dropping it (stream end, Envoy's reset, connection loss) drops the
/// [`StreamState`] and so releases the ticket.
struct Driver {
    /// The Envoy connection the stream came on (absent in tests that call the service
    /// directly).
    connection: Option<ConnInfo>,
    /// How the inbound stream ended, once seen.
    end: Option<End>,
    inbound: Streaming<ProcessingRequest>,
    state: StreamState,
    /// The inbound stream is over (no more replies).
    done: bool,
    /// kvroute failed the stream with a non-OK status.
    failed: bool,
}

/// Runs a body's tokenization on tokio's blocking pool, at most [`Shared::tokenize_permits`]
/// at once, so that long prompts never hold a runtime thread. A task that fails (a panic in
/// the tokenizer) leaves the body to be routed on text blocks.
async fn tokenize_off_runtime(shared: &Arc<Shared>, job: TokenizeJob) -> Option<Tokenized> {
    let _permit = shared.tokenize_permits.acquire().await.ok()?;
    let shared = shared.clone();
    tokio::task::spawn_blocking(move || routing::tokenize_body(&shared, &job.path, &job.body))
        .await
        .ok()
        .flatten()
}

/// What the inbound stream gave.
enum Inbound {
    /// A message from Envoy.
    Message(ProcessingRequest),
    /// The stream is over: this is the last item of the reply stream.
    Ended(Option<Result<ProcessingResponse, Status>>),
}

impl Driver {
    /// The next reply: one queued by an earlier message first (full-duplex bodies: several
    /// replies to one message, sent in order before the next message is read), else the
    /// verdict's reply when admission holds the request (Envoy's messages meanwhile are kept
    /// for after it; the stream's end, the client gone, ends the hold), else the reply to the
    /// next message that needs one.
    async fn next_reply(&mut self) -> Option<Result<ProcessingResponse, Status>> {
        if self.done {
            return None;
        }
        if let Some(reply) = self.state.next_queued() {
            return Some(Ok(reply));
        }
        loop {
            if self.state.is_holding() {
                tokio::select! {
                    verdict = self.state.verdict() => {
                        if let Some(reply) = self.state.on_verdict(verdict) {
                            return Some(Ok(reply));
                        }
                    }
                    read = self.inbound.message() => match self.inbound(read) {
                        // Kept by the state until the verdict: no reply while held.
                        Inbound::Message(msg) => {
                            let _ = self.state.on_message(msg);
                        }
                        Inbound::Ended(last) => return last,
                    },
                }
                continue;
            }
            let msg = match self.state.next_stashed() {
                Some(msg) => msg,
                None => {
                    let read = self.inbound.message().await;
                    match self.inbound(read) {
                        Inbound::Message(msg) => msg,
                        Inbound::Ended(last) => return last,
                    }
                }
            };
            if let Some(job) = self.state.tokenize_job(&msg) {
                let tokenized = tokenize_off_runtime(self.state.shared(), job).await;
                self.state.set_tokenized(tokenized);
            }
            if let Some(reply) = self.state.on_message(msg) {
                return Some(Ok(reply));
            }
        }
    }

    /// Reads one item of the inbound stream; records how it ended.
    fn inbound(&mut self, read: Result<Option<ProcessingRequest>, Status>) -> Inbound {
        match read {
            Ok(Some(msg)) => Inbound::Message(msg),
            Ok(None) => {
                self.done = true;
                self.end = Some(End::Envoy);
                Inbound::Ended(None)
            }
            Err(status) => {
                self.end = Some(End::of(&status));
                self.done = true;
                // Envoy ends every side stream with RST_STREAM; tonic reports it as
                // Internal/Cancelled/Unknown. Anything else is a real stream error.
                if matches!(
                    status.code(),
                    tonic::Code::Internal | tonic::Code::Cancelled | tonic::Code::Unknown
                ) {
                    return Inbound::Ended(None);
                }
                // E.g. a body over the gRPC decode limit. Fail the stream with a non-OK
                // status: ending it with OK would let the request continue un-routed.
                tracing::warn!(code = ?status.code(), message = status.message(), "ext_proc stream error");
                self.failed = true;
                Inbound::Ended(Some(Err(Status::internal(
                    "kvroute: ext_proc stream failed",
                ))))
            }
        }
    }
}

/// How a side stream ended, as far as kvroute can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    /// Envoy ended it (END_STREAM, or its RST_STREAM at the end of every request).
    Envoy,
    /// Its connection failed (IO error, GOAWAY with an error code).
    Connection,
    /// Something else.
    Unknown,
}

impl End {
    /// Reads the h2 error behind a stream error, if any.
    fn of(status: &Status) -> End {
        let mut source: Option<&(dyn std::error::Error + 'static)> =
            std::error::Error::source(status);
        while let Some(e) = source {
            if let Some(h2) = e.downcast_ref::<h2::Error>() {
                return if h2.is_reset() && h2.is_remote() {
                    End::Envoy
                } else if h2.is_io()
                    || (h2.is_go_away() && h2.reason() != Some(h2::Reason::NO_ERROR))
                {
                    End::Connection
                } else {
                    End::Unknown
                };
            }
            if e.downcast_ref::<std::io::Error>().is_some() {
                return End::Connection;
            }
            source = e.source();
        }
        End::Unknown
    }
}

impl Driver {
    /// Whether the stream ended because its connection was lost rather than because Envoy
    /// ended it. tonic usually drops a stream after Envoy's RST without polling it, so its end
    /// is read now if it was not seen; a stream whose end is unknown counts as lost when its
    /// connection is down. The connection of a stream Envoy reset may go down right after (as
    /// at a graceful shutdown): the RST, read first, decides. While the service drains for
    /// shutdown nothing is detached.
    fn connection_lost(&mut self) -> bool {
        use futures_util::FutureExt;
        if self.end.is_none() {
            self.end = match self.inbound.message().now_or_never() {
                Some(Ok(None)) => Some(End::Envoy),
                Some(Err(status)) => Some(End::of(&status)),
                Some(Ok(Some(_))) | None => None,
            };
        }
        if !self.state.shared().is_serving() {
            // Draining for shutdown: the process and its tickets end with the last stream.
            return false;
        }
        match self.end {
            Some(End::Envoy) => false,
            Some(End::Connection) => true,
            Some(End::Unknown) | None => self.connection.as_ref().is_some_and(|c| !c.is_alive()),
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // The state (and its ticket guard) is dropped right after this.
        let lost = self.connection_lost();
        let how = if self.failed {
            "error"
        } else if lost {
            "connection_lost"
        } else {
            "closed"
        };
        if lost {
            // The response may go on without kvroute: hold the slot until its predicted end.
            self.state.detach_ticket();
        }
        self.state.shared().metrics.stream_ended(how);
    }
}
