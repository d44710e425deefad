//! `kvroute-sim run` on the command line: what it prints for the features of its traces and
//! flags, and the errors (exit 2, one line naming what is wrong) for what it refuses.

use std::path::PathBuf;
use std::process::{Command, Output};

/// Writes `text` to a file named `name` in the test's scratch directory.
fn file(name: &str, text: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("run-cli-{name}"));
    std::fs::write(&path, text).unwrap();
    path
}

fn run(trace: &str, name: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvroute-sim"))
        .arg("run")
        .arg("--trace")
        .arg(file(name, trace))
        .args(args)
        .output()
        .expect("kvroute-sim runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The cells of the row of a printed table that starts with `| first |`.
fn row(out: &str, first: &str) -> Vec<String> {
    let line = out
        .lines()
        .find(|l| l.starts_with(&format!("| {first} |")))
        .unwrap_or_else(|| panic!("no row {first}:\n{out}"));
    line.split('|')
        .map(|c| c.trim().to_owned())
        .filter(|c| !c.is_empty())
        .collect()
}

/// `a / b` as two numbers.
fn pair(cell: &str) -> (f64, f64) {
    let (a, b) = cell.split_once(" / ").unwrap();
    (a.parse().unwrap(), b.parse().unwrap())
}

/// 8 distinct 2,000-token prompts at once, 64 output tokens each.
fn burst() -> String {
    (0..8)
        .map(|i| {
            format!(
                "{{\"at\":0,\"prompt_id\":\"p{i}\",\"prompt_tokens\":2000,\"output_tokens\":64}}\n"
            )
        })
        .collect()
}

#[test]
fn the_report_shows_ttft_from_the_send_and_from_the_planned_arrival() {
    let out = run(&burst(), "planned.jsonl", &["--client-cap", "2"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("| strategy | TTFT P50 / P95 s from send | from planned arrival | sent late | longest hold s | SLO /8 | SLO /8 from planned |"),
        "{text}"
    );
    let cells = row(&text, "prefix-cache");
    let (sent, planned) = (pair(&cells[1]), pair(&cells[2]));
    // Two at a time on two pods: the send sees no queue, the planned arrival waits for the
    // three pairs ahead (64 decode steps each).
    assert!(sent.1 < 1.0, "{text}");
    assert!(planned.1 > sent.1 + 5.0, "{text}");
    assert_eq!(cells[3], "6", "{text}");
    assert_eq!(cells[5], "8", "{text}");
    assert!(cells[6].parse::<u32>().unwrap() < 8, "{text}");
    // Uncapped, both agree.
    let text = stdout(&run(&burst(), "planned-uncapped.jsonl", &[]));
    let cells = row(&text, "prefix-cache");
    assert_eq!(cells[1], cells[2], "{text}");
    assert_eq!(cells[3], "0", "{text}");
}

/// Exit 2 with one line of error that contains `expect`.
fn refused(out: &Output, expect: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(expect) && err.trim().lines().count() == 1,
        "{expect}: {err}"
    );
}

#[test]
fn pods_of_their_own_speeds_and_capacities() {
    // 16 requests, one every 0.5 s: the fast pod answers each in about a second, the slow
    // one in about six, so least-request finds the fast one less loaded.
    let spaced: String = (0..16)
        .map(|i| {
            format!(
                "{{\"at\":{},\"prompt_id\":\"p{i}\",\"prompt_tokens\":2000,\"output_tokens\":64}}\n",
                f64::from(i) * 0.5
            )
        })
        .collect();
    let pods = [
        "--pod",
        "fast:speed=2",
        "--pod",
        "slow:speed=0.5,max-num-seqs=2,kv-blocks=40",
    ];
    let out = run(
        &spaced,
        "pods.jsonl",
        &[&["--strategy", "least-request"], &pods[..]].concat(),
    );
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("| SLO /16 | fast / slow |"), "{text}");
    let cells = row(&text, "trace");
    let split: Vec<u32> = cells[6].split(" / ").map(|n| n.parse().unwrap()).collect();
    assert_eq!(split.iter().sum::<u32>(), 16, "{text}");
    assert!(split[0] > 2 * split[1], "{text}");
    // The slow pod's queue is the longer one (peaks of the engines' waiting gauge, sampled
    // every `--snapshot-every-ms`).
    let peaks = text
        .split("peak waiting fast=")
        .nth(1)
        .and_then(|t| t.split(" ·").next())
        .expect("a peak waiting note");
    let (fast, slow) = peaks.split_once(" slow=").expect("both pods");
    let (fast, slow): (u32, u32) = (fast.parse().unwrap(), slow.parse().unwrap());
    assert!(fast < slow, "{text}");
    for (pod, expect) in [
        (
            "A:speed=0",
            "--pod A:speed=0: speed=0: a finite number above 0",
        ),
        ("A:turbo=1", "--pod A:turbo=1: unknown setting \"turbo=1\""),
        ("A:kv-blocks=3", "cannot hold max-model-len"),
        (
            "A:max-num-seqs=2,max-num-seqs=3",
            "max-num-seqs given twice",
        ),
    ] {
        refused(&run(&burst(), "pods-bad.jsonl", &["--pod", pod]), expect);
    }
    refused(
        &run(
            &burst(),
            "pods-twice.jsonl",
            &["--pod", "A", "--pod", "A:speed=2"],
        ),
        "--pod A: named twice",
    );
    let both = run(&burst(), "pods-both.jsonl", &["--pod", "A", "--pods", "3"]);
    assert_eq!(both.status.code(), Some(2));
}

/// `sim/examples/NAME`.
fn example_named(name: &str) -> String {
    std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("examples")
            .join(name),
    )
    .unwrap()
}

/// The example trace (two shared 3,000-token prefixes, 40 requests).
fn example() -> String {
    example_named("trace.jsonl")
}

/// The `decision` of every record `run --records` writes.
fn decisions(out_name: &str, args: &[&str]) -> Vec<String> {
    let records = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(out_name);
    let mut all = args.to_vec();
    let path = records.to_str().unwrap();
    all.extend(["--records", path]);
    let out = run(&example(), &format!("{out_name}.trace"), &all);
    assert!(out.status.success(), "{}", stdout(&out));
    std::fs::read_to_string(&records)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["decision"].as_str().unwrap().to_owned()
        })
        .collect()
}

#[test]
fn feedback_modes_tell_the_router_what_a_shell_would() {
    let streaming = decisions("fb-streaming.jsonl", &["--strategy", "least-ttft"]);
    let total_only = decisions(
        "fb-total-only.jsonl",
        &["--strategy", "least-ttft", "--feedback", "total-only"],
    );
    assert_eq!(streaming.len(), 40);
    // The first decisions use the priors alone; later ones what each learned.
    assert_eq!(streaming[0], total_only[0]);
    let differ = streaming
        .iter()
        .zip(&total_only)
        .filter(|(a, b)| a != b)
        .count();
    assert!(differ > 20, "{streaming:?}\n{total_only:?}");
    let text = stdout(&run(
        &example(),
        "fb-envoy.jsonl",
        &["--strategy", "least-ttft", "--feedback", "envoy"],
    ));
    let timed = text
        .split(" · timed responses ")
        .nth(1)
        .unwrap_or_else(|| panic!("{text}"));
    let (n, rest) = timed.split_once(" (at most ").unwrap();
    assert!((5..40).contains(&n.parse::<u32>().unwrap()), "{text}");
    assert!(rest.starts_with("4 at once)"), "{text}");
    assert!(!stdout(&run(&example(), "fb-streaming.jsonl", &[])).contains("timed responses"));
}

#[test]
fn router_parameters_come_from_a_kvroute_toml_file() {
    let config = |name: &str, text: &str| file(name, text).to_str().unwrap().to_owned();
    // 64-byte text blocks: twice the blocks of the default 128.
    let small = config("blocks.toml", "[prefix_cache]\nblock_size = 64\n");
    let blocks = |d: &String| {
        let b = d
            .split(" blocks=")
            .nth(1)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap();
        b.split_once('/').unwrap().1.parse::<u32>().unwrap()
    };
    let default = decisions("rc-default.jsonl", &[]);
    let halved = decisions("rc-64.jsonl", &["--router-config", &small]);
    for (d, h) in default.iter().zip(&halved) {
        assert!(
            blocks(h) >= 2 * blocks(d) - 1 && blocks(h) > blocks(d),
            "{d}\n{h}"
        );
    }
    // The imbalance guard at 1 fires where the default 16 never does.
    let guard = config(
        "guard.toml",
        "# kvroute\n[prefix_cache]\nimbalance_abs_count = 1\n",
    );
    let events = |text: String| -> u32 {
        let rest = text.split(" · imbalance events ").nth(1).unwrap();
        rest.split_whitespace().next().unwrap().parse().unwrap()
    };
    assert_eq!(events(stdout(&run(&example(), "rc-guard0.jsonl", &[]))), 0);
    assert!(
        events(stdout(&run(
            &example(),
            "rc-guard1.jsonl",
            &["--router-config", &guard]
        ))) > 0
    );
    // [ttft] keys by their kvroute names, validated by the core.
    let ttft = config(
        "ttft.toml",
        "[ttft]\nengine_block_tokens = 1568\ntie_ms = 0\n",
    );
    let out = run(
        &example(),
        "rc-ttft.jsonl",
        &["--strategy", "least-ttft", "--router-config", &ttft],
    );
    assert!(out.status.success(), "{}", stdout(&out));
    for (text, expect) in [
        (
            "[listen]\naddr = \"x\"\n",
            "line 1: unknown field `listen`, expected `ttft` or `prefix_cache`",
        ),
        (
            "[ttft]\ntie_ms = 0\nbogus = 1\n",
            "[ttft]: unknown TTFT setting \"bogus\"",
        ),
        (
            "[ttft]\nlearning_rate = 2\n",
            "[ttft]: invalid value for TTFT setting learning_rate",
        ),
        (
            "[prefix_cache]\nblock_size = \"big\"\n",
            "line 2: invalid type: string \"big\"",
        ),
    ] {
        let path = config("bad.toml", text);
        refused(
            &run(&example(), "rc-bad.jsonl", &["--router-config", &path]),
            expect,
        );
    }
    refused(
        &run(
            &example(),
            "rc-none.jsonl",
            &["--router-config", "/nonexistent/kvroute.toml"],
        ),
        "--router-config /nonexistent/kvroute.toml: ",
    );
}

#[test]
fn warm_and_index_lines_name_pods_the_run_has() {
    let trace = example_named("warm-skewed.jsonl");
    let out = run(
        &trace,
        "warm.jsonl",
        &["--strategy", "prefix-cache", "least-request"],
    );
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    // Every request finds its prefix cached wherever it goes (the same hit rate for both),
    // but prefix-cache believes the index and queues on A; least-request does not.
    let cells = |strategy: &str| row(&text, &format!("trace | {strategy}"));
    let (pc, lr) = (cells("prefix-cache"), cells("least-request"));
    assert_eq!(
        (pc[4].as_str(), lr[4].as_str()),
        ("52.1%", "52.1%"),
        "{text}"
    );
    assert_eq!(lr[5], "40", "{text}");
    assert!(pc[5].parse::<u32>().unwrap() < 30, "{text}");
    assert!(
        text.contains(
            "prefix-cache: reasons least_request=4 least_request_fallback=1 prefix_match=35"
        ),
        "{text}"
    );
    // Three pods: C exists; with --pods 1 it does not.
    let c = "{\"warm\":{\"pod\":\"C\",\"prompt\":\"x\"}}\n{\"at\":0,\"prompt\":\"x\"}\n";
    assert!(run(c, "warm-c.jsonl", &["--pods", "3"]).status.success());
    refused(
        &run(c, "warm-c.jsonl", &["--pods", "1"]),
        "trace line 1: no pod \"C\" in the cluster",
    );
}

#[test]
fn pods_fail_leave_and_join_at_the_times_the_trace_gives() {
    let trace = example_named("failover.jsonl");
    let out = run(
        &trace,
        "failover.jsonl",
        &["--pods", "3", "--strategy", "least-request"],
    );
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    // B held three requests when it failed; C served none before 6 s, a share after.
    assert!(text.contains(" · 3 failed"), "{text}");
    let split = row(&text, "trace")[6].clone();
    let counts: Vec<u32> = split.split(" / ").map(|n| n.parse().unwrap()).collect();
    assert_eq!(counts.len(), 3, "{text}");
    assert_eq!(counts[1], 3, "{text}");
    assert!(counts[2] >= 10, "{text}");
    // Without C the trace names a pod the run does not have; a pod added while serving.
    refused(
        &run(&trace, "failover-2.jsonl", &["--pods", "2"]),
        "no pod \"C\" in the cluster",
    );
    let twice =
        "{\"at\":0,\"prompt\":\"x\"}\n{\"at\":1,\"pod_add\":\"A\"}\n{\"at\":2,\"pod_add\":\"A\"}\n";
    refused(
        &run(twice, "failover-twice.jsonl", &[]),
        "trace line 3: pod_add \"A\": the pod is already serving",
    );
    refused(
        &run(&trace, "failover-kv.jsonl", &["--pods", "3", "--kv-events"]),
        "cannot run with KV events",
    );
}
