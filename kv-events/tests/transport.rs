//! Publisher -> Subscriber and replay over loopback TCP (ports chosen by the OS), all bounded in
//! time.

mod common;

use std::time::Duration;

use bytes::Bytes;
use kvroute_kv_events::transport::{
    replay, Publisher, PublisherConfig, ReplayFormat, Subscriber, TransportError, END_SEQ,
};
use kvroute_kv_events::wire::{decode, Layout};
use zeromq::{RouterSocket, Socket};

const STEP: Duration = Duration::from_millis(50);
const CONNECT: Duration = Duration::from_secs(5);
const REPLAY: Duration = Duration::from_secs(5);

async fn publisher(topic: &str, format: ReplayFormat, buffer_steps: usize) -> Publisher {
    let mut cfg = PublisherConfig::new("tcp://127.0.0.1:0");
    cfg.replay_endpoint = Some("tcp://127.0.0.1:0".into());
    cfg.topic = topic.into();
    cfg.replay_format = format;
    cfg.buffer_steps = buffer_steps;
    Publisher::bind(cfg).await.unwrap()
}

/// Slow joiner: publish until the subscriber gets one (at most 200 tries); returns its seq.
async fn warm_up(publisher: &mut Publisher, sub: &mut Subscriber) -> u64 {
    for _ in 0..200 {
        publisher.publish(&b"warm-up"[..]).await.unwrap();
        if let Some(m) = sub.recv_timeout(STEP).await.unwrap() {
            // Drain warm-ups already in flight.
            let mut last = m.seq;
            while let Some(m) = sub.recv_timeout(STEP).await.unwrap() {
                last = m.seq;
            }
            return last;
        }
    }
    panic!("subscriber never received anything");
}

fn golden_payloads() -> Vec<(String, Vec<u8>)> {
    common::cases()
        .into_iter()
        .flat_map(|c| c.files.into_iter().map(|f| (f.file, f.bytes)))
        .collect()
}

#[tokio::test]
async fn publisher_to_subscriber() {
    let mut publisher = publisher("kv@pod-1@model", ReplayFormat::WithTopic, 100).await;
    let mut sub = Subscriber::connect(publisher.endpoint(), "kv@", CONNECT)
        .await
        .unwrap();
    let last = warm_up(&mut publisher, &mut sub).await;
    let golden = golden_payloads();
    for (i, (_, bytes)) in golden.iter().enumerate() {
        assert_eq!(
            publisher.publish(bytes.clone()).await.unwrap(),
            last + 1 + i as u64
        );
    }
    for (i, (file, bytes)) in golden.iter().enumerate() {
        let m = tokio::time::timeout(REPLAY, sub.recv())
            .await
            .expect("message in time")
            .unwrap();
        assert_eq!(m.topic, Bytes::from_static(b"kv@pod-1@model"));
        assert_eq!(m.seq, last + 1 + i as u64, "{file}");
        assert!(m.payload == bytes.as_slice(), "{file}");
        decode(&m.payload).unwrap();
    }
    assert_eq!(sub.recv_timeout(STEP).await.unwrap(), None);
}

#[tokio::test]
async fn publish_batch_encodes() {
    let case = common::cases()
        .into_iter()
        .find(|c| c.name == "stored_bytes_hashes")
        .unwrap();
    let mut publisher = publisher("", ReplayFormat::WithTopic, 10).await;
    let mut sub = Subscriber::connect(publisher.endpoint(), "", CONNECT)
        .await
        .unwrap();
    warm_up(&mut publisher, &mut sub).await;
    for f in &case.files {
        publisher
            .publish_batch(&case.expected, f.layout)
            .await
            .unwrap();
        let m = sub.recv_timeout(REPLAY).await.unwrap().unwrap();
        assert!(m.payload == f.bytes, "{}", f.file);
    }
}

#[tokio::test]
async fn topic_filter() {
    let mut publisher = publisher("kv@a", ReplayFormat::WithTopic, 10).await;
    let mut other = Subscriber::connect(publisher.endpoint(), "kv@b", CONNECT)
        .await
        .unwrap();
    let mut mine = Subscriber::connect(publisher.endpoint(), "kv@a", CONNECT)
        .await
        .unwrap();
    warm_up(&mut publisher, &mut mine).await;
    publisher.publish(&b"x"[..]).await.unwrap();
    assert!(mine.recv_timeout(REPLAY).await.unwrap().is_some());
    assert_eq!(
        other
            .recv_timeout(Duration::from_millis(300))
            .await
            .unwrap(),
        None
    );
}

#[tokio::test]
async fn replay_after_gap() {
    for format in [ReplayFormat::WithTopic, ReplayFormat::Legacy] {
        let mut publisher = publisher("kv", format, 100).await;
        let replay_ep = publisher.replay_endpoint().unwrap().to_owned();
        let mut sub = Subscriber::connect(publisher.endpoint(), "kv", CONNECT)
            .await
            .unwrap();
        let last = warm_up(&mut publisher, &mut sub).await;

        let lost = publisher.record_only(&b"lost on the way"[..]);
        let next = publisher.publish(&b"after the gap"[..]).await.unwrap();
        let m = sub.recv_timeout(REPLAY).await.unwrap().unwrap();
        assert_eq!((lost, next, m.seq), (last + 1, last + 2, last + 2));

        // The subscriber sees seq jump from `last` to `last + 2`: replay from `last + 1`.
        let items = replay(&replay_ep, last + 1, REPLAY).await.unwrap();
        let seqs: Vec<u64> = items.iter().map(|i| i.seq).collect();
        assert_eq!(seqs, vec![lost, next], "{format:?}");
        assert_eq!(items[0].payload, Bytes::from_static(b"lost on the way"));
        let topic = match format {
            ReplayFormat::WithTopic => Some(Bytes::from_static(b"kv")),
            ReplayFormat::Legacy => None,
        };
        assert!(items.iter().all(|i| i.topic == topic), "{format:?}");
    }
}

#[tokio::test]
async fn replay_end_marker_and_ring_buffer() {
    let mut publisher = publisher("t", ReplayFormat::WithTopic, 5).await;
    let ep = publisher.replay_endpoint().unwrap().to_owned();
    // Nothing buffered: just the end marker.
    assert_eq!(replay(&ep, 0, REPLAY).await.unwrap(), vec![]);
    for i in 0..8u8 {
        publisher.publish(vec![i]).await.unwrap();
    }
    // Only the last 5 are kept (seqs 3..8), as vLLM's deque(maxlen=buffer_steps).
    let items = replay(&ep, 0, REPLAY).await.unwrap();
    assert_eq!(
        items.iter().map(|i| i.seq).collect::<Vec<_>>(),
        vec![3, 4, 5, 6, 7]
    );
    assert_eq!(
        items.iter().map(|i| i.payload[0]).collect::<Vec<_>>(),
        vec![3, 4, 5, 6, 7]
    );
    let items = replay(&ep, 6, REPLAY).await.unwrap();
    assert_eq!(items.iter().map(|i| i.seq).collect::<Vec<_>>(), vec![6, 7]);
    assert_eq!(replay(&ep, 100, REPLAY).await.unwrap(), vec![]);
    // Requests that reach the END seq value are valid too.
    assert_eq!(replay(&ep, END_SEQ, REPLAY).await.unwrap(), vec![]);
}

#[tokio::test]
async fn concurrent_replays() {
    let mut publisher = publisher("t", ReplayFormat::WithTopic, 100).await;
    for i in 0..20u8 {
        publisher.publish(vec![i]).await.unwrap();
    }
    let ep = publisher.replay_endpoint().unwrap().to_owned();
    let handles: Vec<_> = (0..4u64)
        .map(|k| {
            let ep = ep.clone();
            tokio::spawn(async move { replay(&ep, k * 5, REPLAY).await.unwrap().len() })
        })
        .collect();
    let mut lens = Vec::new();
    for h in handles {
        lens.push(h.await.unwrap());
    }
    assert_eq!(lens, vec![20, 15, 10, 5]);
}

#[tokio::test]
async fn timeouts() {
    // A ROUTER that never answers.
    let mut silent = RouterSocket::new();
    let ep = silent.bind("tcp://127.0.0.1:0").await.unwrap().to_string();
    let t0 = std::time::Instant::now();
    let r = replay(&ep, 0, Duration::from_millis(300)).await;
    assert!(matches!(r, Err(TransportError::Timeout(_))), "{r:?}");
    assert!(t0.elapsed() < Duration::from_secs(3));

    // Nobody listening at all (a port that was just free).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let closed = format!("tcp://127.0.0.1:{port}");
    let t0 = std::time::Instant::now();
    assert!(replay(&closed, 0, Duration::from_millis(300))
        .await
        .is_err());
    assert!(Subscriber::connect(&closed, "", Duration::from_millis(300))
        .await
        .is_err());
    assert!(t0.elapsed() < Duration::from_secs(5));

    // A quiet publisher.
    let publisher = publisher("", ReplayFormat::WithTopic, 1).await;
    let mut sub = Subscriber::connect(publisher.endpoint(), "", CONNECT)
        .await
        .unwrap();
    assert_eq!(
        sub.recv_timeout(Duration::from_millis(200)).await.unwrap(),
        None
    );
}

#[tokio::test]
async fn one_subscriber_many_ranks() {
    // Data-parallel ranks publish on their own ports; one SUB can listen to all of them.
    let case = common::cases()
        .into_iter()
        .find(|c| c.name == "removed_and_cleared")
        .unwrap();
    let mut ranks = Vec::new();
    for rank in 0..2u32 {
        ranks.push((rank, publisher("kv", ReplayFormat::WithTopic, 10).await));
    }
    let eps: Vec<String> = ranks.iter().map(|(_, p)| p.endpoint().to_owned()).collect();
    let eps: Vec<&str> = eps.iter().map(String::as_str).collect();
    let mut sub = Subscriber::connect_all(&eps, "kv", CONNECT).await.unwrap();
    let mut seen = [false, false];
    for _ in 0..200 {
        for (rank, p) in ranks.iter_mut() {
            let mut b = case.expected.clone();
            b.data_parallel_rank = Some(*rank);
            p.publish_batch(&b, Layout::Map).await.unwrap();
        }
        while let Some(m) = sub.recv_timeout(STEP).await.unwrap() {
            let b = decode(&m.payload).unwrap();
            seen[b.data_parallel_rank.unwrap() as usize] = true;
        }
        if seen == [true, true] {
            return;
        }
    }
    panic!("not every rank was heard: {seen:?}");
}
