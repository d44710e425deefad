//! A data-parallel server behind Envoy and kvroute-ext-proc: one `kvroute-sim serve
//! --data-parallel-size 2` (two engines behind one address, each with its own cache, metrics
//! series and KV-event sockets on the base ports + rank, as vLLM's) configured as one pod
//! with `data_parallel_size = 2`. kvroute routes to the engine that holds a prefix, the
//! request reaches that engine through `x-data-parallel-rank`, each engine has its own view
//! and its own scraped numbers.
//!
//! Run by `make test-e2e` (needs Envoy).

mod support;

use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;

use support::kv_events::{expect_engine_match, tokenizer_fixture};
use support::*;

/// A port P with P..P+n all free just now (the server binds them right after).
fn consecutive_free_ports(n: u16) -> u16 {
    for _ in 0..100 {
        let first = TcpListener::bind("127.0.0.1:0").unwrap();
        let p = first.local_addr().unwrap().port();
        let rest: Vec<_> = (1..n)
            .map_while(|i| TcpListener::bind(("127.0.0.1", p.checked_add(i)?)).ok())
            .collect();
        if rest.len() == usize::from(n - 1) {
            return p;
        }
    }
    panic!("no {n} consecutive free ports");
}

/// The server, and its two ranks' publisher endpoints as it printed them.
fn start_server(dir: &TempDir, events: u16, replay: u16) -> (Sim, Vec<String>) {
    let mut cmd = Command::new(sim_bin());
    cmd.args(["serve", "--host", "127.0.0.1", "--port", "0"]);
    cmd.args(["--name", "dp", "--model", "study", "--speedup", "5"]);
    cmd.args(["--data-parallel-size", "2"]);
    // vLLM's default block size (the simulator's own default is the study's 1,568 tokens).
    cmd.args(["--block-size", "16", "--kv-blocks", "8192"]);
    cmd.arg("--tokenizer").arg(tokenizer_fixture());
    cmd.arg("--kv-events-endpoint")
        .arg(format!("tcp://127.0.0.1:{events}"));
    cmd.arg("--kv-events-replay-endpoint")
        .arg(format!("tcp://127.0.0.1:{replay}"));
    let (proc, lines) = spawn_and_collect("dp", cmd, &dir.path("dp.log"), " rank 1");
    let addr = lines[0]
        .trim()
        .trim_start_matches("listening on ")
        .to_owned();
    let endpoints = lines[1..].iter().map(|l| l.trim().to_owned()).collect();
    (
        Sim {
            proc,
            name: "dp".into(),
            addr,
        },
        endpoints,
    )
}

fn value(text: &str, series: &str) -> f64 {
    let prefix = format!("{series} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
        .unwrap_or(f64::NAN)
}

/// The server's own `vllm:prefix_cache_queries` of engine `rank`.
fn engine_queries(server: &str, rank: u32) -> f64 {
    let text = http(server, "GET", "/metrics", &[], b"").text();
    let label = format!("engine=\"{rank}\"");
    text.lines()
        .filter(|l| l.starts_with("vllm:prefix_cache_queries") && !l.contains("_created"))
        .find(|l| l.contains(&label))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn a_data_parallel_server_is_routed_engine_by_engine() {
    let dir = TempDir::new("data-parallel");
    let (events, replay) = (consecutive_free_ports(2), consecutive_free_ports(2));
    let (server, endpoints) = start_server(&dir, events, replay);
    // The server bound what vLLM's ranks bind: the base ports + rank.
    for (rank, line) in endpoints.iter().enumerate() {
        let r = rank as u16;
        assert_eq!(
            line,
            &format!(
                "kv-events on tcp://127.0.0.1:{} replay tcp://127.0.0.1:{} rank {rank}",
                events + r,
                replay + r
            )
        );
    }
    let config = dir.path("kvroute.toml");
    std::fs::write(
        &config,
        format!(
            "[listen]\ngrpc = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\
             [routing]\nseed = 1\ndefault_strategy = \"prefix-cache\"\n\
             [engine_metrics]\nscrape_interval_ms = 200\n\
             [tokenizers.study]\npath = {:?}\n\
             [kv_events.study]\nendpoint = \"tcp://{{host}}:{events}\"\nreplay_endpoint = \"tcp://{{host}}:{replay}\"\n\
             [models.study]\npods = [{{ name = \"dp\", address = \"{}\", data_parallel_size = 2 }}]\n",
            tokenizer_fixture(),
            server.addr
        ),
    )
    .unwrap();
    let ext = ExtProc::start(&dir, &config, None);
    let envoy = Envoy::start(&dir, &config, &ext.grpc, true);
    let ranks = ["dp/dp0", "dp/dp1"];

    // Each engine has a view of its own, from its own publisher: reset the (empty) caches
    // until both are complete.
    let synced = wait_for(Duration::from_secs(20), || {
        let r = http(&server.addr, "POST", "/reset_prefix_cache", &[], b"");
        assert_eq!(r.status, 200, "{}", r.text());
        std::thread::sleep(Duration::from_millis(100));
        let m = ext.metrics();
        ranks
            .iter()
            .all(|p| {
                value(
                    &m,
                    &format!("kvroute_kv_view_state{{pod=\"{p}\",state=\"engine\"}}"),
                ) == 1.0
            })
            .then_some(())
    });
    assert!(synced.is_some(), "views never complete:\n{}", ext.metrics());

    // Another gateway placed family A on engine 1 (twice: the engines' counters differ) and
    // family B on engine 0 of the server.
    let long = 6_000;
    for (rank, family, q) in [
        ("1", "family-a", 0),
        ("1", "family-a", 100),
        ("0", "family-b", 0),
    ] {
        let r = http(
            &server.addr,
            "POST",
            "/v1/completions",
            &[("x-data-parallel-rank", rank)],
            &completion("study", &prompt(family, q, long), 2, false),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-kvroute-sim-rank"), Some(rank));
    }
    let blocks = |pod: &str| {
        value(
            &ext.metrics(),
            &format!("kvroute_kv_view_blocks{{pod=\"{pod}\"}}"),
        )
    };
    let seen = wait_for(Duration::from_secs(10), || {
        ranks.iter().all(|p| blocks(p) >= 50.0).then_some(())
    });
    assert!(seen.is_some(), "events not applied:\n{}", ext.metrics());

    // Through Envoy each family goes to the engine holding it: the decision names the rank's
    // pod, and the server says that engine served it (the rank header reached it).
    for q in 1..=6 {
        let (family, pod, rank) = if q % 2 == 0 {
            ("family-a", "dp/dp1", "1")
        } else {
            ("family-b", "dp/dp0", "0")
        };
        let r = expect_engine_match(&envoy.listen, family, q, long, pod);
        assert_eq!(r.header("target-pod-ip"), Some(server.addr.as_str()));
        assert_eq!(r.header("x-kvroute-sim-rank"), Some(rank));
    }

    // One scrape of the address, each engine's own series: kvroute's numbers per rank are the
    // server's per engine once everything has ended.
    let same = wait_for(Duration::from_secs(10), || {
        let m = ext.metrics();
        (0..2)
            .all(|r| {
                let ours = value(
                    &m,
                    &format!("kvroute_engine_prefix_cache_queries_total{{pod=\"dp/dp{r}\"}}"),
                );
                ours > 0.0 && ours == engine_queries(&server.addr, r)
            })
            .then_some(())
    });
    assert!(
        same.is_some(),
        "per-engine numbers differ:\n{}\nserver: {} {}",
        ext.metrics(),
        engine_queries(&server.addr, 0),
        engine_queries(&server.addr, 1)
    );
    assert_eq!(
        metric_sum(&ext.metrics(), "kvroute_engine_scrape_errors_total{"),
        0
    );
    wait_for(Duration::from_secs(5), || {
        (ext.in_flight() == 0).then_some(())
    })
    .expect("in-flight back to 0");
}
