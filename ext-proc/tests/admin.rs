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
