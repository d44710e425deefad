//! vLLM's KV-event ZMQ transport, on the pure-Rust `zeromq` crate (tokio).
//!
//! vLLM's `ZmqEventPublisher` (`vllm/distributed/kv_events.py`):
//! - a PUB socket sends one 3-frame message per batch: `(topic, seq, payload)`, `seq` an 8-byte
//!   big-endian counter from 0, `payload` the msgpack [`crate::wire::EventBatch`];
//! - an optional ROUTER socket answers replay requests from a ring buffer of the last
//!   `buffer_steps` (default 10 000) payloads. A client (DEALER, or REQ for a single reply)
//!   sends the start seq as 8 bytes big-endian after an empty delimiter frame (the ROUTER sees
//!   `(identity, b"", start)` and ignores anything but 3 frames). The reply is one message per
//!   buffered seq >= start, then an end marker whose seq is -1 (`ff` x 8) and whose payload is
//!   empty. After the delimiter a DEALER receives `(topic, seq, payload)` and the end marker
//!   `(b"", END, b"")` since vLLM PR #45177 (v0.26), `(seq, payload)` and `(END, b"")` before;
//!   [`replay`] accepts both;
//! - with data parallelism, rank `r` publishes on `port + r` of both endpoints
//!   ([`offset_endpoint_port`]).
//!
//! ZMQ's "slow joiner": a SUB socket only gets what the PUB sends after the subscription has
//! reached it, so messages published right after connecting can be missed. The sequence numbers
//! expose such gaps; [`replay`] fills them.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use thiserror::Error;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use zeromq::{
    DealerSocket, PubSocket, RouterSocket, Socket, SocketEvent, SocketOptions, SocketRecv,
    SocketSend, SubSocket, ZmqMessage,
};

use crate::wire::{encode, EventBatch, Layout};

/// The seq of the replay end marker: `(-1).to_bytes(8, "big", signed=True)`.
pub const END_SEQ: u64 = u64::MAX;

/// vLLM's default `buffer_steps`.
pub const DEFAULT_BUFFER_STEPS: usize = 10_000;

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TransportError {
    #[error("zmq: {0}")]
    Zmq(#[from] zeromq::ZmqError),
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("malformed message: {0}")]
    Malformed(String),
    #[error("invalid endpoint {endpoint:?}: {reason}")]
    Endpoint {
        endpoint: String,
        reason: &'static str,
    },
}

/// One live message from a publisher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveMessage {
    pub topic: Bytes,
    pub seq: u64,
    /// The msgpack batch ([`crate::wire::decode`]).
    pub payload: Bytes,
}

/// One replayed batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayItem {
    /// `None` from publishers before vLLM PR #45177, which sent no topic frame in replies.
    pub topic: Option<Bytes>,
    pub seq: u64,
    pub payload: Bytes,
}

fn seq_bytes(seq: u64) -> Bytes {
    Bytes::copy_from_slice(&seq.to_be_bytes())
}

fn parse_seq(frame: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(frame).ok().map(u64::from_be_bytes)
}

fn message(frames: Vec<Bytes>) -> ZmqMessage {
    // Every caller passes at least one frame.
    ZmqMessage::try_from(frames).unwrap_or_else(|_| ZmqMessage::from(Bytes::new()))
}

fn options(connect_timeout: Duration) -> SocketOptions {
    let mut o = SocketOptions::default();
    o.connect_timeout(connect_timeout);
    o
}

/// A SUB socket on one or more vLLM publishers (e.g. every DP rank of an engine), filtered on a
/// topic prefix (`""`: everything).
pub struct Subscriber {
    socket: SubSocket,
    topic: Vec<u8>,
    monitor: futures_channel::mpsc::Receiver<SocketEvent>,
}

/// What [`Subscriber::next_event`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubscriberEvent {
    /// A message.
    Message(LiveMessage),
    /// A publisher's connection closed; the socket reconnects by itself, and messages sent
    /// meanwhile are lost (the sequence numbers show the gap).
    Disconnected,
    /// A (re)connection to a publisher completed.
    Connected,
}

impl Subscriber {
    /// Connects to `endpoint` (e.g. `tcp://10.0.0.5:5557`) and subscribes to `topic`. Waits at
    /// most `connect_timeout` for the TCP connection and ZMTP handshake; afterwards the socket
    /// reconnects by itself if the publisher goes away.
    pub async fn connect(
        endpoint: &str,
        topic: &str,
        connect_timeout: Duration,
    ) -> Result<Self, TransportError> {
        Self::connect_all(&[endpoint], topic, connect_timeout).await
    }

    /// As [`Subscriber::connect`], to several publishers at once (messages are fair-queued;
    /// seqs are per publisher, so keep one subscriber per publisher to track gaps).
    pub async fn connect_all(
        endpoints: &[&str],
        topic: &str,
        connect_timeout: Duration,
    ) -> Result<Self, TransportError> {
        let mut socket = SubSocket::with_options(options(connect_timeout));
        let monitor = socket.monitor();
        socket.subscribe(topic).await?;
        let deadline = Instant::now() + connect_timeout;
        for ep in endpoints {
            tokio::time::timeout_at(deadline, socket.connect(ep))
                .await
                .map_err(|_| TransportError::Timeout(connect_timeout))??;
        }
        Ok(Subscriber {
            socket,
            topic: topic.as_bytes().to_vec(),
            monitor,
        })
    }

    /// The next message or connection change, `Ok(None)` if none came within `timeout`.
    /// Cancel-safe as [`Subscriber::recv`].
    pub async fn next_event(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<SubscriberEvent>, TransportError> {
        let monitor = &mut self.monitor;
        let change = async {
            loop {
                match monitor.next().await {
                    Some(SocketEvent::Disconnected(_)) => return SubscriberEvent::Disconnected,
                    Some(SocketEvent::Connected(..)) => return SubscriberEvent::Connected,
                    Some(_) => {}
                    // The socket is gone with its monitor: only messages (or errors) remain.
                    None => std::future::pending::<()>().await,
                }
            }
        };
        let socket = &mut self.socket;
        let topic = &self.topic;
        let work = async {
            tokio::select! {
                biased;
                c = change => Ok(c),
                m = recv_message(socket, topic) => m.map(SubscriberEvent::Message),
            }
        };
        match tokio::time::timeout(timeout, work).await {
            Ok(r) => r.map(Some),
            Err(_) => Ok(None),
        }
    }

    /// Waits for the next message. A message that is not `(topic, 8-byte seq, payload)` is an
    /// [`TransportError::Malformed`]; the subscriber stays usable.
    pub async fn recv(&mut self) -> Result<LiveMessage, TransportError> {
        recv_message(&mut self.socket, &self.topic).await
    }

    /// [`Subscriber::recv`] with a timeout: `Ok(None)` if nothing came in time.
    pub async fn recv_timeout(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<LiveMessage>, TransportError> {
        match tokio::time::timeout(timeout, self.recv()).await {
            Ok(r) => r.map(Some),
            Err(_) => Ok(None),
        }
    }
}

async fn recv_message(socket: &mut SubSocket, topic: &[u8]) -> Result<LiveMessage, TransportError> {
    loop {
        let frames = socket.recv().await?.into_vec();
        // The PUB side filters; check again, as libzmq's SUB does.
        if !frames.first().is_some_and(|t| t.starts_with(topic)) {
            continue;
        }
        let [topic, seq, payload]: [Bytes; 3] = frames.try_into().map_err(|f: Vec<Bytes>| {
            TransportError::Malformed(format!("{} frames, expected 3", f.len()))
        })?;
        let seq = parse_seq(&seq).ok_or_else(|| {
            TransportError::Malformed(format!("seq frame of {} bytes, expected 8", seq.len()))
        })?;
        return Ok(LiveMessage {
            topic,
            seq,
            payload,
        });
    }
}

/// Asks the replay ROUTER at `endpoint` for every buffered batch with seq >= `start_seq` and
/// collects them until the end marker, all within `timeout` (else [`TransportError::Timeout`]).
/// Uses a fresh DEALER connection per call, so a timed-out replay cannot leak late replies into
/// the next one.
pub async fn replay(
    endpoint: &str,
    start_seq: u64,
    timeout: Duration,
) -> Result<Vec<ReplayItem>, TransportError> {
    let deadline = Instant::now() + timeout;
    let work = async {
        let mut socket = DealerSocket::with_options(options(timeout));
        socket.connect(endpoint).await?;
        socket
            .send(message(vec![Bytes::new(), seq_bytes(start_seq)]))
            .await?;
        let mut items = Vec::new();
        loop {
            let frames = socket.recv().await?.into_vec();
            match parse_replay_frames(frames)? {
                Some(item) => items.push(item),
                None => return Ok(items),
            }
        }
    };
    tokio::time::timeout_at(deadline, work)
        .await
        .map_err(|_| TransportError::Timeout(timeout))?
}

/// One reply as a DEALER receives it: `Ok(None)` for the end marker.
fn parse_replay_frames(mut frames: Vec<Bytes>) -> Result<Option<ReplayItem>, TransportError> {
    // The empty delimiter the ROUTER echoed back.
    if frames.len() > 1 && frames[0].is_empty() {
        frames.remove(0);
    }
    let (topic, seq, payload) = match frames.len() {
        1 if frames[0].is_empty() => return Ok(None), // the very first vLLM release's end marker
        2 => {
            let payload = frames.pop().unwrap_or_default();
            (None, frames.pop().unwrap_or_default(), payload)
        }
        3 => {
            let payload = frames.pop().unwrap_or_default();
            let seq = frames.pop().unwrap_or_default();
            (frames.pop(), seq, payload)
        }
        n => {
            return Err(TransportError::Malformed(format!(
                "replay reply of {n} frames"
            )))
        }
    };
    let seq = parse_seq(&seq).ok_or_else(|| {
        TransportError::Malformed(format!(
            "replay seq frame of {} bytes, expected 8",
            seq.len()
        ))
    })?;
    if seq == END_SEQ {
        return Ok(None);
    }
    Ok(Some(ReplayItem {
        topic,
        seq,
        payload,
    }))
}

/// Port offset of vLLM's `ZmqEventPublisher.offset_endpoint_port`: rank `r` publishes on
/// `port + r` (`inproc://x` becomes `inproc://x_dp{r}`); rank 0 keeps the endpoint.
pub fn offset_endpoint_port(
    endpoint: &str,
    data_parallel_rank: u32,
) -> Result<String, TransportError> {
    if data_parallel_rank == 0 {
        return Ok(endpoint.to_owned());
    }
    if endpoint.contains("inproc") {
        return Ok(format!("{endpoint}_dp{data_parallel_rank}"));
    }
    let bad = |reason| TransportError::Endpoint {
        endpoint: endpoint.to_owned(),
        reason,
    };
    if !endpoint.contains("tcp") {
        return Err(bad("must contain 'inproc' or 'tcp'"));
    }
    let Some(colon) = endpoint.rfind(':') else {
        return Ok(endpoint.to_owned());
    };
    let port: u32 = endpoint[colon + 1..]
        .parse()
        .map_err(|_| bad("port is not a number"))?;
    let port = port
        .checked_add(data_parallel_rank)
        .filter(|&p| p <= u32::from(u16::MAX))
        .ok_or_else(|| bad("port + rank is not a port"))?;
    Ok(format!("{}:{port}", &endpoint[..colon]))
}

/// What a [`Publisher`]'s replay socket sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReplayFormat {
    /// `(topic, seq, payload)` and `(b"", END, b"")`: vLLM since PR #45177 (v0.26).
    #[default]
    WithTopic,
    /// `(seq, payload)` and `(END, b"")`: earlier vLLM.
    Legacy,
}

/// Where and how a [`Publisher`] publishes.
#[derive(Debug, Clone)]
pub struct PublisherConfig {
    /// PUB bind address, e.g. `tcp://127.0.0.1:0` (port 0: any free port; see
    /// [`Publisher::endpoint`]).
    pub endpoint: String,
    /// ROUTER bind address for replay, if any.
    pub replay_endpoint: Option<String>,
    pub topic: String,
    /// Batches kept for replay.
    pub buffer_steps: usize,
    pub replay_format: ReplayFormat,
}

impl PublisherConfig {
    pub fn new(endpoint: impl Into<String>) -> Self {
        PublisherConfig {
            endpoint: endpoint.into(),
            replay_endpoint: None,
            topic: String::new(),
            buffer_steps: DEFAULT_BUFFER_STEPS,
            replay_format: ReplayFormat::default(),
        }
    }
}

type Ring = Arc<Mutex<VecDeque<(u64, Bytes)>>>;

/// A stand-in for vLLM's `ZmqEventPublisher`, for tests and simulators: a PUB socket, and a
/// ROUTER socket answering replay requests from a ring buffer of the last `buffer_steps`
/// payloads. The replay responder runs as a tokio task that stops when the publisher is dropped.
pub struct Publisher {
    socket: PubSocket,
    endpoint: String,
    replay_endpoint: Option<String>,
    topic: Bytes,
    next_seq: u64,
    buffer: Ring,
    buffer_steps: usize,
    replay_task: Option<JoinHandle<()>>,
}

impl Drop for Publisher {
    fn drop(&mut self) {
        if let Some(t) = self.replay_task.take() {
            t.abort();
        }
    }
}

impl Publisher {
    /// Binds the PUB (and replay ROUTER) sockets. Must run inside a tokio runtime.
    pub async fn bind(config: PublisherConfig) -> Result<Self, TransportError> {
        let mut socket = PubSocket::new();
        let endpoint = socket.bind(&config.endpoint).await?.to_string();
        let buffer: Ring = Arc::new(Mutex::new(VecDeque::new()));
        let topic = Bytes::from(config.topic.into_bytes());
        let (replay_endpoint, replay_task) = match &config.replay_endpoint {
            Some(ep) => {
                let mut router = RouterSocket::new();
                let bound = router.bind(ep).await?.to_string();
                let task = tokio::spawn(serve_replay(
                    router,
                    buffer.clone(),
                    topic.clone(),
                    config.replay_format,
                ));
                (Some(bound), Some(task))
            }
            None => (None, None),
        };
        Ok(Publisher {
            socket,
            endpoint,
            replay_endpoint,
            topic,
            next_seq: 0,
            buffer,
            buffer_steps: config.buffer_steps,
            replay_task,
        })
    }

    /// The PUB endpoint as bound (port resolved), e.g. `tcp://127.0.0.1:40123`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The replay ROUTER endpoint as bound, if any.
    pub fn replay_endpoint(&self) -> Option<&str> {
        self.replay_endpoint.as_deref()
    }

    /// The seq the next published batch gets (vLLM counts from 0).
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    fn record(&mut self, payload: Bytes) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.buffer_steps > 0 {
            let mut ring = self.buffer.lock().unwrap_or_else(|e| e.into_inner());
            if ring.len() == self.buffer_steps {
                ring.pop_front();
            }
            ring.push_back((seq, payload));
        }
        seq
    }

    /// Sends `payload` as `(topic, seq, payload)` with the next seq and keeps it for replay;
    /// returns the seq. Like any ZMQ PUB, sends to no one when nobody is subscribed yet.
    pub async fn publish(&mut self, payload: impl Into<Bytes>) -> Result<u64, TransportError> {
        let payload = payload.into();
        let seq = self.record(payload.clone());
        self.socket
            .send(message(vec![self.topic.clone(), seq_bytes(seq), payload]))
            .await?;
        Ok(seq)
    }

    /// Encodes `batch` in `layout` and [`Publisher::publish`]es it.
    pub async fn publish_batch(
        &mut self,
        batch: &EventBatch,
        layout: Layout,
    ) -> Result<u64, TransportError> {
        self.publish(encode(batch, layout)).await
    }

    /// Takes the next seq and keeps `payload` for replay without sending it: a message lost on
    /// the way, for testing gap recovery.
    pub fn record_only(&mut self, payload: impl Into<Bytes>) -> u64 {
        self.record(payload.into())
    }
}

async fn serve_replay(mut router: RouterSocket, buffer: Ring, topic: Bytes, format: ReplayFormat) {
    loop {
        let frames = match router.recv().await {
            Ok(m) => m.into_vec(),
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        // (identity, b"", start_seq), as vLLM requires.
        let [id, _delim, start]: [Bytes; 3] = match frames.try_into() {
            Ok(f) => f,
            Err(_) => continue,
        };
        let Some(start) = parse_seq(&start) else {
            continue;
        };
        let items: Vec<(u64, Bytes)> = {
            let ring = buffer.lock().unwrap_or_else(|e| e.into_inner());
            ring.iter()
                .filter(|(seq, _)| *seq >= start)
                .cloned()
                .collect()
        };
        let frame_sets = items
            .into_iter()
            .map(|(seq, payload)| match format {
                ReplayFormat::WithTopic => vec![
                    id.clone(),
                    Bytes::new(),
                    topic.clone(),
                    seq_bytes(seq),
                    payload,
                ],
                ReplayFormat::Legacy => vec![id.clone(), Bytes::new(), seq_bytes(seq), payload],
            })
            .chain(std::iter::once(match format {
                ReplayFormat::WithTopic => vec![
                    id.clone(),
                    Bytes::new(),
                    Bytes::new(),
                    seq_bytes(END_SEQ),
                    Bytes::new(),
                ],
                ReplayFormat::Legacy => {
                    vec![id.clone(), Bytes::new(), seq_bytes(END_SEQ), Bytes::new()]
                }
            }));
        for frames in frame_sets {
            if router.send(message(frames)).await.is_err() {
                break; // the client went away
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_like_vllm() {
        assert_eq!(
            offset_endpoint_port("tcp://*:5557", 0).unwrap(),
            "tcp://*:5557"
        );
        assert_eq!(
            offset_endpoint_port("tcp://*:5557", 3).unwrap(),
            "tcp://*:5560"
        );
        assert_eq!(
            offset_endpoint_port("tcp://[::1]:5557", 1).unwrap(),
            "tcp://[::1]:5558"
        );
        assert_eq!(
            offset_endpoint_port("inproc://cache", 2).unwrap(),
            "inproc://cache_dp2"
        );
        assert!(offset_endpoint_port("ipc:///tmp/x", 1).is_err());
        assert!(offset_endpoint_port("tcp://*:65535", 1).is_err());
    }

    #[test]
    fn replay_frames_all_formats() {
        let b = |s: &[u8]| Bytes::copy_from_slice(s);
        let seq = seq_bytes(7);
        let end = seq_bytes(END_SEQ);
        let item = parse_replay_frames(vec![b(b""), b(b"kv"), seq.clone(), b(b"p")])
            .unwrap()
            .unwrap();
        assert_eq!(
            item,
            ReplayItem {
                topic: Some(b(b"kv")),
                seq: 7,
                payload: b(b"p")
            }
        );
        let item = parse_replay_frames(vec![b(b""), b(b""), seq.clone(), b(b"p")])
            .unwrap()
            .unwrap();
        assert_eq!(item.topic, Some(Bytes::new()));
        let item = parse_replay_frames(vec![b(b""), seq.clone(), b(b"p")])
            .unwrap()
            .unwrap();
        assert_eq!(
            item,
            ReplayItem {
                topic: None,
                seq: 7,
                payload: b(b"p")
            }
        );
        assert_eq!(
            parse_replay_frames(vec![b(b""), b(b""), end.clone(), b(b"")]).unwrap(),
            None
        );
        assert_eq!(
            parse_replay_frames(vec![b(b""), b(b"kv"), end.clone(), b(b"")]).unwrap(),
            None
        );
        assert_eq!(
            parse_replay_frames(vec![b(b""), end, b(b"")]).unwrap(),
            None
        );
        assert_eq!(parse_replay_frames(vec![b(b""), b(b"")]).unwrap(), None);
        assert!(parse_replay_frames(vec![b(b""), b(b"xx"), b(b"p")]).is_err());
        assert!(parse_replay_frames(vec![b(b"a"), b(b"b"), b(b"c"), b(b"d"), b(b"e")]).is_err());
    }
}
