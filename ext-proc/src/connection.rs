//! The ext_proc listener's connections from Envoy: HTTP/2 limits that a client behind Envoy
//! cannot trip, and whether a connection is still alive.
//!
//! Envoy multiplexes every in-flight request's side stream over a few HTTP/2 connections to
//! kvroute, so one connection carries the in-flight count of thousands of requests. Two things
//! follow:
//! - **Limits** ([`harden`]): h2's defaults send GOAWAY once 20 streams were reset by the
//!   peer before the server accepted them. Envoy resets a side stream whenever its client
//!   resets, so 800 clients that send a request and reset it would drop Envoy's connection and
//!   every stream on it. The pending-reset and local-error-reset limits are raised far above
//!   what Envoy's own circuit breaker lets through, as is the concurrent-stream limit; the
//!   receive windows are large enough that Envoy never queues thousands of frames for kvroute
//!   (which it treats as a flood and answers by dropping the connection); keepalive pings find
//!   a dead peer.
//! - **Liveness** ([`Tracked`]): a side stream that ends because its connection died did not
//!   end with its response (Envoy's `failure_mode_allow: true` lets the response go on without
//!   kvroute). Its ticket is detached instead of released
//!   ([`kvroute_core::Router::detach`]): the slot stays taken until the request's predicted
//!   end.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::transport::server::Connected;

/// Streams reset by Envoy before kvroute accepted them, at once, before h2 sends GOAWAY.
pub const MAX_PENDING_ACCEPT_RESETS: usize = 1 << 20;
/// Streams kvroute reset for the peer's protocol errors before h2 sends GOAWAY.
pub const MAX_LOCAL_ERROR_RESETS: usize = 1 << 16;
/// Concurrent side streams on one connection: above the shipped Envoy circuit breaker
/// (100,000 requests to the ext_proc cluster).
pub const MAX_CONCURRENT_STREAMS: u32 = 200_000;
/// Receive window of a connection, bytes. Envoy queues the frames it cannot send while the
/// window is shut, and drops the connection as a flood once 10,000 are queued
/// (`max_outbound_frames`): with h2's 64 KiB default, a burst of a few hundred new side
/// streams did that.
pub const CONNECTION_WINDOW: u32 = 64 << 20;
/// Receive window of a stream, bytes (a buffered body comes in one message).
pub const STREAM_WINDOW: u32 = 4 << 20;
/// HTTP/2 keepalive: a ping this often, and the connection dropped when a ping goes
/// unanswered this long.
pub const KEEPALIVE: Duration = Duration::from_secs(20);

/// The HTTP/2 settings of the ext_proc server (see the module docs).
pub fn harden(server: tonic::transport::Server) -> tonic::transport::Server {
    server
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_ACCEPT_RESETS))
        .http2_max_local_error_reset_streams(Some(MAX_LOCAL_ERROR_RESETS))
        .max_concurrent_streams(Some(MAX_CONCURRENT_STREAMS))
        .http2_keepalive_interval(Some(KEEPALIVE))
        .http2_keepalive_timeout(Some(KEEPALIVE))
        .initial_connection_window_size(Some(CONNECTION_WINDOW))
        .initial_stream_window_size(Some(STREAM_WINDOW))
}

/// A connection's byte stream: plain TCP, or TLS over it ([`crate::tls`]).
#[derive(Debug)]
pub enum Io {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS (handshake done).
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// A connection that records when it ends: at end of file, a read or write error, or when it
/// is dropped. h2 reads the end of a connection before it fails the connection's streams, so
/// a stream dropped after that sees [`ConnInfo::is_alive`] false.
#[derive(Debug)]
pub struct Tracked {
    io: Io,
    peer: Option<SocketAddr>,
    alive: Arc<AtomicBool>,
}

impl Tracked {
    /// Tracks a plain TCP connection.
    pub fn new(io: TcpStream) -> Self {
        Tracked::with(Io::Plain(io))
    }

    /// Tracks `io`.
    pub fn with(io: Io) -> Self {
        let peer = match &io {
            Io::Plain(s) => s.peer_addr().ok(),
            Io::Tls(s) => s.get_ref().0.peer_addr().ok(),
        };
        Tracked {
            io,
            peer,
            alive: Arc::new(AtomicBool::new(true)),
        }
    }

    fn dead(&self) {
        self.alive.store(false, Ordering::Release);
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.dead();
    }
}

/// What a request learns of its connection (a tonic request extension).
#[derive(Clone, Debug)]
pub struct ConnInfo {
    /// The peer.
    pub remote: Option<SocketAddr>,
    alive: Arc<AtomicBool>,
}

impl ConnInfo {
    /// Whether the connection is still up.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }
}

impl Connected for Tracked {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        ConnInfo {
            remote: self.peer,
            alive: self.alive.clone(),
        }
    }
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }
}

/// Time a client gets to complete its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The connections `listener` accepts (with `TCP_NODELAY`; through a TLS handshake when
/// `tls` is set, each on its own task so that a slow client delays nobody else), until the
/// returned stream is dropped. Accept errors and failed handshakes are logged and skipped.
pub fn incoming(
    listener: tokio::net::TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    what: &'static str,
) -> tokio_stream::wrappers::ReceiverStream<io::Result<Tracked>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(listener = what, error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                () = tx.closed() => return,
            };
            let _ = tcp.set_nodelay(true);
            match &tls {
                None => {
                    if tx.send(Ok(Tracked::new(tcp))).await.is_err() {
                        return;
                    }
                }
                Some(acceptor) => {
                    let (acceptor, tx) = (acceptor.clone(), tx.clone());
                    tokio::spawn(async move {
                        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                            Ok(Ok(s)) => {
                                let _ = tx.send(Ok(Tracked::with(Io::Tls(Box::new(s))))).await;
                            }
                            Ok(Err(e)) => {
                                tracing::warn!(listener = what, %peer, error = %e, "TLS handshake failed")
                            }
                            Err(_) => {
                                tracing::warn!(listener = what, %peer, "TLS handshake timed out")
                            }
                        }
                    });
                }
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

impl AsyncRead for Tracked {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut me.io).poll_read(cx, buf);
        match &r {
            Poll::Ready(Ok(())) if buf.filled().len() == before && buf.remaining() > 0 => me.dead(),
            Poll::Ready(Err(_)) => me.dead(),
            _ => {}
        }
        r
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        let r = Pin::new(&mut me.io).poll_write(cx, buf);
        if let Poll::Ready(Err(_)) = &r {
            me.dead();
        }
        r
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        let r = Pin::new(&mut me.io).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Err(_)) = &r {
            me.dead();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn a_connection_is_dead_after_the_peer_closes_it() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = tokio::spawn(async move {
            let mut c = TcpStream::connect(addr).await.unwrap();
            c.write_all(b"hi").await.unwrap();
            c
        });
        let (io, _) = listener.accept().await.unwrap();
        let mut tracked = Tracked::new(io);
        let info = tracked.connect_info();
        let mut buf = [0u8; 2];
        tracked.read_exact(&mut buf).await.unwrap();
        assert!(info.is_alive());
        drop(client.await.unwrap());
        let n = tracked.read(&mut [0u8; 8]).await.unwrap();
        assert_eq!(n, 0);
        assert!(!info.is_alive(), "end of file seen");
        let other = Tracked::new(TcpStream::connect(addr).await.unwrap());
        let info = other.connect_info();
        drop(other);
        assert!(!info.is_alive(), "dropped");
    }
}
