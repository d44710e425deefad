//! Two kvroute-ext-proc replicas behind one Envoy, both subscribed to the KV events of the
//! same two `kvroute-sim serve` engines: they hold the same engine views, so they agree on
//! where a prefix is cached, even for prompts neither of them routed.
//!
//! Run by `make test-e2e` (needs Envoy).

mod support;

use std::time::Duration;

use support::kv_events::{expect_engine_match, tokenizer_fixture, PublishingSim};
use support::*;

fn config(dir: &TempDir, sims: &[&PublishingSim]) -> std::path::PathBuf {
    let pods: Vec<String> = sims
        .iter()
        .map(|p| {
            format!(
                "{{ name = \"{}\", address = \"{}\", kv_events_endpoint = \"{}\", kv_events_replay_endpoint = \"{}\" }}",
                p.sim.name, p.sim.addr, p.events, p.replay
            )
        })
        .collect();
    let text = format!(
        "[listen]\ngrpc = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\
         [routing]\nseed = 1\ndefault_strategy = \"prefix-cache\"\n\
         [tokenizers.study]\npath = {:?}\n\
         [kv_events.study]\nendpoint = \"tcp://{{host}}:5557\"\n\
         [models.study]\npods = [{}]\n",
        tokenizer_fixture(),
        pods.join(", ")
    );
    let path = dir.path("kvroute.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// The shipped Envoy configuration with a second kvroute-ext-proc endpoint in its ext_proc
/// cluster (Envoy balances the per-request gRPC streams over both).
fn two_ext_procs(yaml: Vec<u8>, first: &str, second: &str) -> Vec<u8> {
    let text = String::from_utf8(yaml).unwrap();
    let port = |a: &str| a.rsplit(':').next().unwrap().to_owned();
    let needle = format!("port_value: {} }}", port(first));
    let mut out = String::new();
    let mut added = false;
    for line in text.lines() {
        out.push_str(line);
        out.push('\n');
        if !added && line.contains("- endpoint:") && line.contains(&needle) {
            out.push_str(&line.replace(&needle, &format!("port_value: {} }}", port(second))));
            out.push('\n');
            added = true;
        }
    }
    assert!(added, "no ext_proc endpoint line in\n{text}");
    out.into_bytes()
}

fn value(ext: &ExtProc, series: &str) -> f64 {
    let prefix = format!("{series} ");
    ext.metrics()
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
        .unwrap_or(f64::NAN)
}

fn blocks(ext: &ExtProc, pod: &str) -> f64 {
    value(ext, &format!("kvroute_kv_view_blocks{{pod=\"{pod}\"}}"))
}

fn state_is(ext: &ExtProc, pod: &str, state: &str) -> bool {
    value(
        ext,
        &format!("kvroute_kv_view_state{{pod=\"{pod}\",state=\"{state}\"}}"),
    ) == 1.0
}

#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn two_router_replicas_share_the_engines_view() {
    let dir = TempDir::new("kv-replicas");
    // vLLM's default block size (the simulator's own default is the study's 1,568 tokens).
    let engine = ["--block-size", "16", "--kv-blocks", "8192"];
    let a = PublishingSim::start(&dir, "replica-a", 5.0, &engine);
    let b = PublishingSim::start(&dir, "replica-b", 5.0, &engine);
    let config = config(&dir, &[&a, &b]);
    let exts = [
        ExtProc::start(&dir, &config, None),
        ExtProc::start(&dir, &config, None),
    ];
    let yaml = two_ext_procs(
        render_envoy_config(&config, &exts[0].grpc, true),
        &exts[0].grpc,
        &exts[1].grpc,
    );
    let envoy = Envoy::start_yaml(&dir, &yaml);

    // Every replica subscribed to both engines. A subscription only receives what is
    // published after it reached the publisher: reset the (empty) caches until both replicas
    // have a complete view of both engines.
    let synced = wait_for(Duration::from_secs(20), || {
        for sim in [&a, &b] {
            let r = http(&sim.sim.addr, "POST", "/reset_prefix_cache", &[], b"");
            assert_eq!(r.status, 200, "{}", r.text());
        }
        std::thread::sleep(Duration::from_millis(100));
        exts.iter()
            .all(|e| {
                ["replica-a", "replica-b"]
                    .iter()
                    .all(|p| state_is(e, p, "engine"))
            })
            .then_some(())
    });
    assert!(
        synced.is_some(),
        "views never complete:\n{}",
        exts[0].metrics()
    );

    // Family A reaches replica-a's engine and family B replica-b's without any router:
    // another gateway sent them. Only the engines' events can tell the routers.
    let long = 6_000;
    for (sim, family) in [(&a, "family-a"), (&b, "family-b")] {
        let r = http(
            &sim.sim.addr,
            "POST",
            "/v1/completions",
            &[],
            &completion("study", &prompt(family, 0, long), 2, false),
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let seen = wait_for(Duration::from_secs(10), || {
        exts.iter()
            .all(|e| blocks(e, "replica-a") >= 50.0 && blocks(e, "replica-b") >= 50.0)
            .then_some(())
    });
    assert!(seen.is_some(), "events not applied:\n{}", exts[0].metrics());

    // Through Envoy: whichever replica takes a request, each family goes to the engine that
    // holds it, and the decision says the engine view answered.
    for q in 1..=8 {
        let family = if q % 2 == 0 { "family-a" } else { "family-b" };
        let want = if q % 2 == 0 { "replica-a" } else { "replica-b" };
        expect_engine_match(&envoy.listen, family, q, long, want);
    }
    // Both router replicas took requests, and both end with the same views.
    for e in &exts {
        let routed = metric_sum(&e.metrics(), "kvroute_pod_routed_total{");
        assert!(routed > 0, "a replica routed nothing:\n{}", e.metrics());
    }
    let same = wait_for(Duration::from_secs(10), || {
        ["replica-a", "replica-b"]
            .iter()
            .all(|p| blocks(&exts[0], p) == blocks(&exts[1], p))
            .then_some(())
    });
    assert!(
        same.is_some(),
        "views differ:\n{}\n{}",
        exts[0].metrics(),
        exts[1].metrics()
    );
    for e in &exts {
        wait_for(Duration::from_secs(5), || {
            (e.in_flight() == 0).then_some(())
        })
        .expect("in-flight back to 0");
    }
}

/// The study's hot50 through Envoy with requests keyed by token blocks (the fixture tokenizer,
/// which the engines use too), the engines' block size (1,568), and, with `events`, each pod
/// matched against its engine's KV events. The same bar as the byte-block run (`e2e.rs`):
/// least-ttft keeps more requests within the SLO than prefix-cache.
///
/// Measurements, not part of `make test`: on this 2-core machine, with other builds running,
/// least-ttft's within-SLO count varied from 26 to 62 of 96 between runs of the same variant
/// (the fixture tokenizer makes prompts about 7,400 tokens, half again the study's, so the
/// fleet runs near saturation), and once came within one request of prefix-cache: too close
/// for a test's bar.
fn hot50_token_blocks(events: bool) {
    let dir = TempDir::new(if events {
        "hot50-events"
    } else {
        "hot50-tokens"
    });
    let a = PublishingSim::start(&dir, "replica-a", 5.0, &[]);
    let b = PublishingSim::start(&dir, "replica-b", 5.0, &[]);
    let mut text = format!(
        "[listen]\ngrpc = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n[routing]\nseed = 1\n{}\
         [tokenizers.study]\npath = {:?}\nblock_tokens = 1568\n",
        hot50::CONFIG,
        tokenizer_fixture()
    );
    let pod = |p: &PublishingSim| {
        let own = if events {
            format!(
                ", kv_events_endpoint = \"{}\", kv_events_replay_endpoint = \"{}\"",
                p.events, p.replay
            )
        } else {
            String::new()
        };
        format!(
            "{{ name = \"{}\", address = \"{}\"{own} }}",
            p.sim.name, p.sim.addr
        )
    };
    if events {
        text.push_str("[kv_events.study]\nendpoint = \"tcp://{host}:5557\"\n");
    }
    text.push_str(&format!(
        "[models.study]\npods = [{}, {}]\n",
        pod(&a),
        pod(&b)
    ));
    let config = dir.path("kvroute.toml");
    std::fs::write(&config, text).unwrap();
    let ext = ExtProc::start(&dir, &config, None);
    let envoy = Envoy::start(&dir, &config, &ext.grpc, true);
    if events {
        // A complete view of both engines before the run (see the agreement test).
        let synced = wait_for(Duration::from_secs(20), || {
            for sim in [&a, &b] {
                http(&sim.sim.addr, "POST", "/reset_prefix_cache", &[], b"");
            }
            std::thread::sleep(Duration::from_millis(100));
            ["replica-a", "replica-b"]
                .iter()
                .all(|p| state_is(&ext, p, "engine"))
                .then_some(())
        });
        assert!(synced.is_some(), "views never complete:\n{}", ext.metrics());
    }
    let sims = vec![a.sim, b.sim];
    hot50::replay_and_check(&envoy.listen, &sims, &ext.admin);
    let m = ext.metrics();
    for p in ["replica-a", "replica-b"] {
        let stored = value(
            &ext,
            &format!("kvroute_kv_view_blocks_stored_total{{pod=\"{p}\"}}"),
        );
        let state = ["engine", "suspended", "stale", "none"]
            .into_iter()
            .find(|s| state_is(&ext, p, s));
        println!("{p}: view {state:?}, blocks stored {stored}");
        if events {
            assert_eq!(state, Some("engine"), "{m}");
            assert!(stored > 0.0, "{m}");
        }
    }
}

#[test]
#[ignore = "needs Envoy; a measurement"]
fn hot50_token_blocks_with_kv_events() {
    hot50_token_blocks(true);
}

/// The same without events: the baseline for the closing note (not in `make test`).
#[test]
#[ignore = "needs Envoy; a measurement"]
fn hot50_token_blocks_router_side_index() {
    hot50_token_blocks(false);
}
