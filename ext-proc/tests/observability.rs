//! The Grafana dashboard and Prometheus rules in `deploy/observability` against a real
//! Prometheus: it scrapes (every second) the real `kvroute-ext-proc` of a `support::Stack` (two
//! `kvroute-sim serve` replicas behind a real Envoy), a second `kvroute-ext-proc` that discovers
//! pods from a fake Kubernetes API (`support::k8s`), and the two replicas' own `/metrics`, and
//! loads the rules. After a bounded load (three strategies, rejections, configuration reloads,
//! a replica that answers 500 until it is ejected and then fails its metrics scrapes), every
//! query of every dashboard panel must return data, with the template variables set to "All"
//! and to concrete values; the variables' own queries must list those values; every rule must
//! evaluate without error and every recording rule must have data; and the alerts that the run
//! provokes must be pending or firing with the labels the rules promise. No panel query is
//! exempt: the TTFT and SLO panels read `vllm:time_to_first_token_seconds`, which the replicas
//! export in vLLM's buckets.
//!
//! Run by `make test-observability` (`--ignored`): needs Envoy (ENVOY_BIN or .venv) and
//! Prometheus (PROMETHEUS_BIN, else `prometheus` on PATH: Debian's `prometheus` package).

mod support;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use support::k8s::{FakeApi, VllmPod};
use support::*;

/// What `$__rate_interval` becomes (15 scrapes at 1 s).
const RATE_INTERVAL: &str = "15s";

fn observability_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/observability")
}

fn prometheus_bin() -> PathBuf {
    if let Ok(p) = std::env::var("PROMETHEUS_BIN") {
        return PathBuf::from(p);
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("prometheus"))
            .find(|p| p.is_file())
    });
    found.expect(
        "Prometheus not found: set PROMETHEUS_BIN or run `make test-observability` \
         (installs Debian's prometheus package)",
    )
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Percent-encodes a query-string value.
fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A real Prometheus on 127.0.0.1, killed on drop.
struct Prometheus {
    child: Child,
    addr: String,
    log: PathBuf,
}

impl Prometheus {
    fn start(dir: &TempDir, config: &str) -> Prometheus {
        let config_path = dir.path("prometheus.yml");
        std::fs::write(&config_path, config).unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let log = dir.path("prometheus.log");
        let child = Command::new(prometheus_bin())
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path("prometheus-data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start prometheus");
        let p = Prometheus { child, addr, log };
        if wait_for(Duration::from_secs(30), || {
            (try_http(&p.addr, "GET", "/-/ready", &[], b"").ok()?.status == 200).then_some(())
        })
        .is_none()
        {
            panic!("prometheus not ready:\n{}", p.log_text());
        }
        p
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// GETs an API path; returns `data` (panics unless status is success).
    fn api(&self, path_and_query: &str) -> Value {
        let r = http(&self.addr, "GET", path_and_query, &[], b"");
        let v: Value = serde_json::from_slice(&r.body)
            .unwrap_or_else(|e| panic!("{path_and_query}: not JSON ({e}): {}", r.text()));
        assert_eq!(
            v["status"], "success",
            "{path_and_query}: {} {}",
            r.status, v
        );
        v["data"].clone()
    }

    /// An instant query: the result vector (or scalar as a one-element list).
    fn query(&self, expr: &str) -> Vec<Value> {
        let data = self.api(&format!("/api/v1/query?query={}", encode(expr)));
        match data["result"].clone() {
            Value::Array(a) => a,
            Value::Null => vec![],
            other => vec![other],
        }
    }

    fn scalar(&self, expr: &str) -> Option<f64> {
        let r = self.query(expr);
        let v = r.first()?;
        let value = if v["value"].is_array() {
            &v["value"][1]
        } else {
            &v[1]
        };
        value.as_str()?.parse().ok()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One query of one panel.
struct PanelQuery {
    panel: String,
    ref_id: String,
    expr: String,
}

fn panel_queries(dashboard: &Value) -> Vec<PanelQuery> {
    fn walk(panels: &[Value], out: &mut Vec<PanelQuery>) {
        for p in panels {
            if let Some(nested) = p["panels"].as_array() {
                walk(nested, out);
            }
            for t in p["targets"].as_array().into_iter().flatten() {
                out.push(PanelQuery {
                    panel: p["title"].as_str().unwrap_or("?").to_owned(),
                    ref_id: t["refId"].as_str().unwrap_or("?").to_owned(),
                    expr: t["expr"]
                        .as_str()
                        .unwrap_or_else(|| panic!("panel {} has a target without expr", p["title"]))
                        .to_owned(),
                });
            }
        }
    }
    let mut out = vec![];
    walk(dashboard["panels"].as_array().expect("panels"), &mut out);
    out
}

/// Replaces Grafana's variables; panics on one it does not know.
fn substitute(expr: &str, vars: &[(&str, &str)]) -> String {
    let mut s = expr.replace("$__rate_interval", RATE_INTERVAL);
    for (name, value) in vars {
        s = s.replace(&format!("${{{name}}}"), value);
        s = s.replace(&format!("${name}"), value);
    }
    assert!(!s.contains('$'), "unknown variable in {expr}");
    s
}

/// The dashboard's `label_values(METRIC, LABEL)` variables: (name, metric, label).
fn label_value_variables(dashboard: &Value) -> Vec<(String, String, String)> {
    let mut out = vec![];
    for v in dashboard["templating"]["list"].as_array().unwrap() {
        if v["type"] != "query" {
            continue;
        }
        let q = v["query"]
            .as_str()
            .or_else(|| v["query"]["query"].as_str())
            .unwrap();
        let inner = q
            .strip_prefix("label_values(")
            .and_then(|s| s.strip_suffix(')'))
            .unwrap_or_else(|| panic!("variable query not label_values(metric, label): {q}"));
        let (metric, label) = inner.split_once(',').unwrap();
        out.push((
            v["name"].as_str().unwrap().to_owned(),
            metric.trim().to_owned(),
            label.trim().to_owned(),
        ));
    }
    out
}

fn strategy_request(s: &Stack, strategy: &str, body: &[u8]) -> Resp {
    s.post("/v1/completions", &[("routing-strategy", strategy)], body)
}

fn pod_metric(s: &Stack, name: &str, pod: &str) -> u64 {
    metric_sum(&s.ext.metrics(), &format!("{name}{{pod=\"{pod}\""))
}

fn fault(sim: &Sim, method: &str, spec: &str) {
    let r = http(&sim.addr, method, "/fault", &[], spec.as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
#[ignore = "needs Envoy and Prometheus; run by `make test-observability`"]
fn every_dashboard_query_returns_data_from_a_real_prometheus() {
    let t0 = Instant::now();
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(observability_dir().join("kvroute-dashboard.json")).unwrap(),
    )
    .expect("the dashboard is JSON");
    let rules = observability_dir().join("kvroute-rules.yaml");
    assert!(rules.exists());

    // A second model without pods: its requests get 503 (no ready pod).
    let s = Stack::start(
        "observability",
        "default_strategy = \"least-request\"\n[models.empty]\npods = []\nallow_no_pods = true",
        true,
    );
    let good_config = std::fs::read_to_string(&s.config).unwrap();

    // kvroute-ext-proc with Kubernetes discovery (no pod is ever contacted): model study has a
    // ready and an unready pod, model dormant only an unready one. Its admin port is chosen now
    // so that Prometheus scrapes it from its start.
    let api = FakeApi::start();
    api.add_pod(&VllmPod::aibrix("vllm-0", "study", "10.255.0.1"));
    api.add_pod(&VllmPod {
        ready: false,
        ..VllmPod::aibrix("vllm-1", "study", "10.255.0.2")
    });
    api.add_pod(&VllmPod {
        ready: false,
        ..VllmPod::aibrix("vllm-2", "dormant", "10.255.0.3")
    });
    let k8s_admin = format!("127.0.0.1:{}", free_port());
    let k8s_config = s.dir.path("kvroute-k8s.toml");
    std::fs::write(
        &k8s_config,
        format!(
            "[listen]\ngrpc = \"127.0.0.1:0\"\nadmin = \"{k8s_admin}\"\n[routing]\nseed = 7\n\
             [engine_metrics]\nscrape_interval_ms = 0\n[health]\ncheck_interval_ms = 0\n\
             [discovery]\nsource = \"kubernetes\"\n[discovery.kubernetes]\napi_server = \"{}\"\n\
             mode = \"aibrix\"\n",
            api.url
        ),
    )
    .unwrap();

    let prom_config = format!(
        r#"global:
  scrape_interval: 1s
  scrape_timeout: 900ms
  evaluation_interval: 1s
rule_files:
  - {rules}
scrape_configs:
  # kvroute's pod label names the vLLM pod a series is about: keep it (honor_labels).
  - job_name: kvroute-ext-proc
    honor_labels: true
    static_configs:
      - targets: ["{ext}", "{k8s}"]
  # The replicas export vLLM's names; the target label pod names them as kvroute does.
  - job_name: vllm
    static_configs:
      - targets: ["{a}"]
        labels: {{pod: {a_name}}}
      - targets: ["{b}"]
        labels: {{pod: {b_name}}}
"#,
        rules = rules.display(),
        ext = s.ext.admin,
        k8s = k8s_admin,
        a = s.sims[0].addr,
        a_name = s.sims[0].name,
        b = s.sims[1].addr,
        b_name = s.sims[1].name,
    );
    let prom = Prometheus::start(&s.dir, &prom_config);

    let k8s = ExtProc::start(&s.dir, &k8s_config, None);
    assert_eq!(k8s.admin, k8s_admin);

    // Every target scraped once before any traffic, so that the first events show as increases.
    let all_up = || {
        prom.scalar("count(up == 1)")
            .is_some_and(|n| n == 4.0)
            .then_some(())
    };
    wait_for(Duration::from_secs(15), all_up)
        .unwrap_or_else(|| panic!("targets not up: {}", prom.api("/api/v1/targets")));
    println!(
        "stack, Prometheus and every target up after {:.1?}",
        t0.elapsed()
    );
    // The Kubernetes API forgets every resourceVersion and cuts the watches: the client's
    // relist (after 410 Gone) fails twice.
    api.fail_lists(2);
    api.compact();
    api.drop_watches();

    // Configuration reloads meanwhile: one applied, one rejected (an empty file), then the good
    // file again.
    let reloads = |result: &str| {
        metric_sum(
            &s.ext.metrics(),
            &format!("kvroute_config_reloads_total{{result=\"{result}\"}}"),
        )
    };
    // Load: three strategies over three prompt families, from four clients; one in four
    // streams.
    let jobs: Vec<(&str, u32)> = ["prefix-cache", "least-request", "least-ttft"]
        .iter()
        .flat_map(|st| (0..12).map(move |i| (*st, i)))
        .collect();
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            std::fs::write(&s.config, format!("{good_config}# edited\n")).unwrap();
            wait_for(Duration::from_secs(8), || {
                (reloads("ok") >= 1).then_some(())
            })
            .expect("the edited file was not applied");
            std::fs::write(&s.config, "").unwrap();
            wait_for(Duration::from_secs(8), || {
                (reloads("error") >= 1).then_some(())
            })
            .expect("the empty file was not refused");
            std::fs::write(&s.config, format!("{good_config}# restored\n")).unwrap();
            wait_for(Duration::from_secs(8), || {
                (reloads("ok") >= 2).then_some(())
            })
            .expect("the restored file was not applied");
        });

        for _ in 0..4 {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(strategy, q)) = jobs.get(i) else {
                    break;
                };
                let p = prompt(&format!("family-{}", q % 3), q, 12_000);
                let body = completion("study", &p, 4, q % 4 == 0);
                let r = strategy_request(&s, strategy, &body);
                assert_eq!(r.status, 200, "{strategy}: {}", r.text());
            });
        }
    });
    // Rejections of three kinds.
    let r = s.post("/v1/completions", &[], &completion("nope", "x", 1, false));
    assert_eq!(r.status, 400, "{}", r.text());
    let r = s.post("/v1/completions", &[], &completion("empty", "x", 1, false));
    assert_eq!(r.status, 503, "{}", r.text());
    let r = strategy_request(&s, "no-such-strategy", &completion("study", "x", 1, false));
    assert_eq!(r.status, 400, "{}", r.text());
    s.expect_in_flight(0);
    println!("load done after {:.1?}", t0.elapsed());

    // replica-b answers 500 until kvroute ejects it (5 in a row), then also fails its /metrics
    // until kvroute's active checks take it out (3 in a row).
    let b = &s.sims[1];
    fault(b, "POST", r#"{"status":500,"rate":1.0}"#);
    let mut sent = 0;
    while pod_metric(&s, "kvroute_pod_ejections_total", "replica-b") == 0 {
        assert!(sent < 60, "replica-b not ejected after {sent} requests");
        let body = completion("study", &format!("fault {sent}"), 2, false);
        strategy_request(&s, "least-request", &body);
        sent += 1;
    }
    fault(b, "POST", r#"{"status":500,"rate":1.0,"health":true}"#);
    wait_for(Duration::from_secs(10), || {
        (pod_metric(&s, "kvroute_pod_health_checks_failing", "replica-b") == 1).then_some(())
    })
    .unwrap_or_else(|| panic!("checks of replica-b not failing:\n{}", s.ext.metrics()));
    fault(b, "DELETE", "");
    s.expect_in_flight(0);
    println!(
        "replica-b ejected after {sent} requests and failing checks; faults cleared after {:.1?}",
        t0.elapsed()
    );

    // Every target answering again and scraped twice since.
    let done = now_secs();
    wait_for(Duration::from_secs(15), || {
        let fresh = prom.scalar("min(timestamp(up))")? > done + 2.2;
        (fresh && prom.scalar("min(up)")? == 1.0).then_some(())
    })
    .unwrap_or_else(|| panic!("targets not back: {}", prom.api("/api/v1/targets")));

    // The template variables list the values used below.
    let vars_all = [("model", ".*"), ("pod", ".*"), ("job", "kvroute-ext-proc")];
    let vars_one = [
        ("model", "study"),
        ("pod", "replica-b"),
        ("job", "kvroute-ext-proc"),
    ];
    for (name, metric, label) in label_value_variables(&dashboard) {
        let values = prom.api(&format!(
            "/api/v1/label/{label}/values?match[]={}",
            encode(&metric)
        ));
        let want = vars_one.iter().find(|(n, _)| *n == name).unwrap().1;
        assert!(
            values.as_array().unwrap().iter().any(|v| v == want),
            "variable {name} (label_values({metric}, {label})) = {values}, without {want}"
        );
    }

    // Every panel query, with both sets of variables.
    let queries = panel_queries(&dashboard);
    let mut empty = vec![];
    let mut ttft_queries = 0;
    for q in &queries {
        ttft_queries += usize::from(q.expr.contains("vllm:time_to_first_token_seconds"));
        for vars in [&vars_all, &vars_one] {
            let expr = substitute(&q.expr, vars);
            if prom.query(&expr).is_empty() {
                empty.push(format!("{} {}: {expr}", q.panel, q.ref_id));
            }
        }
    }
    println!(
        "{} panel queries ({ttft_queries} of them on vllm:time_to_first_token_seconds), each \
         with the variables at All and at model=study, pod=replica-b: {} of {} runs returned data",
        queries.len(),
        queries.len() * 2 - empty.len(),
        queries.len() * 2
    );
    assert!(
        empty.is_empty(),
        "panel queries without data:\n{}",
        empty.join("\n")
    );
    assert!(
        ttft_queries >= 3,
        "the TTFT and SLO panels' queries were not found"
    );

    // The rules: loaded, evaluated without error; recording rules have data.
    let groups = prom.api("/api/v1/rules")["groups"].clone();
    let mut n_rules = 0;
    for g in groups.as_array().unwrap() {
        for r in g["rules"].as_array().unwrap() {
            n_rules += 1;
            let name = r["name"].as_str().unwrap();
            assert_eq!(r["health"], "ok", "rule {name}: {}", r["lastError"]);
            if r["type"] == "recording" {
                assert!(
                    !prom.query(name).is_empty(),
                    "recording rule {name} has no data"
                );
            }
        }
    }
    assert_eq!(n_rules, 20, "rules loaded: {groups}");

    // The alerts this run provokes, with the labels the rules promise.
    let alert = |name: &str, labels: &str, state: &str| {
        let expr = format!("ALERTS{{alertname=\"{name}\",alertstate=\"{state}\",{labels}}}");
        wait_for(Duration::from_secs(5), || {
            (!prom.query(&expr).is_empty()).then_some(())
        })
        .unwrap_or_else(|| {
            panic!(
                "no {expr}; alerts: {}",
                prom.api("/api/v1/alerts")["alerts"]
            )
        });
    };
    alert("KvroutePodEjected", "pod=\"replica-b\"", "pending");
    alert("KvrouteNoPodForRequests", "model=\"empty\"", "pending");
    alert("KvrouteModelNoReadyPod", "model=\"dormant\"", "pending");
    alert(
        "KvrouteDiscoveryErrors",
        &format!("instance=\"{k8s_admin}\""),
        "pending",
    );
    alert(
        "KvrouteConfigReloadFailed",
        &format!("instance=\"{}\"", s.ext.admin),
        "firing",
    );
    println!(
        "{n_rules} rules evaluated without error; 5 provoked alerts seen; {:.1?} in all",
        t0.elapsed()
    );
    drop(k8s);
    drop(api);
    assert!(
        !prom.log_text().contains("level=error"),
        "{}",
        prom.log_text()
    );
}
