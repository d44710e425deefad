//! The `envoy.service.ext_proc.v3.ExternalProcessor` gRPC service: one spawned task per
//! `Process` stream (= one HTTP request), driving a [`StreamState`].
//!
//! The task ends when Envoy ends the stream (clean END_STREAM or the RST it sends at the end
//! of every request, which tonic reports as an `Internal` error: both are normal ends), or
//! when Envoy stops reading replies. Ending the task drops the state and so releases the
//! request's ticket.

use std::pin::Pin;
use std::sync::Arc;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessor;
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use futures_util::Stream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::shared::Shared;
use crate::stream::StreamState;

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
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(4);
        let shared = self.shared.clone();
        shared.metrics.stream_opened();
        tokio::spawn(async move {
            let mut state = StreamState::new(shared.clone());
            let how = loop {
                match inbound.message().await {
                    Ok(Some(msg)) => {
                        if let Some(reply) = state.on_message(msg) {
                            if tx.send(Ok(reply)).await.is_err() {
                                break "send_failed";
                            }
                        }
                    }
                    Ok(None) => break "eos",
                    Err(status) => {
                        // Envoy ends every side stream with RST_STREAM; tonic reports it as
                        // Internal/Cancelled/Unknown. Anything else is a real stream error.
                        if matches!(
                            status.code(),
                            tonic::Code::Internal | tonic::Code::Cancelled | tonic::Code::Unknown
                        ) {
                            break "reset";
                        }
                        // E.g. a body over the gRPC decode limit. Fail the stream with a
                        // non-OK status: ending it with OK would let the request continue
                        // un-routed.
                        tracing::warn!(code = ?status.code(), message = status.message(), "ext_proc stream error");
                        let _ = tx
                            .send(Err(Status::internal("kvroute: ext_proc stream failed")))
                            .await;
                        break "error";
                    }
                }
            };
            let routed = state.is_routed();
            drop(state); // releases the ticket, if any
            shared.metrics.stream_ended(how);
            tracing::trace!(how, routed, "ext_proc stream ended");
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
