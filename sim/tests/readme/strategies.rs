//! sim/README.md's section on AIBrix's other strategies against the binary: its table is the
//! study table the command it names prints, row for row, and every within-SLO range its prose
//! quotes is what that command (or the run the prose names beside it) gives.

use super::*;

/// The study's eight phases, as the table labels them.
const PHASES: [&str; 8] = [
    "cold / 1",
    "cold / 2",
    "warm / 1",
    "warm / 2",
    "hot50 / 1",
    "hot50 / 2",
    "hot90 / 1",
    "hot90 / 2",
];

/// The strategies the section's command studies, in its order.
const STRATEGIES: [&str; 8] = [
    "least-kv-cache",
    "least-gpu-cache",
    "least-busy-time",
    "least-utilization",
    "least-latency",
    "throughput",
    "power-of-two",
    "session-affinity",
];

/// The strategies that read engine snapshots (the others read the router's own counts).
const SNAPSHOT_READERS: [&str; 4] = [
    "least-kv-cache",
    "least-gpu-cache",
    "least-latency",
    "throughput",
];

/// A strategy's within-SLO counts over the eight phases of a study run.
fn slos(out: &str, strategy: &str) -> Vec<u32> {
    PHASES.iter().map(|p| slo(out, p, strategy)).collect()
}

/// "min–max" of a strategy's within-SLO counts over the eight phases.
fn range(out: &str, strategy: &str) -> String {
    let v = slos(out, strategy);
    format!("{}–{}", v.iter().min().unwrap(), v.iter().max().unwrap())
}

/// Each phase's count of decisions a strategy made on its own metric, from `--verbose`'s
/// "PHASE STRATEGY: reasons a=N b=M · ..." lines.
fn metric_decisions(verbose: &str, strategy: &str) -> Vec<u32> {
    let reason = format!("{}=", strategy.replace('-', "_"));
    PHASES
        .iter()
        .map(|phase| {
            let line = verbose
                .lines()
                .find(|l| l.starts_with(&format!("{phase} {strategy}: reasons ")))
                .unwrap_or_else(|| panic!("no reasons for {phase} {strategy}:\n{verbose}"));
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(&reason))
                .map_or(0, |n| n.parse().unwrap())
        })
        .collect()
}

#[test]
fn the_aibrix_strategies_table_and_ranges_are_what_study_prints() {
    let md = sim_readme();
    let section = section(&md, "## AIBrix's other strategies (study)");
    let (_, prose) = split_fences(&section.lines);
    let spans = spans_by_paragraph(&prose).concat();
    let command = spans
        .iter()
        .find(|s| s.starts_with("kvroute-sim study "))
        .expect("the study command in the prose");
    let words = shell_words(command);
    let args: Vec<&str> = words[2..].iter().map(String::as_str).collect();
    let mut want = vec!["--strategy"];
    want.extend(STRATEGIES);
    assert_eq!(args, want, "the section's command");

    // The table: the printed study table, every row in order.
    let out = study(&args);
    let rows: Vec<&str> = section
        .lines
        .iter()
        .map(String::as_str)
        .filter(|l| l.starts_with("| ") && !l.starts_with("| scenario / round |"))
        .collect();
    let header = "| scenario / round | strategy | TTFT P95 s |";
    assert_eq!(
        rows,
        table_rows(&out, header),
        "the section's table vs\n{out}"
    );
    assert_eq!(rows.len(), PHASES.len() * STRATEGIES.len());

    // The prose's numbers.
    let text = prose.join(" ");
    let default = study(&[]);
    let mut verbose_args = args.clone();
    verbose_args.push("--verbose");
    let verbose = study(&verbose_args);
    let mut every_second = args.clone();
    every_second.extend(["--snapshot-every-ms", "1000"]);
    let every_second = study(&every_second);

    let decided: Vec<Vec<u32>> = SNAPSHOT_READERS
        .iter()
        .map(|s| metric_decisions(&verbose, s))
        .collect();
    let n = decided[0][0];
    assert!(
        decided.iter().flatten().all(|&d| d == n),
        "snapshot readers' metric decisions differ: {decided:?}"
    );
    assert_eq!(
        slos(&out, "least-busy-time"),
        slos(&out, "least-utilization"),
        "one input"
    );
    let claims = [
        format!("`power-of-two` ({})", range(&out, "power-of-two")),
        format!("(`least-request` {})", range(&default, "least-request")),
        format!("`session-affinity` ({})", range(&out, "session-affinity")),
        format!("`random` ({})", range(&default, "random")),
        format!("decide on their metric for {n} of a phase's 96 requests"),
        format!(
            "`least-kv-cache` ({}) and `least-gpu-cache` ({})",
            range(&out, "least-kv-cache"),
            range(&out, "least-gpu-cache")
        ),
        format!(
            "`least-busy-time` and `least-utilization` (one input, {})",
            range(&out, "least-busy-time")
        ),
        format!(
            "`least-latency` ({}) and `throughput` ({})",
            range(&out, "least-latency"),
            range(&out, "throughput")
        ),
        format!(
            "fall to {} and {}, while `least-kv-cache` rises to {}.",
            range(&every_second, "least-latency"),
            range(&every_second, "throughput"),
            range(&every_second, "least-kv-cache")
        ),
    ];
    for claim in claims {
        assert!(text.contains(&claim), "sim/README.md should say: {claim}");
    }
}
