//! Interop with real libzmq: pyzmq (in the venv scripts/gen-kv-events.py sets up) plays vLLM's
//! ZmqEventPublisher for the Rust Subscriber and replay client, and a pyzmq SUB + DEALER
//! client talks to the Rust Publisher. Skipped, with a message, only when the venv cannot be
//! set up (no python3, or no access to PyPI).

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use kvroute_kv_events::transport::{replay, Publisher, PublisherConfig, Subscriber, END_SEQ};
use kvroute_kv_events::wire::decode;
use serde_json::Value as Json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

const STEP: Duration = Duration::from_millis(50);
const LONG: Duration = Duration::from_secs(20);

fn script() -> PathBuf {
    common::repo_root().join("scripts/gen-kv-events.py")
}

/// The venv's python, set up once per test binary; `None` (with the reason printed) when it
/// cannot be.
fn venv_python() -> Option<PathBuf> {
    static PY: OnceLock<Option<PathBuf>> = OnceLock::new();
    PY.get_or_init(|| {
        let out = std::process::Command::new("python3").arg(script()).arg("venv").output();
        match out {
            Ok(o) if o.status.success() => {
                let stdout = String::from_utf8_lossy(&o.stdout);
                let py = PathBuf::from(stdout.lines().last().unwrap_or("").trim());
                assert!(py.exists(), "gen-kv-events.py venv printed {stdout:?}");
                Some(py)
            }
            Ok(o) => {
                eprintln!(
                    "SKIPPED pyzmq interop: could not set up the venv (python3 scripts/gen-kv-events.py venv \
                     exited with {}; no network?):\n{}",
                    o.status,
                    String::from_utf8_lossy(&o.stderr)
                );
                None
            }
            Err(e) => {
                eprintln!("SKIPPED pyzmq interop: cannot run python3: {e}");
                None
            }
        }
    })
    .clone()
}

struct Py {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Py {
    fn spawn(py: &PathBuf, args: &[&str]) -> Py {
        let mut child = Command::new(py)
            .arg(script())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Py {
            child,
            stdin,
            lines,
        }
    }

    async fn line(&mut self) -> String {
        tokio::time::timeout(LONG, self.lines.next_line())
            .await
            .expect("python answered in time")
            .unwrap()
            .expect("python still running")
    }

    async fn cmd(&mut self, cmd: &str) -> String {
        self.stdin
            .write_all(format!("{cmd}\n").as_bytes())
            .await
            .unwrap();
        self.stdin.flush().await.unwrap();
        self.line().await
    }

    /// `pub`/`drop` a golden case; returns its seq.
    async fn send(&mut self, verb: &str, case: &str, layout: &str) -> u64 {
        let answer = self.cmd(&format!("{verb} {case} {layout}")).await;
        answer
            .strip_prefix("ok ")
            .unwrap_or_else(|| panic!("{answer}"))
            .parse()
            .unwrap()
    }

    async fn quit(mut self) {
        let _ = self.cmd_no_answer("quit").await;
        let status = tokio::time::timeout(LONG, self.child.wait())
            .await
            .expect("python exits")
            .unwrap();
        assert!(status.success());
    }

    async fn cmd_no_answer(&mut self, cmd: &str) -> std::io::Result<()> {
        self.stdin.write_all(format!("{cmd}\n").as_bytes()).await?;
        self.stdin.flush().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyzmq_publisher_to_rust_subscriber_and_replay() {
    let Some(py) = venv_python() else { return };
    let topic = "kv@10.0.0.7@model";
    for format in ["topic", "legacy"] {
        let mut server = Py::spawn(
            &py,
            &["pyzmq-serve", "--topic", topic, "--replay-format", format],
        );
        let eps: Json = serde_json::from_str(&server.line().await).unwrap();
        let (pub_ep, replay_ep) = (
            eps["pub"].as_str().unwrap(),
            eps["replay"].as_str().unwrap().to_owned(),
        );
        let mut sub = Subscriber::connect(pub_ep, "kv@", LONG).await.unwrap();

        // Slow joiner: publish until one arrives.
        let mut last = None;
        for _ in 0..200 {
            let seq = server.send("pub", "empty_batch", "map").await;
            if let Some(m) = sub.recv_timeout(STEP).await.unwrap() {
                last = Some(m.seq);
                while let Some(m) = sub.recv_timeout(STEP).await.unwrap() {
                    last = Some(m.seq);
                }
                assert_eq!(last, Some(seq));
                break;
            }
        }
        let last = last.expect("the subscriber heard the pyzmq publisher");

        // Every golden case, live: msgspec on the other side encodes exactly the golden bytes.
        let mut expect_seq = last + 1;
        for case in common::cases() {
            for f in &case.files {
                let layout = f.layout.to_string();
                assert_eq!(server.send("pub", &case.name, &layout).await, expect_seq);
                let m = sub.recv_timeout(LONG).await.unwrap().expect("live message");
                assert_eq!(
                    (m.seq, &m.topic[..]),
                    (expect_seq, topic.as_bytes()),
                    "{}",
                    f.file
                );
                assert!(
                    m.payload == f.bytes,
                    "{}: payload differs from the golden file",
                    f.file
                );
                assert_eq!(decode(&m.payload).unwrap(), case.expected, "{}", f.file);
                expect_seq += 1;
            }
        }

        // A lost message, then a live one: the gap is replayed with its topic frame.
        let lost = server.send("drop", "stored_bytes_hashes", "map").await;
        let next = server
            .send("pub", "removed_and_cleared", "positional")
            .await;
        let m = sub.recv_timeout(LONG).await.unwrap().unwrap();
        assert_eq!((lost, m.seq), (expect_seq, next));
        let items = replay(&replay_ep, lost, LONG).await.unwrap();
        assert_eq!(
            items.iter().map(|i| i.seq).collect::<Vec<_>>(),
            vec![lost, next]
        );
        let want_topic = (format == "topic").then(|| Bytes::copy_from_slice(topic.as_bytes()));
        assert!(
            items.iter().all(|i| i.topic == want_topic),
            "{format}: {:?}",
            items[0].topic
        );
        let golden =
            std::fs::read(common::golden_dir().join("stored_bytes_hashes.map.msgpack")).unwrap();
        assert!(items[0].payload == golden);

        // Everything since seq 0, then the end marker; and nothing past the end.
        let all = replay(&replay_ep, 0, LONG).await.unwrap();
        assert_eq!(
            all.iter().map(|i| i.seq).collect::<Vec<_>>(),
            (0..=next).collect::<Vec<_>>()
        );
        assert_eq!(replay(&replay_ep, next + 1, LONG).await.unwrap(), vec![]);
        server.quit().await;
    }
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_publisher_to_pyzmq_client() {
    let Some(py) = venv_python() else { return };
    let mut cfg = PublisherConfig::new("tcp://127.0.0.1:0");
    cfg.replay_endpoint = Some("tcp://127.0.0.1:0".into());
    cfg.topic = "kv".into();
    let mut publisher = Publisher::bind(cfg).await.unwrap();
    let payloads: Vec<Vec<u8>> = common::cases()
        .into_iter()
        .flat_map(|c| c.files)
        .map(|f| f.bytes)
        .collect();
    let mut client = Py::spawn(
        &py,
        &[
            "pyzmq-client",
            "--pub",
            publisher.endpoint(),
            "--replay",
            publisher.replay_endpoint().unwrap(),
            "--topic",
            "kv",
            "--count",
            "5",
            "--start",
            "0",
            "--max-seconds",
            "20",
        ],
    );
    assert_eq!(client.line().await, r#"{"subscribed": true}"#);
    // Publish golden payloads until the client has taken its 5 live messages and its replay.
    let result = loop {
        tokio::select! {
            line = client.lines.next_line() => break line.unwrap().expect("client result"),
            _ = tokio::time::sleep(STEP) => {
                let seq = publisher.next_seq() as usize;
                publisher.publish(payloads[seq % payloads.len()].clone()).await.unwrap();
                assert!(seq < 400, "the pyzmq client never finished");
            }
        }
    };
    let result: Json = serde_json::from_str(&result).unwrap();
    let live = result["live"].as_array().unwrap();
    assert_eq!(live.len(), 5);
    let mut prev = None;
    for frames in live {
        let f: Vec<Vec<u8>> = frames
            .as_array()
            .unwrap()
            .iter()
            .map(|h| unhex(h.as_str().unwrap()))
            .collect();
        assert_eq!(f.len(), 3);
        assert_eq!(f[0], b"kv");
        let seq = u64::from_be_bytes(f[1].clone().try_into().unwrap());
        assert_eq!(f[2], payloads[seq as usize % payloads.len()]);
        if let Some(p) = prev {
            assert_eq!(seq, p + 1);
        }
        prev = Some(seq);
    }
    assert!(result["ended"].as_bool().unwrap(), "replay end marker");
    let replay = result["replay"].as_array().unwrap();
    let (end, items) = replay.split_last().unwrap();
    let end: Vec<Vec<u8>> = end
        .as_array()
        .unwrap()
        .iter()
        .map(|h| unhex(h.as_str().unwrap()))
        .collect();
    assert_eq!(
        end,
        vec![vec![], vec![], END_SEQ.to_be_bytes().to_vec(), vec![]]
    );
    assert!(items.len() as u64 > prev.unwrap());
    for (i, frames) in items.iter().enumerate() {
        let f: Vec<Vec<u8>> = frames
            .as_array()
            .unwrap()
            .iter()
            .map(|h| unhex(h.as_str().unwrap()))
            .collect();
        // DEALER view: (b"", topic, seq, payload)
        assert_eq!(f.len(), 4);
        assert_eq!((f[0].as_slice(), f[1].as_slice()), (&b""[..], &b"kv"[..]));
        assert_eq!(
            u64::from_be_bytes(f[2].clone().try_into().unwrap()),
            i as u64
        );
        assert_eq!(f[3], payloads[i % payloads.len()]);
    }
    let status = tokio::time::timeout(LONG, client.child.wait())
        .await
        .expect("client exits")
        .unwrap();
    assert!(status.success());
}
