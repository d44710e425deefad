//! The protocol floor for `make bench-envoy`: an ext_proc server on the same stack as
//! `kvroute-ext-proc` (tonic, envoy-types, one current-thread tokio runtime, the same reply
//! messages from [`kvroute_ext_proc::respond`]) that does none of kvroute's work. It answers
//! `request_headers` with CONTINUE, the buffered `request_body` with the next pod in
//! round-robin order (same headers and `envoy.lb` metadata as kvroute), `response_headers`
//! with no mutation, and trailers with CONTINUE. It reads neither headers nor body.
//!
//! What `kvroute-ext-proc` costs above this server, in the same run, is the cost of kvroute's
//! own work (body parse, hashing, routing, bookkeeping); the rest is the ext_proc protocol on
//! this gRPC stack.
//!
//! Usage: `floor ADDR:PORT [ADDR:PORT ...]` (the pods). Listens on 127.0.0.1 with a port
//! chosen at run time and prints `floor listening grpc=ADDR`.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use futures_util::{Stream, StreamExt};
use kvroute_ext_proc::respond::{self, RouteTo};
use tonic::{Response, Status, Streaming};

struct Floor {
    pods: Arc<Vec<String>>,
    next: Arc<AtomicUsize>,
}

type Replies = Pin<Box<dyn Stream<Item = Result<ProcessingResponse, Status>> + Send>>;

fn reply(
    pods: &[String],
    next: &AtomicUsize,
    msg: ProcessingRequest,
) -> Option<ProcessingResponse> {
    Some(match msg.request? {
        Request::RequestHeaders(_) => respond::continue_request_headers(),
        Request::RequestBody(_) => {
            let i = next.fetch_add(1, Ordering::Relaxed) % pods.len();
            respond::route_in_body(&RouteTo {
                address: &pods[i],
                strategy: "floor",
                data_parallel_rank: None,
            })
        }
        Request::RequestTrailers(_) => respond::continue_trailers(true),
        Request::ResponseHeaders(_) => respond::response_headers(Vec::new(), false),
        Request::ResponseBody(_) => respond::continue_body(false),
        Request::ResponseTrailers(_) => respond::continue_trailers(false),
    })
}

#[tonic::async_trait]
impl ExternalProcessor for Floor {
    type ProcessStream = Replies;

    async fn process(
        &self,
        request: tonic::Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Replies>, Status> {
        let (pods, next) = (self.pods.clone(), self.next.clone());
        let replies = request.into_inner().filter_map(move |m| {
            let out = match m {
                Ok(msg) => reply(&pods, &next, msg).map(Ok),
                // Envoy resets the side stream at the end of every request: a normal end.
                Err(_) => None,
            };
            futures_util::future::ready(out)
        });
        Ok(Response::new(Box::pin(replies)))
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let pods: Vec<String> = std::env::args().skip(1).collect();
    if pods.is_empty() {
        return Err("usage: floor ADDR:PORT [ADDR:PORT ...]".into());
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        println!("floor listening grpc={}", listener.local_addr()?);
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener).map(|r| {
            r.inspect(|s| {
                let _ = s.set_nodelay(true);
            })
        });
        let service = ExternalProcessorServer::new(Floor {
            pods: Arc::new(pods),
            next: Arc::new(AtomicUsize::new(0)),
        })
        .max_decoding_message_size(64 << 20);
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming)
            .await?;
        Ok(())
    })
}
