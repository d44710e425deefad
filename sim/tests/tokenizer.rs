//! A real tokenizer (`--tokenizer`, the committed `tests/tokenizer/`) in the simulator and the
//! fake server, and token-block routing (`--router-blocks tokens`): the router's index keys the
//! ids the engine caches, so what it predicts reused is what the engine reuses; the fake server
//! counts prompts as vLLM would with that tokenizer; a tokenizer that cannot be loaded is a
//! clear error.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use kvroute_core::{RouterConfig, Strategy, StrategySpec, TtftConfig};
use kvroute_sim::cluster::{Cluster, ClusterConfig, RouterBlocks, RunResult};
use kvroute_sim::engine::EngineConfig;
use kvroute_sim::prompt_tokens::PromptReader;
use kvroute_sim::serve::{BoundServer, FaultSpec, ServeConfig, DEFAULT_MAX_BODY_BYTES};
use kvroute_sim::workload::{synthetic_prompt, Arrival};
use kvroute_tokens::ModelTokenizer;
use serde_json::{json, Value};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("sim/ has a parent")
        .to_owned()
}

fn fixture() -> PathBuf {
    repo_root().join("tests/tokenizer")
}

fn reference() -> ModelTokenizer {
    let dir = fixture();
    ModelTokenizer::from_files(
        &dir.join("tokenizer.json"),
        Some(&dir.join("tokenizer_config.json")),
    )
    .expect("the committed tokenizer loads")
}

// ---------------------------------------------------------------------------------------------
// The simulator.

/// vLLM's default block size, so that a prompt spans many blocks.
const BLOCK: u32 = 16;

/// Requests sharing one long document, each with its own question, one every 3 s (each is done
/// long before the next: the engine's cache holds the previous ones' blocks).
fn shared_prefix_arrivals() -> Vec<Arrival> {
    let document = synthetic_prompt("shared-document", 400);
    (0..6)
        .map(|i| Arrival {
            at_us: i * 3_000_000,
            family: None,
            prompt: format!("{document}\nQuestion {i}: which block holds word {i}?").into(),
            output_tokens: 4,
            max_tokens: 4,
            headers: BTreeMap::new(),
            follows: None,
            answer: None,
        })
        .collect()
}

fn cluster(prompts: PromptReader, router_blocks: Option<RouterBlocks>) -> Cluster {
    let engine = EngineConfig {
        block_size: BLOCK,
        kv_capacity_blocks: 4_096,
        ..EngineConfig::default()
    };
    Cluster::new(ClusterConfig {
        engine,
        router: RouterConfig {
            ttft: TtftConfig {
                engine_block_tokens: BLOCK,
                ..TtftConfig::default()
            },
            ..RouterConfig::default()
        },
        prompts,
        router_blocks,
        ..ClusterConfig::default()
    })
    .expect("a valid cluster")
}

fn run(c: &mut Cluster, arrivals: &[Arrival]) -> RunResult {
    let r = c
        .run(arrivals, &StrategySpec::single(Strategy::PrefixCache), "t")
        .expect("runs");
    assert!(r.records.iter().all(|x| x.success), "{:?}", r.records);
    r
}

/// `key=A/B` in a decision line.
fn pair(decision: &str, key: &str) -> (u32, u32) {
    let v = decision
        .split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in {decision}"));
    let (a, b) = v.split_once('/').expect("A/B");
    (a.parse().unwrap(), b.parse().unwrap())
}

/// Every request after the first: the router's index matched exactly the blocks the engine
/// then reused, and the router knew the prompt's exact length in tokens.
fn assert_index_predicts_engine_reuse(r: &RunResult, counts: &[usize]) {
    for (i, rec) in r.records.iter().enumerate() {
        let d = rec.decision.as_deref().expect("routed");
        let (matched, total) = pair(d, "blocks");
        let (_, predicted_prompt) = pair(d, "pred_cached_tokens");
        let prompt = rec.prompt_tokens.unwrap();
        assert_eq!(prompt as usize, counts[i], "#{i}: the engine got the ids");
        assert_eq!(predicted_prompt, prompt, "#{i}: {d}");
        assert_eq!(total, prompt / BLOCK, "#{i}: one key per full block: {d}");
        assert_eq!(
            matched * BLOCK,
            rec.cached_tokens.unwrap(),
            "#{i}: predicted reuse vs the engine's: {d}"
        );
        if i > 0 {
            assert_eq!(rec.reason.as_deref(), Some("prefix_match"), "#{i}: {d}");
            assert!(
                matched * BLOCK * 10 >= prompt * 8,
                "#{i}: the document: {d}"
            );
        }
    }
}

#[test]
fn with_a_real_tokenizer_the_router_predicts_exactly_what_the_engine_reuses() {
    let arrivals = shared_prefix_arrivals();
    let model = reference();
    let counts: Vec<usize> = arrivals
        .iter()
        .map(|a| model.encode_completion(&a.prompt).unwrap().len())
        .collect();
    let prompts = PromptReader::load(&fixture()).unwrap();
    // Token blocks are the default with a real tokenizer.
    let mut c = cluster(prompts.clone(), None);
    assert_eq!(c.router_blocks(), RouterBlocks::Tokens);
    let r = run(&mut c, &arrivals);
    assert_index_predicts_engine_reuse(&r, &counts);
    // The engine reused most of every later prompt.
    let hit = r.token_hit.unwrap();
    assert!(hit > 0.7, "{hit}");

    // Keyed by text, the same engines and ids: the router only estimates the prompt's length.
    let mut text = cluster(prompts, Some(RouterBlocks::Text));
    assert_eq!(text.router_blocks(), RouterBlocks::Text);
    let r = run(&mut text, &arrivals);
    let first = &r.records[0];
    assert_eq!(first.prompt_tokens.unwrap() as usize, counts[0]);
    let (_, estimated) = pair(first.decision.as_deref().unwrap(), "pred_cached_tokens");
    assert_ne!(estimated as usize, counts[0]);
}

#[test]
fn token_blocks_work_with_the_built_in_tokenizer_too() {
    let arrivals = shared_prefix_arrivals();
    let counts: Vec<usize> = arrivals
        .iter()
        .map(|a| kvroute_sim::tokenizer::count_tokens(&a.prompt))
        .collect();
    let mut c = cluster(PromptReader::built_in(), Some(RouterBlocks::Tokens));
    assert_eq!(c.router_blocks(), RouterBlocks::Tokens);
    assert_index_predicts_engine_reuse(&run(&mut c, &arrivals), &counts);
    // Text blocks remain the built-in model's default.
    assert_eq!(
        cluster(PromptReader::built_in(), None).router_blocks(),
        RouterBlocks::Text
    );
}

/// Priming (the study's initial states) uses the same ids and keys as requests: a prompt placed
/// in the index and primed on a pod is then routed there and reused whole.
#[test]
fn primed_prompts_are_keyed_as_requests_are() {
    let arrivals = shared_prefix_arrivals();
    let prompts = PromptReader::load(&fixture()).unwrap();
    let mut c = cluster(prompts, None);
    c.prime_engine(1, &arrivals[0].prompt).unwrap();
    c.place_in_index(1, &arrivals[0].prompt).unwrap();
    let r = run(&mut c, &arrivals[..1]);
    let rec = &r.records[0];
    assert_eq!(rec.pod.as_deref(), Some("B"));
    assert_eq!(rec.reason.as_deref(), Some("prefix_match"));
    let (matched, _) = pair(rec.decision.as_deref().unwrap(), "blocks");
    let prompt = rec.prompt_tokens.unwrap();
    // The engine reuses every full block but never the whole prompt.
    assert_eq!(rec.cached_tokens, Some((prompt - 1) / BLOCK * BLOCK));
    assert!(matched * BLOCK >= rec.cached_tokens.unwrap());
}

// ---------------------------------------------------------------------------------------------
// The fake server.

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

async fn start(prompts: PromptReader) -> (String, tokio::sync::oneshot::Sender<()>) {
    let cfg = ServeConfig {
        host: "127.0.0.1".into(),
        port: 0,
        name: "T".into(),
        model: "study".into(),
        speedup: 100.0,
        engine: EngineConfig::default(),
        fault: FaultSpec::default(),
        max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        prompts,
        ..ServeConfig::default()
    };
    let server = BoundServer::bind(cfg).await.expect("bind");
    let url = format!("http://{}", server.local_addr());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.serve(async move {
        let _ = rx.await;
    }));
    (url, tx)
}

async fn post(c: &HttpClient, url: &str, path: &str, body: &Value) -> (u16, Value) {
    let req = hyper::Request::builder()
        .method("POST")
        .uri(format!("{url}{path}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(30), c.request(req))
        .await
        .expect("timely")
        .expect("response");
    let status = resp.status().as_u16();
    let bytes = tokio::time::timeout(Duration::from_secs(30), resp.into_body().collect())
        .await
        .expect("timely body")
        .expect("body")
        .to_bytes();
    (status, serde_json::from_slice(&bytes).expect("a JSON body"))
}

fn prompt_tokens(v: &Value) -> usize {
    v["usage"]["prompt_tokens"].as_u64().expect("usage") as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_counts_prompts_with_the_configured_tokenizer() {
    let model = reference();
    let (url, stop) = start(PromptReader::load(&fixture()).unwrap()).await;
    let c: HttpClient = Client::builder(TokioExecutor::new()).build_http();

    let text = "The simulator and the fake server tokenize with the same tokenizer. ".repeat(150);
    let (status, body) = post(
        &c,
        &url,
        "/v1/completions",
        &json!({"model": "study", "prompt": text, "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let expected = model.encode_completion(&text).unwrap().len();
    assert_eq!(prompt_tokens(&body), expected);
    assert_ne!(expected, kvroute_sim::tokenizer::count_tokens(&text));

    let messages = json!([
        {"role": "system", "content": "You answer from the document."},
        {"role": "user", "content": text},
    ]);
    let (status, body) = post(
        &c,
        &url,
        "/v1/chat/completions",
        &json!({"model": "study", "messages": messages, "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        prompt_tokens(&body),
        model.encode_chat(&messages, true).unwrap().len()
    );

    // The same chat again: the engine reuses its full blocks (vLLM's prefix caching on the
    // template's ids).
    let (_, again) = post(
        &c,
        &url,
        "/v1/chat/completions",
        &json!({"model": "study", "messages": messages, "max_tokens": 2}),
    )
    .await;
    let cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(prompt_tokens(&again), prompt_tokens(&body));
    let block = u64::from(EngineConfig::default().block_size);
    assert_eq!(cached, (prompt_tokens(&body) as u64 - 1) / block * block);

    // A chat the template refuses: an OpenAI-style 400 with the template's message.
    let (status, body) = post(
        &c,
        &url,
        "/v1/chat/completions",
        &json!({"model": "study", "messages": [{"role": "wizard", "content": "hi"}]}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["type"], "BadRequestError");
    assert_eq!(body["error"]["code"], 400);
    let message = body["error"]["message"].as_str().unwrap();
    let want = model
        .encode_chat(&json!([{"role": "wizard", "content": "hi"}]), true)
        .unwrap_err()
        .to_string();
    assert_eq!(message, want);
    let _ = stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_without_a_tokenizer_renders_chats_as_role_lines() {
    let (url, stop) = start(PromptReader::built_in()).await;
    let c: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let (status, body) = post(
        &c,
        &url,
        "/v1/chat/completions",
        &json!({"model": "study", "messages": [{"role": "wizard", "content": "hi there"}], "max_tokens": 1}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let rendered = "wizard: hi there\nassistant: ";
    assert_eq!(
        prompt_tokens(&body),
        kvroute_sim::tokenizer::count_tokens(rendered)
    );
    let _ = stop.send(());
}

// ---------------------------------------------------------------------------------------------
// The command line.

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kvroute-sim"));
    c.current_dir(repo_root());
    c
}

#[test]
fn a_tokenizer_that_cannot_be_loaded_is_a_clear_error() {
    let missing = "/no/such/tokenizer-dir";
    // Not a tokenizer.json: the README.
    let not_json = "tests/tokenizer/README.md";
    let trace = "sim/examples/trace.jsonl";
    let cases: Vec<Vec<&str>> = vec![
        vec!["study", "--round", "1", "--tokenizer", missing],
        vec!["bar", "--round", "1", "--tokenizer", missing],
        vec!["run", "--trace", trace, "--tokenizer", missing],
        vec!["serve", "--name", "T", "--tokenizer", missing],
        vec!["study", "--round", "1", "--tokenizer", not_json],
        vec!["serve", "--name", "T", "--tokenizer", not_json],
    ];
    for args in cases {
        let out = bin().args(&args).output().expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        let path = args.last().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.starts_with(&format!(
                "error: --tokenizer: cannot load the tokenizer at {path}: "
            )),
            "{args:?}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    let out = bin()
        .args(["run", "--trace", trace, "--router-blocks", "bytes"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--router-blocks"));
}

#[test]
fn run_routes_a_trace_with_the_tokenizer_on_token_blocks() {
    let out = bin()
        .args([
            "run",
            "--trace",
            "sim/examples/trace.jsonl",
            "--strategy",
            "prefix-cache",
            "--tokenizer",
            "tests/tokenizer",
            "--records",
        ])
        .arg(Path::new(env!("CARGO_TARGET_TMPDIR")).join("tokenizer-run.jsonl"))
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let records =
        std::fs::read_to_string(Path::new(env!("CARGO_TARGET_TMPDIR")).join("tokenizer-run.jsonl"))
            .unwrap();
    let model = reference();
    let trace = kvroute_sim::workload::parse_trace(
        &std::fs::read_to_string(repo_root().join("sim/examples/trace.jsonl")).unwrap(),
    )
    .unwrap();
    let mut n = 0;
    for (line, a) in records.lines().zip(&trace.arrivals) {
        let r: Value = serde_json::from_str(line).unwrap();
        let expected = model.encode_completion(&a.prompt).unwrap().len();
        assert_eq!(r["prompt_tokens"].as_u64(), Some(expected as u64), "{line}");
        // Token blocks: the router knew the prompt's exact length.
        let d = r["decision"].as_str().unwrap();
        assert_eq!(pair(d, "pred_cached_tokens").1 as usize, expected, "{d}");
        n += 1;
    }
    assert_eq!(n, trace.arrivals.len());
}

// ---------------------------------------------------------------------------------------------
// The study (what sim/README.md says of it).

/// `kvroute-sim study ARGS --out DIR`: the table (without the timing line) and every request's
/// pod and reason.
fn study(args: &[&str], name: &str) -> (String, Vec<(String, String)>) {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    let out = bin()
        .arg("study")
        .args(args)
        .arg("--out")
        .arg(&dir)
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "study {args:?}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The study's table (the cached-tokens table after it holds the predictions, which differ).
    let table = stdout
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .collect::<Vec<_>>()
        .join("\n");
    let records = std::fs::read_to_string(dir.join("records.jsonl")).unwrap();
    let routed = records
        .lines()
        .map(|l| {
            let r: Value = serde_json::from_str(l).unwrap();
            (r["pod"].to_string(), r["reason"].to_string())
        })
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    (table, routed)
}

#[test]
fn token_blocks_route_the_study_as_text_blocks_do() {
    let (table, routed) = study(&[], "study-text-blocks");
    let rows = table
        .lines()
        .filter(|l| l.contains(" / ") && !l.starts_with("| scenario"));
    assert_eq!(rows.count(), 32, "{table}");
    assert_eq!(routed.len(), 32 * 96);
    let (tokens_table, tokens_routed) = study(&["--router-blocks", "tokens"], "study-token-blocks");
    assert_eq!(tokens_table, table);
    assert!(tokens_routed == routed, "a request went elsewhere");
}

#[test]
fn the_test_tokenizer_makes_the_study_prompt_about_7430_tokens() {
    use kvroute_sim::study::{run_phase, StudyConfig};
    use kvroute_sim::workload::Scenario;
    let cfg = StudyConfig {
        prompts: PromptReader::load(&fixture()).unwrap(),
        ..StudyConfig::default()
    };
    let p = run_phase(
        &cfg,
        Scenario::Warm { on_a: 4 },
        1,
        &StrategySpec::single(Strategy::LeastRequest),
    )
    .unwrap();
    let tokens: Vec<u32> = p
        .run
        .records
        .iter()
        .map(|r| r.prompt_tokens.unwrap())
        .collect();
    let (min, max) = (tokens.iter().min().unwrap(), tokens.iter().max().unwrap());
    assert!(*min >= 7_400 && *max <= 7_460, "{min}–{max}");
    // At most 4 blocks of 1,568 reused: the warm hit rate is 84%, not 93%.
    let hit = p.summary.token_hit.unwrap() * 100.0;
    assert!((84.0..85.0).contains(&hit), "{hit}");
    // Token blocks by default: the router knew each prompt's length.
    let d = p.run.records[0].decision.as_deref().unwrap();
    assert_eq!(pair(d, "pred_cached_tokens").1, tokens[0], "{d}");
}
