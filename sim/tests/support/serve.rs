//! What the fake server's tests share (serve/main.rs and its modules):
//! an in-process server on a task, an HTTP/1.1 client with bounded waits, and a `kvroute-sim
//! serve` child's stdout and stop (readme.rs too).

// Each test crate uses some of these.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command};
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Serves `server` on a task until the returned sender is dropped (or sent to); returns its
/// `http://HOST:PORT` too.
pub fn serve_in_background(
    server: kvroute_sim::serve::BoundServer,
) -> (String, tokio::sync::oneshot::Sender<()>) {
    let url = format!("http://{}", server.local_addr());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.serve(async move {
        let _ = rx.await;
    }));
    (url, tx)
}

pub type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

/// How long a response's headers, and then its body, may take.
const TIMEOUT: Duration = Duration::from_secs(30);

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A request to `url` + `path` (JSON content type, plus `headers`).
pub fn request(
    method: &str,
    url: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> hyper::Request<Full<Bytes>> {
    let mut b = hyper::Request::builder()
        .method(method)
        .uri(format!("{url}{path}"))
        .header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(body.into())).unwrap()
}

/// Sends `req`; the response, its body still to read.
pub async fn open(c: &HttpClient, req: hyper::Request<Full<Bytes>>) -> hyper::Response<Incoming> {
    tokio::time::timeout(TIMEOUT, c.request(req))
        .await
        .expect("timely")
        .expect("response")
}

/// Sends a request; returns the status, the headers, the time to the response headers and the
/// body.
pub async fn send(
    c: &HttpClient,
    method: &str,
    url: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> (u16, hyper::HeaderMap, Duration, String) {
    let sent = Instant::now();
    let resp = open(c, request(method, url, path, headers, body)).await;
    let to_headers = sent.elapsed();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = tokio::time::timeout(TIMEOUT, resp.into_body().collect())
        .await
        .expect("timely")
        .expect("body");
    (
        status,
        headers,
        to_headers,
        String::from_utf8_lossy(&body.to_bytes()).into_owned(),
    )
}

pub async fn post(
    c: &HttpClient,
    url: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, hyper::HeaderMap, String) {
    let (status, headers, _, body) = send(c, "POST", url, path, headers, body.to_owned()).await;
    (status, headers, body)
}

pub async fn get(c: &HttpClient, url: &str, path: &str) -> (u16, String) {
    let (status, _, _, body) = send(c, "GET", url, path, &[], Bytes::new()).await;
    (status, body)
}

/// The address a `kvroute-sim serve` child (stdout piped) prints on its first line,
/// `listening on 127.0.0.1:PORT`; fails the test unless it is that line with a port chosen.
pub fn listening_addr(child: &mut Child) -> String {
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped stdout"))
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim_end()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("first line {line:?}"))
        .to_owned();
    assert!(
        addr.starts_with("127.0.0.1:") && !addr.ends_with(":0"),
        "{addr}"
    );
    addr
}

/// Reads stdout lines of `child` on a thread, so that a test can wait for them with a timeout.
pub fn lines(child: &mut Child) -> std_mpsc::Receiver<String> {
    let out = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std_mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// SIGTERM, then the process must exit with success within 10 s (else it is killed and the
/// test fails).
pub fn stop(mut child: Child) {
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            assert!(st.success(), "exit status {st:?}");
            return;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("did not exit after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}
