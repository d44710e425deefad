//! The module inside a real Envoy 1.40: `libkvroute_envoy.so` loaded by the shipped template
//! (`envoy/envoy.module.template.yaml`), two `kvroute-sim serve` replicas, everything on
//! 127.0.0.1 with ports chosen at run time. The same requests, answers and releases as
//! kvroute-ext-proc's end-to-end suite (whose harness this includes). Run by `make test-e2e`.

#[path = "../../ext-proc/tests/support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kvroute_ext_proc::config::{ConfigSource, Overrides};
use kvroute_ext_proc::env::EnvSnapshot;
use kvroute_ext_proc::envoy_module_config::{render, FilterConfig, ModuleOptions, PodsCluster};
use support::*;

/// Envoy with the module, two replicas, and the module's admin address.
struct ModuleStack {
    envoy: Envoy,
    sims: Vec<Sim>,
    /// kvroute's admin listener, run by the module (`[listen] admin`).
    admin: String,
    dir: TempDir,
}

/// Where `libkvroute_envoy.so` is: built here first (`cargo test` builds the crate's rlib for
/// its tests, not always its cdylib), once per test binary, with kvroute-sim selected too so that
/// the build resolves the features `make test`'s other builds do (the root Makefile's
/// `CARGO_TEST`) and reuses theirs.
///
/// `KVROUTE_ENVOY_MODULE_DIR`, when set, names a directory with a module built elsewhere (the
/// AddressSanitizer build of `make test-module-asan`), used as it is.
fn module_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("KVROUTE_ENVOY_MODULE_DIR") {
        return PathBuf::from(dir);
    }
    static BUILT: std::sync::Once = std::sync::Once::new();
    BUILT.call_once(|| {
        support::cargo::build(&["kvroute-envoy", "kvroute-sim"]);
    });
    let dir = target_dir();
    assert!(
        dir.join("libkvroute_envoy.so").exists(),
        "no libkvroute_envoy.so in {}",
        dir.display()
    );
    dir
}

/// The shipped module template rendered for `config` (a TOML file), Envoy on free ports.
fn module_yaml(config: &Path, inline: bool) -> Vec<u8> {
    module_yaml_with(config, inline, PodsCluster::OriginalDst)
}

/// As [`module_yaml`], with the pods' cluster `pods`.
fn module_yaml_with(config: &Path, inline: bool, pods: PodsCluster) -> Vec<u8> {
    let source = ConfigSource {
        path: Some(config.to_path_buf()),
        env: EnvSnapshot::default(),
        overrides: Overrides::default(),
        process_seed: 1,
    };
    let loaded = source.load().expect("the test's kvroute config loads");
    let filter_config = if inline {
        FilterConfig::Inline(std::fs::read_to_string(config).unwrap())
    } else {
        FilterConfig::Path(config.display().to_string())
    };
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let opts = ModuleOptions {
        listen: any,
        admin: any,
        filter_config,
        pods,
    };
    render(&loaded, &opts).into_bytes()
}

/// Starts Envoy on `yaml` with the module's directory as its search path.
fn start_envoy(dir: &TempDir, yaml: &[u8]) -> Envoy {
    let modules = module_dir();
    Envoy::start_yaml_env(
        dir,
        yaml,
        &[("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", modules.as_path())],
    )
}

/// The module's admin address, from its start-up line in Envoy's log.
fn module_admin(dir: &TempDir) -> String {
    wait_for(Duration::from_secs(10), || {
        let log = std::fs::read_to_string(dir.path("envoy.log")).ok()?;
        let line = log.lines().find(|l| l.contains("kvroute module serving"))?;
        let admin = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("admin="))?;
        Some(admin.to_owned())
    })
    .unwrap_or_else(|| {
        panic!(
            "no start-up line from the module:\n{}",
            std::fs::read_to_string(dir.path("envoy.log")).unwrap_or_default()
        )
    })
}

impl ModuleStack {
    fn start(tag: &str, extra_config: &str, inline: bool) -> ModuleStack {
        let dir = TempDir::new(tag);
        let sims = vec![
            Sim::start(&dir, "replica-a", 5.0),
            Sim::start(&dir, "replica-b", 5.0),
        ];
        let config = dir.path("kvroute.toml");
        write_config(&config, &sims.iter().collect::<Vec<_>>(), extra_config);
        let envoy = start_envoy(&dir, &module_yaml(&config, inline));
        let admin = module_admin(&dir);
        ModuleStack {
            envoy,
            sims,
            admin,
            dir,
        }
    }

    fn post(&self, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
        http(&self.envoy.listen, "POST", path, headers, body)
    }

    fn metrics(&self) -> String {
        let r = http(&self.admin, "GET", "/metrics", &[], b"");
        assert_eq!(r.status, 200, "metrics: {}", r.text());
        r.text()
    }

    fn in_flight(&self) -> u64 {
        metric_sum(&self.metrics(), "kvroute_pod_in_flight{")
    }

    fn expect_in_flight(&self, n: u64) {
        if wait_for(Duration::from_secs(5), || {
            (self.in_flight() == n).then_some(())
        })
        .is_none()
        {
            panic!("in-flight never reached {n}:\n{}", self.metrics());
        }
    }
}

/// The replica that answered (`kvroute-sim` names itself in a header).
fn replica(r: &Resp) -> String {
    r.header("x-kvroute-sim-replica")
        .unwrap_or_else(|| panic!("no replica header: {r:?}"))
        .to_owned()
}

#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn requests_reach_the_chosen_pod_and_say_why() {
    let s = ModuleStack::start("module-route", "", true);
    let p = prompt("family-one", 1, 28_000);
    let first = s.post(
        "/v1/completions",
        &[("x-request-id", "rid-1")],
        &completion("study", &p, 4, false),
    );
    assert_eq!(first.status, 200, "{}", first.text());
    let pod = replica(&first);
    assert_eq!(first.header("target-pod"), Some(pod.as_str()));
    let addr = &s.sims.iter().find(|x| x.name == pod).unwrap().addr;
    assert_eq!(first.header("target-pod-ip"), Some(addr.as_str()));
    assert_eq!(first.header("routing-strategy"), Some("prefix-cache"));
    assert_eq!(first.header("request-id"), Some("rid-1"));
    let why = first.header("x-kvroute-decision").expect("decision header");
    assert!(why.contains(&format!("pod={pod}")), "{why}");

    // The same family follows its prefix.
    let again = s.post(
        "/v1/completions",
        &[],
        &completion("study", &prompt("family-one", 2, 28_000), 4, false),
    );
    assert_eq!(replica(&again), pod);
    let why = again.header("x-kvroute-decision").unwrap();
    assert!(why.contains("reason=prefix_match"), "{why}");

    // Streaming chat; the strategy header is honoured and echoed.
    let sse = s.post(
        "/v1/chat/completions",
        &[("routing-strategy", "least-request")],
        &chat("study", &prompt("family-two", 3, 2_000), 8, true),
    );
    assert_eq!(sse.status, 200);
    assert_eq!(sse.header("target-pod"), Some(replica(&sse).as_str()));
    assert_eq!(sse.header("routing-strategy"), Some("least-request"));
    assert!(sse.text().contains("data: [DONE]"), "{}", sse.text());

    // Without a body: routed on the request headers.
    let models = http(&s.envoy.listen, "GET", "/v1/models", &[], b"");
    assert_eq!(models.status, 200, "{}", models.text());
    assert_eq!(models.header("target-pod"), Some(replica(&models).as_str()));

    // A forged destination is not obeyed.
    let forged = s.post(
        "/v1/completions",
        &[
            ("x-gateway-destination-endpoint", "127.0.0.1:1"),
            ("target-pod", "127.0.0.1:1"),
        ],
        &completion("study", "hi", 2, false),
    );
    assert_eq!(forged.status, 200, "{}", forged.text());
    assert_eq!(forged.header("target-pod"), Some(replica(&forged).as_str()));

    // HTTP/2 with request trailers, and a chunked HTTP/1.1 body: routed on the whole body.
    let h2 = h2_post(
        &s.envoy.listen,
        "/v1/completions",
        &[("x-request-id", "rid-h2")],
        &completion("study", &prompt("family-h2", 1, 2_000), 2, false),
        &[("x-checksum", "abc")],
    );
    assert_eq!(h2.status, 200, "{}", h2.text());
    assert_eq!(h2.header("target-pod"), Some(replica(&h2).as_str()));
    let chunked = post_chunked(
        &s.envoy.listen,
        "/v1/completions",
        &completion("study", &prompt("family-one", 3, 28_000), 2, false),
    );
    assert_eq!(chunked.status, 200, "{}", chunked.text());
    assert_eq!(
        replica(&chunked),
        pod,
        "the chunked body was not read whole"
    );

    // Anything else: Envoy's 404, the module off.
    let other = http(&s.envoy.listen, "GET", "/nope", &[], b"");
    assert_eq!(other.status, 404);

    s.expect_in_flight(0);
    let m = s.metrics();
    assert!(
        metric_sum(
            &m,
            "aibrix_prefix_cache_routing_selection_total{model=\"study\",selection=\"prefix_match\""
        ) >= 2,
        "{m}"
    );
    assert_eq!(metric_sum(&m, "kvroute_tickets_completed_total"), 7, "{m}");
    assert_eq!(metric_sum(&m, "kvroute_ticket_release_errors_total"), 0);
    // The streamed chat's first token and usage were read in the module.
    assert!(metric_sum(&m, "kvroute_timed_responses_total") >= 1, "{m}");
}

#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn errors_return_aibrix_status_marker_and_body() {
    let s = ModuleStack::start("module-errors", "[limits]\nmax_body_bytes = 65536\n", false);
    errors::check_request_errors(&s.envoy.listen);
    s.expect_in_flight(0);
    let m = s.metrics();
    assert_eq!(metric_sum(&m, "kvroute_tickets_completed_total"), 0, "{m}");
}

#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn in_flight_returns_to_zero_after_every_outcome() {
    let mut s = ModuleStack::start("module-outcomes", "", false);
    // Client aborts mid-stream.
    for i in 0..3 {
        let body = completion("study", &prompt("abort", i, 4_000), 400, true);
        let got = abort_after(&s.envoy.listen, "/v1/completions", &[], &body, "data:");
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    }
    s.expect_in_flight(0);

    // Upstream answers 500: released, as failed.
    let r = s.post(
        "/v1/completions",
        &[("x-sim-status", "500")],
        &completion("study", "boom", 2, false),
    );
    assert_eq!(r.status, 500);
    s.expect_in_flight(0);
    let failed = "kvroute_tickets_completed_total{outcome=\"failed\"";
    assert!(metric_sum(&s.metrics(), failed) >= 1, "{}", s.metrics());

    // A stream held open counts, then not.
    let listen = s.envoy.listen.clone();
    let long = completion("study", &prompt("long", 1, 4_000), 400, true);
    let held = std::thread::spawn(move || http(&listen, "POST", "/v1/completions", &[], &long));
    wait_for(Duration::from_secs(5), || {
        (s.in_flight() == 1).then_some(())
    })
    .expect("stream not counted");
    assert_eq!(held.join().unwrap().status, 200);
    s.expect_in_flight(0);

    // A replica killed: what is sent to it fails and releases too.
    s.sims[1].proc.kill();
    for i in 0..6 {
        let r = s.post(
            "/v1/completions",
            &[("routing-strategy", "random")],
            &completion("study", &format!("after {i}"), 2, false),
        );
        assert!(r.status == 200 || r.status == 503, "{}", r.status);
    }
    s.expect_in_flight(0);
    let m = s.metrics();
    assert_eq!(metric_sum(&m, "kvroute_tickets_open"), 0, "{m}");
    assert_eq!(metric_sum(&m, "kvroute_ticket_release_errors_total"), 0);
    assert!(
        metric_sum(&m, "kvroute_tickets_completed_total") >= 11,
        "{m}"
    );
}

/// A data-parallel server (`kvroute-sim serve --data-parallel-size 2`: two engines behind one
/// address) as one pod with `data_parallel_size = 2`: the module routes to engines, and the
/// `x-data-parallel-rank` header it sets upstream brings each request to the engine it chose.
#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn a_data_parallel_server_is_routed_engine_by_engine() {
    let dir = TempDir::new("module-dp");
    let server = Sim::start_args(&dir, "dp", 5.0, 0, &["--data-parallel-size", "2"]);
    let config = dir.path("kvroute.toml");
    std::fs::write(
        &config,
        format!(
            "[listen]\nadmin = \"127.0.0.1:0\"\n[routing]\nseed = 1\n\
             [models.study]\npods = [{{ name = \"dp\", address = \"{}\", data_parallel_size = 2 }}]\n",
            server.addr
        ),
    )
    .unwrap();
    let envoy = start_envoy(&dir, &module_yaml(&config, false));
    let admin = module_admin(&dir);
    let metrics = || http(&admin, "GET", "/metrics", &[], b"").text();
    let post = |headers: &[(&str, &str)], body: &[u8]| {
        let r = http(&envoy.listen, "POST", "/v1/completions", headers, body);
        assert_eq!(r.status, 200, "{}", r.text());
        let pod = r.header("target-pod").unwrap_or_default().to_owned();
        let rank = r.header("x-kvroute-sim-rank").unwrap_or_default();
        assert_eq!(
            pod,
            format!("dp/dp{rank}"),
            "served by another engine than chosen"
        );
        assert_eq!(r.header("target-pod-ip"), Some(server.addr.as_str()));
        pod
    };
    // Each family stays on the engine its first request went to.
    let mut first = std::collections::BTreeMap::new();
    for q in 0..6 {
        let family = ["family-a", "family-b"][q % 2];
        let pod = post(
            &[],
            &completion("study", &prompt(family, q as u32, 8_000), 2, false),
        );
        assert_eq!(
            *first.entry(family).or_insert_with(|| pod.clone()),
            pod,
            "{family} moved"
        );
    }
    // With one engine busy, least-request picks the other: both engines are reached.
    let listen = envoy.listen.clone();
    let long = completion("study", &prompt("long", 1, 2_000), 400, true);
    let held = std::thread::spawn(move || http(&listen, "POST", "/v1/completions", &[], &long));
    let busy = wait_for(Duration::from_secs(5), || {
        let m = metrics();
        ["dp/dp0", "dp/dp1"]
            .into_iter()
            .find(|p| metric_sum(&m, &format!("kvroute_pod_in_flight{{pod=\"{p}\"")) == 1)
    })
    .expect("the stream is counted on one engine");
    let other = post(
        &[("routing-strategy", "least-request")],
        &completion("study", "hi", 2, false),
    );
    assert_ne!(other, busy);
    let held = held.join().unwrap();
    assert_eq!(
        held.header("x-kvroute-sim-rank"),
        busy.strip_prefix("dp/dp")
    );
    wait_for(Duration::from_secs(5), || {
        (metric_sum(&metrics(), "kvroute_pod_in_flight{") == 0).then_some(())
    })
    .expect("in-flight back to 0");
}

/// The rendered template validates with the module loaded; a configuration the module cannot
/// load is refused by Envoy at start, with kvroute's reason in Envoy's log.
#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn the_template_validates_and_a_bad_configuration_fails_envoy_at_load() {
    let dir = TempDir::new("module-bad");
    let config = dir.path("kvroute.toml");
    std::fs::write(
        &config,
        "[listen]\nadmin = \"127.0.0.1:0\"\n[models.study]\npods = [{ name = \"a\", address = \"127.0.0.1:9\" }]\n",
    )
    .unwrap();
    let yaml = String::from_utf8(module_yaml(&config, true)).unwrap();
    let validate = |yaml: &str| {
        std::fs::write(dir.path("envoy.yaml"), yaml).unwrap();
        let out = std::process::Command::new(envoy_bin())
            .env("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", module_dir())
            .args(["--mode", "validate", "-c"])
            .arg(dir.path("envoy.yaml"))
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stderr).into_owned()
            + &String::from_utf8_lossy(&out.stdout);
        (out.status.success(), log)
    };
    // The shipped template as rendered: valid, the module loaded.
    let (ok, log) = validate(&yaml);
    assert!(ok, "{log}");
    assert!(log.contains("kvroute module serving"), "{log}");
    let broken = yaml.replace("[models.study]", "[models.study");
    assert_ne!(yaml, broken);
    let (ok, log) = validate(&broken);
    assert!(!ok, "{log}");
    assert!(
        log.contains("kvroute filter \"kvroute\": kvroute configuration"),
        "{log}"
    );
}

/// Issue 6's evidence, with kvroute inside Envoy: least-ttft learns from the responses it
/// reads in the module (every streamed response) and meets the SLO for more of hot50's
/// requests than prefix-cache.
#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn hot50_in_envoy_least_ttft_meets_slo_more_than_prefix_cache() {
    let s = ModuleStack::start("module-hot50", hot50::CONFIG, false);
    hot50::replay_and_check(&s.envoy.listen, &s.sims, &s.admin);
    s.expect_in_flight(0);
}

/// A filter configuration given by path is reloaded when the file changes (kvroute-ext-proc's
/// rules: a file that does not load is refused and the running configuration kept).
#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn a_configuration_file_is_reloaded_when_it_changes() {
    let s = ModuleStack::start("module-reload", "", false);
    let strategy = |s: &ModuleStack| {
        let r = s.post("/v1/completions", &[], &completion("study", "x", 1, false));
        assert_eq!(r.status, 200, "{}", r.text());
        r.header("routing-strategy").unwrap_or_default().to_owned()
    };
    assert_eq!(strategy(&s), "prefix-cache");
    let config = s.dir.path("kvroute.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    let reloads = |s: &ModuleStack, result: &str| {
        metric_sum(
            &s.metrics(),
            &format!("kvroute_config_reloads_total{{result=\"{result}\"}}"),
        )
    };
    // Broken: refused, the running configuration kept.
    std::fs::write(&config, text.replace("[models.study]", "[models.study")).unwrap();
    wait_for(Duration::from_secs(10), || {
        (reloads(&s, "error") >= 1).then_some(())
    })
    .expect("the broken file was not noticed");
    assert_eq!(strategy(&s), "prefix-cache");
    // A new default strategy: applied.
    let changed = text.replace(
        "[routing]\n",
        "[routing]\ndefault_strategy = \"least-request\"\n",
    );
    assert_ne!(changed, text);
    std::fs::write(&config, changed).unwrap();
    wait_for(Duration::from_secs(10), || {
        (strategy(&s) == "least-request").then_some(())
    })
    .expect("the new default strategy was not applied");
    assert!(reloads(&s, "ok") >= 1);
    s.expect_in_flight(0);
}

/// `[discovery] source = "envoy"`: the pods are the cluster's hosts (here static), and Envoy's
/// active health checks decide which kvroute may pick. kvroute's own checks and ejections are
/// off, so only Envoy's knowledge can take a pod out.
#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn envoy_fleet_hosts_and_health_checks_decide_the_pods() {
    let dir = TempDir::new("module-fleet");
    let sims = [
        Sim::start(&dir, "replica-a", 5.0),
        Sim::start(&dir, "replica-b", 5.0),
    ];
    let config = dir.path("kvroute.toml");
    std::fs::write(
        &config,
        "[listen]\ngrpc = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n[routing]\nseed = 1\n\
         [engine_metrics]\nscrape_interval_ms = 0\n\
         [health]\ncheck_interval_ms = 0\nconsecutive_5xx = 0\nconsecutive_gateway_failures = 0\n\
         [discovery]\nsource = \"envoy\"\n[discovery.envoy]\nmodel = \"study\"\n",
    )
    .unwrap();
    let addrs: Vec<SocketAddr> = sims.iter().map(|s| s.addr.parse().unwrap()).collect();
    let yaml = module_yaml_with(&config, false, PodsCluster::Static(addrs));
    let envoy = start_envoy(&dir, &yaml);
    let admin = module_admin(&dir);
    let metrics = || http(&admin, "GET", "/metrics", &[], b"").text();
    let pods = |state: &str| {
        metric_sum(
            &metrics(),
            &format!("kvroute_discovery_pods{{model=\"study\",state=\"{state}\"}}"),
        )
    };
    let both = wait_for(Duration::from_secs(15), || {
        (pods("ready") == 2).then_some(())
    });
    assert!(
        both.is_some(),
        "Envoy's hosts never became pods:\n{}",
        metrics()
    );

    // Requests reach the pod kvroute named (pods are named by address).
    let mut seen = std::collections::BTreeSet::new();
    for q in 0..6 {
        let body = completion("study", &prompt(&format!("fleet-{q}"), q, 600), 2, false);
        let r = http(&envoy.listen, "POST", "/v1/completions", &[], &body);
        assert_eq!(r.status, 200, "{}", r.text());
        let target = r.header("target-pod").unwrap().to_owned();
        let sim = sims.iter().find(|s| s.addr == target).expect("a known pod");
        assert_eq!(replica(&r), sim.name, "sent where kvroute decided");
        seen.insert(target);
    }
    let models = http(&envoy.listen, "GET", "/v1/models", &[], b"");
    assert_eq!(models.status, 200, "{}", models.text());

    // replica-b fails Envoy's health checks: Envoy takes it out, and so does kvroute.
    let fault = r#"{"status": 503, "health": true}"#;
    let r = http(&sims[1].addr, "POST", "/fault", &[], fault.as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
    let out = wait_for(Duration::from_secs(15), || {
        (pods("unready") == 1).then_some(())
    });
    assert!(
        out.is_some(),
        "Envoy's health never reached kvroute:\n{}\n{}",
        http(&envoy.admin, "GET", "/stats?filter=health_check", &[], b"").text(),
        metrics()
    );
    for q in 0..6 {
        let body = completion(
            "study",
            &prompt(&format!("fleet-{q}"), q + 10, 600),
            2,
            false,
        );
        let r = http(&envoy.listen, "POST", "/v1/completions", &[], &body);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(replica(&r), "replica-a");
    }
    // Back in when it passes again.
    let r = http(&sims[1].addr, "DELETE", "/fault", &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let back = wait_for(Duration::from_secs(15), || {
        (pods("ready") == 2).then_some(())
    });
    assert!(back.is_some(), "never back:\n{}", metrics());
    let idle = wait_for(Duration::from_secs(5), || {
        (metric_sum(&metrics(), "kvroute_pod_in_flight{") == 0).then_some(())
    });
    assert!(idle.is_some(), "{}", metrics());
    println!("pods used before the fault: {seen:?}");
}
