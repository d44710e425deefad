//! A side stream whose connection is lost keeps its slot until the request's predicted end;
//! one that Envoy's client ends releases it at once. Real gRPC over loopback through a TCP
//! relay the test cuts (no Envoy needed).

mod support;

use std::time::Duration;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::ProcessingRequest;
use support::*;
use tokio::net::{TcpListener, TcpStream};

/// Relays one connection from a free local port to `to`; cutting the returned sender closes
/// both sides at once.
async fn relay(to: String) -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (cut, cut_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let (mut client, _) = listener.accept().await.unwrap();
        let mut server = TcpStream::connect(&to).await.unwrap();
        tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
            _ = cut_rx => {}
        }
        // Dropped here: both sockets close.
    });
    (addr, cut)
}

async fn routed_stream(
    client: &mut ExternalProcessorClient<tonic::transport::Channel>,
) -> (
    tokio::sync::mpsc::Sender<ProcessingRequest>,
    tonic::Streaming<envoy_types::pb::envoy::service::ext_proc::v3::ProcessingResponse>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(get_models_headers("study")).await.unwrap();
    let mut replies = client
        .process(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let reply = replies.message().await.unwrap().expect("a routing reply");
    assert!(reply.dynamic_metadata.is_some(), "not routed: {reply:?}");
    (tx, replies)
}

#[test]
fn a_lost_connection_holds_the_slot_until_the_predicted_end() {
    let dir = TempDir::new("conn-loss");
    let config = dir.path("kvroute.toml");
    // No scraping; a short predicted request (2 output tokens at 10 ms).
    std::fs::write(
        &config,
        "[listen]\ngrpc = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n[engine_metrics]\nscrape_interval_ms = 0\n[health]\ncheck_interval_ms = 0\n[ttft]\noutput_tokens = 2.0\ntpot_ms = 10.0\n[models.study]\npods = [{ name = \"a\", address = \"127.0.0.1:9\" }]\n",
    )
    .unwrap();
    let ext = ExtProc::start(&dir, &config, None);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // A stream ended by its client (as Envoy does at every request's end): released.
        let mut direct = ExternalProcessorClient::connect(format!("http://{}", ext.grpc))
            .await
            .unwrap();
        let (tx, replies) = routed_stream(&mut direct).await;
        assert_eq!(ext.in_flight(), 1);
        drop((tx, replies));
        wait_for(Duration::from_secs(5), || {
            (ext.in_flight() == 0).then_some(())
        })
        .expect("an ended stream was not released");

        // A stream whose connection is cut: held, then released at its predicted end.
        let (addr, cut) = relay(ext.grpc.clone()).await;
        let mut relayed = ExternalProcessorClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        let (_tx, _replies) = routed_stream(&mut relayed).await;
        cut.send(()).unwrap();
        let lost = wait_for(Duration::from_secs(5), || {
            let m = ext.metrics();
            (metric_sum(
                &m,
                "kvroute_ext_proc_stream_ends_total{how=\"connection_lost\"}",
            ) == 1)
                .then_some(m)
        })
        .expect("the lost connection was not seen");
        assert_eq!(
            metric_sum(&lost, "kvroute_pod_in_flight{"),
            1,
            "released at once:\n{lost}"
        );
        wait_for(Duration::from_secs(10), || {
            (ext.in_flight() == 0).then_some(())
        })
        .expect("the detached ticket was never released");
        let m = ext.metrics();
        assert_eq!(metric_sum(&m, "kvroute_tickets_detached_released_total"), 1);
        assert_eq!(metric_sum(&m, "kvroute_ticket_release_errors_total"), 0);
    });
}
