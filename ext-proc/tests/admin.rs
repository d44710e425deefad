//! The admin port of the real binary: introspection JSON and the process metrics.

mod support;

use support::*;

#[test]
fn the_admin_port_says_what_the_router_holds() {
    let dir = TempDir::new("admin");
    let config = dir.path("kvroute.toml");
    std::fs::write(
        &config,
        "[listen]\ngrpc = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n[engine_metrics]\nscrape_interval_ms = 0\n[health]\ncheck_interval_ms = 0\nconsecutive_5xx = 7\n[models.study]\npods = [{ name = \"a\", address = \"127.0.0.1:9\" }, { name = \"b\", address = \"127.0.0.1:10\", max_seqs = 4 }]\n",
    )
    .unwrap();
    let ext = ExtProc::start(&dir, &config, None);
    let get = |path: &str| {
        let r = http(&ext.admin, "GET", path, &[], b"");
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert_eq!(r.header("content-type"), Some("application/json"));
        r.json()
    };
    let pods = get("/debug/pods");
    let names: Vec<&str> = pods
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(pods[1]["learned"]["max_seqs"], 4);
    assert_eq!(pods[0]["health"]["ejected"], false);
    assert_eq!(pods[0]["in_flight"], 0);
    let config = get("/debug/config");
    assert_eq!(config["models"]["study"][1]["address"], "127.0.0.1:10");
    assert!(config["health"]
        .as_str()
        .unwrap()
        .contains("consecutive_5xx: 7"));
    assert_eq!(get("/debug/decisions"), serde_json::json!([]));
    let metrics = ext.metrics();
    for name in [
        "kvroute_build_info{version=",
        "process_cpu_seconds_total ",
        "process_open_fds ",
    ] {
        assert!(metrics.contains(name), "{name} missing");
    }
    let log = std::fs::read_to_string(&ext.log).unwrap();
    let loaded = log
        .lines()
        .find(|l| l.contains("configuration loaded"))
        .unwrap_or_else(|| panic!("no start-up line in\n{log}"));
    assert!(
        loaded.contains("a=127.0.0.1:9") && loaded.contains("kvroute.toml"),
        "{loaded}"
    );
}

/// The KV block size each engine reports (`vllm:cache_config_info`, from real `kvroute-sim
/// serve` replicas): taken as `[ttft] engine_block_tokens` when the configuration leaves it
/// unset and the engines agree, warned about when they differ or the configuration pins
/// another, each said once however many scrapes see it.
#[test]
fn the_engines_block_size_is_taken_when_unset_and_warned_about_otherwise() {
    let dir = TempDir::new("engine-block");
    let sim = |name: &str, block: &str| {
        Sim::start_args(
            &dir,
            name,
            50.0,
            0,
            &["--block-size", block, "--kv-blocks", "1024"],
        )
    };
    let (a, b, c) = (sim("a", "64"), sim("b", "64"), sim("c", "32"));
    // kvroute-ext-proc over `pods` with `ttft`; once every pod's block size is exported, ten
    // more scrape intervals (several more scrapes); then its metrics text and its log.
    let run = |tag: &str, ttft: &str, pods: &[&Sim]| {
        let entries: Vec<String> = pods
            .iter()
            .map(|p| format!("{{ name = \"{}\", address = \"{}\" }}", p.name, p.addr))
            .collect();
        let config = dir.path(&format!("{tag}.toml"));
        let text = format!(
            "[listen]\ngrpc = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\
             [engine_metrics]\nscrape_interval_ms = 50\n{ttft}\n\
             [models.study]\npods = [{}]\n",
            entries.join(", ")
        );
        std::fs::write(&config, text).unwrap();
        let ext = ExtProc::start(&dir, &config, None);
        let seen = |m: &str| {
            pods.iter().all(|p| {
                m.contains(&format!(
                    "kvroute_engine_block_tokens{{pod=\"{}\"}}",
                    p.name
                ))
            })
        };
        wait_for(std::time::Duration::from_secs(10), || {
            Some(ext.metrics()).filter(|m| seen(m))
        })
        .unwrap_or_else(|| panic!("not scraped:\n{}", ext.metrics()));
        std::thread::sleep(std::time::Duration::from_millis(500));
        let (m, log) = (ext.metrics(), std::fs::read_to_string(&ext.log).unwrap());
        (ext, m, log)
    };
    let lines = |log: &str, what: &str| log.lines().filter(|l| l.contains(what)).count();

    // Unset, and the engines agree: taken, once.
    let (agree, m, log) = run("agree", "", &[&a, &b]);
    assert_eq!(metric_sum(&m, "kvroute_engine_block_tokens{pod=\"a\"}"), 64);
    assert_eq!(metric_sum(&m, "kvroute_ttft_engine_block_tokens "), 64);
    assert_eq!(lines(&log, "takes the engines' KV block size"), 1, "{log}");
    assert_eq!(lines(&log, "engine_block_tokens=64 was=16"), 1, "{log}");
    let pods = http(&agree.admin, "GET", "/debug/pods", &[], b"").json();
    assert_eq!(pods[0]["engine"]["block_tokens"], 64);

    // Unset, and the engines differ: the default stays, one warning.
    let (_differ, m, log) = run("differ", "", &[&a, &c]);
    assert_eq!(metric_sum(&m, "kvroute_engine_block_tokens{pod=\"c\"}"), 32);
    assert_eq!(metric_sum(&m, "kvroute_ttft_engine_block_tokens "), 16);
    assert_eq!(lines(&log, "report different KV block sizes"), 1, "{log}");
    assert_eq!(lines(&log, "takes the engines'"), 0, "{log}");

    // Pinned to another value: kept, one warning per pod.
    let (_pinned, m, log) = run("pinned", "[ttft]\nengine_block_tokens = 16", &[&a, &b]);
    assert_eq!(metric_sum(&m, "kvroute_ttft_engine_block_tokens "), 16);
    for pod in ["a", "b"] {
        let warned = log
            .lines()
            .filter(|l| l.contains("other than [ttft] engine_block_tokens"))
            .filter(|l| l.contains(&format!("pod={pod} ")))
            .count();
        assert_eq!(warned, 1, "{pod}:\n{log}");
    }
}
