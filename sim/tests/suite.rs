//! `kvroute-sim suite` against `kvroute-sim run`: a workload's trace written with `--write`,
//! run with its replicas and the seed as the router's, gives the suite's numbers for that seed
//! (the suite is `run`'s machinery, not a second simulator).

use std::path::Path;
use std::process::Command;

fn sim(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kvroute-sim"))
        .args(args)
        .output()
        .expect("kvroute-sim runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{args:?}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The cells of the first table row that starts with `prefix`.
fn row(out: &str, prefix: &str) -> Vec<String> {
    let line = out
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no row {prefix:?} in\n{out}"));
    line.trim_matches('|')
        .split('|')
        .map(|c| c.trim().to_owned())
        .collect()
}

/// The leading number of a cell such as `89.7 (87–92)` or `69.0%`.
fn number(cell: &str) -> f64 {
    let first = cell.split_whitespace().next().unwrap_or_default();
    first
        .trim_end_matches('%')
        .parse()
        .unwrap_or_else(|_| panic!("a number in {cell:?}"))
}

#[test]
fn a_written_trace_run_with_its_seed_gives_the_suites_numbers() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("suite-write");
    let _ = std::fs::remove_dir_all(&dir);
    let dir_arg = dir.display().to_string();
    // Sessions (chat-2), replicas with settings (uneven-3), warm and index lines (warm-skewed).
    let workloads = ["chat-2", "uneven-3", "warm-skewed"];
    let mut write = vec!["suite", "--write", &dir_arg, "--seeds", "2"];
    for w in workloads {
        write.extend(["--workload", w]);
    }
    assert_eq!(sim(&write), "", "--write prints nothing");
    for w in workloads {
        assert!(dir.join(format!("{w}.1.jsonl")).is_file());
        assert!(dir.join(format!("{w}.2.jsonl")).is_file());
        let pods = std::fs::read_to_string(dir.join(format!("{w}.pods"))).expect("pods");
        let suite = sim(&[
            "suite",
            "--seeds",
            "1",
            "--workload",
            w,
            "--strategy",
            "least-ttft",
            "prefix-cache",
        ]);
        let trace = dir.join(format!("{w}.1.jsonl")).display().to_string();
        let mut run = vec!["run", "--trace", &trace, "--seed", "1"];
        for p in pods.lines() {
            run.extend(["--pod", p]);
        }
        run.extend(["--strategy", "least-ttft", "prefix-cache"]);
        let run = sim(&run);
        for strategy in ["least-ttft", "prefix-cache"] {
            // suite: workload | strategy | SLO % (min–max) | P50 | P95 | hit % | prefill
            let s = row(&suite, &format!("| {w} | {strategy} |"));
            // run: trace | strategy | TTFT P95 s | TPOT P95 ms | token hit | SLO /N | split
            let r = row(&run, &format!("| trace | {strategy} |"));
            let within = number(&r[5]);
            let header = run
                .lines()
                .find(|l| l.starts_with("| scenario / round |"))
                .expect("run's table");
            let n: f64 = header
                .split("SLO /")
                .nth(1)
                .and_then(|t| t.split(' ').next())
                .and_then(|t| t.parse().ok())
                .expect("SLO /N in the header");
            let ctx = format!("{w} {strategy}\n{suite}\n{run}");
            assert_eq!(
                format!("{:.1}", 100.0 * within / n),
                format!("{:.1}", number(&s[2])),
                "within SLO: {ctx}"
            );
            assert!(
                (number(&r[2]) - number(&s[4])).abs() <= 0.0051,
                "TTFT P95: {ctx}"
            );
            assert!(
                (number(&r[4]) - number(&s[5])).abs() <= 0.051,
                "token hit: {ctx}"
            );
        }
    }
}

/// Bad arguments exit with 2 and say why; `--require` exits with 1 exactly when the candidate
/// is behind on a workload.
#[test]
fn bad_arguments_are_usage_errors_and_require_fails_only_when_behind() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_kvroute-sim"))
            .arg("suite")
            .args(args)
            .output()
            .expect("kvroute-sim runs")
    };
    for (args, says) in [
        (&["--workload", "nope"][..], "no such workload"),
        (
            &["--router-config", "/nonexistent/kvroute.toml"],
            "--router-config",
        ),
        (&["--ttft-ratio", "0.5"], "--ttft-ratio"),
        (&["--slo-points=-1"], "--slo-points"),
        (&["--strategy", "fastest"], "--strategy"),
        (&["--candidate", "fastest"], "--candidate"),
    ] {
        let out = run(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    // hot-4 (2 seeds): random is behind least-request, least-ttft is not.
    let hot = ["--workload", "hot-4", "--seeds", "2", "--require"];
    let behind = run(&[&hot[..], &["--candidate", "random"]].concat());
    assert_eq!(behind.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&behind.stdout);
    assert!(stdout.contains("| behind |"), "{stdout}");
    let good = run(&hot);
    let stdout = String::from_utf8_lossy(&good.stdout);
    assert_eq!(good.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("| as good |"), "{stdout}");
}
