//! `kvroute-sim serve` replicas that publish KV events, for the engine-view tests.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{completion, http, prompt, sim_bin, spawn_and_collect, Resp, Sim, TempDir};

/// A `kvroute-sim serve` replica publishing KV events (with a replay socket), tokenizing with
/// the fixture tokenizer as kvroute does.
pub struct PublishingSim {
    pub sim: Sim,
    /// `tcp://127.0.0.1:PORT` of its PUB socket.
    pub events: String,
    /// Its replay socket.
    pub replay: String,
}

impl PublishingSim {
    pub fn start(dir: &TempDir, name: &str, speedup: f64, extra: &[&str]) -> PublishingSim {
        let mut cmd = Command::new(sim_bin());
        cmd.args(["serve", "--host", "127.0.0.1", "--port", "0"]);
        cmd.args(["--name", name, "--model", "study"]);
        cmd.args(["--speedup", &speedup.to_string()]);
        cmd.arg("--tokenizer").arg(tokenizer_fixture());
        cmd.args(["--kv-events-endpoint", "tcp://127.0.0.1:0"]);
        cmd.args(["--kv-events-replay-endpoint", "tcp://127.0.0.1:0"]);
        cmd.args(extra);
        let (proc, lines) = spawn_and_collect(
            name,
            cmd,
            &dir.path(&format!("{name}.log")),
            "kv-events on ",
        );
        let addr = lines[0]
            .trim()
            .trim_start_matches("listening on ")
            .to_owned();
        let words: Vec<&str> = lines[1].split_whitespace().collect();
        let (events, replay) = match words.as_slice() {
            ["kv-events", "on", ep, "replay", r] => (ep.to_string(), r.to_string()),
            _ => panic!("unexpected line {:?}", lines[1]),
        };
        PublishingSim {
            sim: Sim {
                proc,
                name: name.to_owned(),
                addr,
            },
            events,
            replay,
        }
    }
}

/// The tokenizer fixture (tests/tokenizer: tokenizer.json and its chat template).
pub fn tokenizer_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/tokenizer")
        .canonicalize()
        .unwrap()
}

/// POSTs question `q` of `family` (a `len`-byte prompt) to `listen` and checks that it was
/// routed to `want` on its engine view's prefix match; the response.
pub fn expect_engine_match(listen: &str, family: &str, q: u32, len: usize, want: &str) -> Resp {
    let r = http(
        listen,
        "POST",
        "/v1/completions",
        &[],
        &completion("study", &prompt(family, q, len), 2, false),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let why = r.header("x-kvroute-decision").unwrap_or_default();
    assert_eq!(r.header("target-pod"), Some(want), "{family} q{q}: {why}");
    assert!(
        why.contains("view=engine") && why.contains("reason=prefix_match"),
        "{why}"
    );
    r
}
