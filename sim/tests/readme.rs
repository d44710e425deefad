//! `sim/README.md` (and the simulator's section of the top-level README) against the binary, so
//! that the documentation and the command line cannot drift apart in either direction:
//!
//! - every `--flag` of a subcommand's synopsis (the ```-blocks that start with
//!   `kvroute-sim SUB` and show `[...]`), of its section's flag tables, and of the engine-flags
//!   section (for the subcommands its heading names) is in `kvroute-sim SUB --help`, with the
//!   default the synopsis shows (`--rate R (1.6)`, `[--max-num-seqs 8]`); and every option
//!   `--help` lists is in one of them;
//! - every `--flag` the prose mentions in inline code is accepted by the subcommand it is about
//!   (the one named in the span, else the last `kvroute-sim SUB` named before it in the
//!   paragraph, else the section's, else any); where its values are literal (`--feedback
//!   envoy`) and the subcommand is `study` or `bar`, they are run through the binary's own
//!   validation, which then stops at a deliberately bad flag appended last;
//! - the runnable examples (```-blocks without `[`) run as written, with this build's binary
//!   for `kvroute-sim` and the repository root as the working directory, and print what the
//!   README says they print; the `curl` examples of the fault section run (over a plain
//!   HTTP/1.1 connection, as curl sends them) against the `serve` example beside them;
//! - `kvroute-sim study` prints the rows of the README's simulated-study table, and the
//!   top-level README's least-ttft table; `--out` writes what the README lists; the numbers
//!   the prose quotes for `--router-max-seqs`, `--arrivals poisson` and `bar --orders` are
//!   what the binary prints; the table of AIBrix's other strategies is what the command its
//!   section names prints, and the ranges its prose quotes are those runs' (readme/strategies.rs);
//! - the command the README gives for the ignored simulation tests is `make test-sim`'s.
//!
//! About 8 s (the bar examples take most of it; they run at once).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("sim/ has a parent")
        .to_owned()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn sim_readme() -> String {
    read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
}

fn top_readme() -> String {
    read(&repo_root().join("README.md"))
}

/// The binary, run from the repository root (where the README's relative paths start).
fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kvroute-sim"));
    c.current_dir(repo_root());
    c
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

// ---------------------------------------------------------------------------------------------
// The command line, from `--help`.

/// One option as `--help` lists it.
#[derive(Debug, Clone)]
struct Opt {
    takes_value: bool,
    default: Option<String>,
}

/// The subcommands `kvroute-sim --help` lists (without `help`).
fn subcommands() -> Vec<String> {
    let out = bin().arg("--help").output().expect("kvroute-sim runs");
    assert!(out.status.success());
    let help = text(&out.stdout);
    let mut subs = vec![];
    let mut in_commands = false;
    for line in help.lines() {
        if line.trim_end() == "Commands:" {
            in_commands = true;
        } else if in_commands {
            let Some(word) = line.split_whitespace().next() else {
                break;
            };
            if word != "help" {
                subs.push(word.to_owned());
            }
        }
    }
    assert!(subs.len() >= 5, "{help}");
    subs
}

/// A subcommand's long options (without `--help`), from `kvroute-sim SUB --help`.
fn options(sub: &str) -> BTreeMap<String, Opt> {
    let out = bin()
        .args([sub, "--help"])
        .output()
        .expect("kvroute-sim runs");
    assert!(out.status.success(), "{sub} --help");
    let help = text(&out.stdout);
    let mut opts = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in help.lines() {
        let indent = line.len() - line.trim_start().len();
        let t = line.trim_start();
        // Option lines are indented 2–6 columns ("  -h, --help", "      --name <NAME>"); their
        // descriptions further.
        if t.starts_with('-') && (1..=6).contains(&indent) {
            let long = t
                .split([',', ' '])
                .find_map(|w| w.strip_prefix("--"))
                .map(str::to_owned);
            if let Some(long) = &long {
                opts.insert(
                    long.clone(),
                    Opt {
                        takes_value: t.contains('<'),
                        default: None,
                    },
                );
            }
            current = long;
        }
        if let (Some(c), Some(i)) = (&current, line.find("[default: ")) {
            let rest = &line[i + "[default: ".len()..];
            let d = &rest[..rest.find(']').expect("[default: ...]")];
            opts.get_mut(c).unwrap().default = Some(d.to_owned());
        }
    }
    opts.remove("help");
    assert!(!opts.is_empty(), "{help}");
    opts
}

// ---------------------------------------------------------------------------------------------
// Markdown (readme/markdown.rs) and the serve example (readme/serve.rs).

#[path = "readme/markdown.rs"]
mod markdown;
#[path = "readme/serve.rs"]
mod serve;
// SIGTERM and wait, as the serve tests stop their servers.
#[path = "support/serve.rs"]
mod support;
// The section on AIBrix's other strategies (its tests).
#[path = "readme/strategies.rs"]
mod strategies;
// The `kvroute-sim overload` section (its tests).
#[path = "readme/overload.rs"]
mod overload;
// The `kvroute-sim suite` section (its tests; the section's example runs there).
#[path = "readme/suite.rs"]
mod suite;
// The section on predicted and actual cached tokens (its tables re-run).
#[path = "readme/cached_tokens.rs"]
mod cached_tokens;
use markdown::*;
use serve::check_serve;

// ---------------------------------------------------------------------------------------------
// What sim/README.md documents, per subcommand.

#[derive(Default, Debug)]
struct Documented {
    /// (subcommand, flag, default shown) from synopses and the engine flag list.
    synopsis: Vec<(String, String, Option<String>)>,
    /// (subcommand, flag) from the flag tables of the subcommand's section.
    tables: Vec<(String, String)>,
    /// The subcommands the overview block lists.
    overview: BTreeSet<String>,
    /// The subcommands with a `## \`kvroute-sim SUB\`` section.
    with_section: BTreeSet<String>,
}

fn documented(md: &str) -> Documented {
    let mut d = Documented::default();
    for (i, section) in sections(md).iter().enumerate() {
        let (blocks, prose) = split_fences(&section.lines);
        let sub = heading_subcommand(&section.heading);
        if let Some(s) = &sub {
            d.with_section.insert(s.clone());
        }
        for block in &blocks {
            for c in block_commands(block) {
                if !c.is_synopsis() {
                    continue;
                }
                if i == 0 {
                    d.overview.insert(c.sub.clone());
                }
                for (flag, default) in synopsis_flags(&c.rest) {
                    d.synopsis.push((c.sub.clone(), flag, default));
                }
            }
        }
        if let Some(subs) = engine_heading_subcommands(&section.heading) {
            for span in spans_by_paragraph(&prose).concat() {
                for (flag, default) in synopsis_flags(&span) {
                    for s in &subs {
                        d.synopsis.push((s.clone(), flag.clone(), default.clone()));
                    }
                }
            }
        }
        if let Some(s) = &sub {
            let table: Vec<String> = prose
                .iter()
                .filter(|l| l.trim_start().starts_with('|'))
                .cloned()
                .collect();
            for span in spans_by_paragraph(&table).concat() {
                for w in shell_words(&span) {
                    if let Some(flag) = flag_name(&w) {
                        d.tables.push((s.clone(), flag));
                    }
                }
            }
        }
    }
    d
}

#[test]
fn synopses_flag_tables_and_help_list_the_same_flags_and_defaults() {
    let md = sim_readme();
    let d = documented(&md);
    let subs = subcommands();
    let help: BTreeMap<String, BTreeMap<String, Opt>> =
        subs.iter().map(|s| (s.clone(), options(s))).collect();

    let listed: BTreeSet<String> = subs.iter().cloned().collect();
    assert_eq!(d.overview, listed, "the README's overview block vs --help");
    assert_eq!(
        d.with_section, listed,
        "a `## kvroute-sim SUB` section per subcommand"
    );

    let mut problems = vec![];
    // README → CLI: every flag shown is accepted, with the default shown.
    for (sub, flag, default) in &d.synopsis {
        let Some(opts) = help.get(sub) else {
            problems.push(format!("synopsis of unknown subcommand {sub}"));
            continue;
        };
        match (opts.get(flag), default) {
            (None, _) => problems.push(format!("{sub} --{flag}: in the README, not in --help")),
            (Some(o), Some(shown)) => match &o.default {
                Some(real) if same_value(shown, real) => {}
                real => problems.push(format!(
                    "{sub} --{flag}: the README shows default {shown}, --help {real:?}"
                )),
            },
            (Some(_), None) => {}
        }
    }
    for (sub, flag) in &d.tables {
        if !help[sub].contains_key(flag) {
            problems.push(format!("{sub} --{flag}: in a flag table, not in --help"));
        }
    }
    // CLI → README: every option is documented for its subcommand.
    for (sub, opts) in &help {
        for flag in opts.keys() {
            let shown = d.synopsis.iter().any(|(s, f, _)| s == sub && f == flag)
                || d.tables.iter().any(|(s, f)| s == sub && f == flag);
            if !shown && flag != "version" {
                problems.push(format!(
                    "{sub} --{flag}: in --help, in no synopsis or flag table of the README"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(d.synopsis.len() > 60, "{d:?}");
}

// ---------------------------------------------------------------------------------------------
// Flags in the prose.

/// (subcommand the span is about, or None for any; its words) for every inline code span with
/// a `--flag` in the sections of `md` that `keep` selects.
fn prose_flag_spans(
    md: &str,
    subs: &[String],
    keep: impl Fn(&str) -> bool,
) -> Vec<(Option<String>, Vec<String>)> {
    let mut out = vec![];
    for section in sections(md) {
        if !keep(&section.heading) {
            continue;
        }
        let section_sub = heading_subcommand(&section.heading);
        let (_, prose) = split_fences(&section.lines);
        for para in spans_by_paragraph(&prose) {
            let mut last_named: Option<String> = None;
            for span in para {
                let words = shell_words(&span);
                let Some(first) = words.first() else {
                    continue;
                };
                if ["cargo", "make", "curl"].contains(&first.as_str()) {
                    continue;
                }
                let (sub, words) = if first == "kvroute-sim" && words.len() > 1 {
                    last_named = Some(words[1].clone());
                    (Some(words[1].clone()), words[2..].to_vec())
                } else if subs.contains(first) && words.get(1).is_some_and(|w| w.starts_with("--"))
                {
                    (Some(first.clone()), words[1..].to_vec())
                } else {
                    (last_named.clone().or(section_sub.clone()), words)
                };
                if words.iter().any(|w| flag_name(w).is_some()) {
                    out.push((sub, words));
                }
            }
        }
    }
    out
}

/// Runs `SUB WORDS... SENTINEL` and expects the binary to get past WORDS (parsing and
/// validating them) and stop at the sentinel: exit 2 with the sentinel's error.
fn validates(sub: &str, words: &[String]) -> Result<(), String> {
    let (sentinel, expect): (&[&str], &str) = match sub {
        "bar" => (
            &["--ttft-ratio", "0"],
            "--ttft-ratio must be a positive number",
        ),
        "study" => (&["--strategy", "no-such-strategy"], "\"no-such-strategy\""),
        _ => unreachable!(),
    };
    let out = bin()
        .arg(sub)
        .args(words)
        .args(sentinel)
        .output()
        .expect("kvroute-sim runs");
    let err = text(&out.stderr);
    if out.status.code() == Some(2) && err.contains(expect) && err.lines().count() == 1 {
        Ok(())
    } else {
        Err(format!(
            "{sub} {}: exit {:?}, {err}",
            words.join(" "),
            out.status.code()
        ))
    }
}

fn check_prose_spans(spans: &[(Option<String>, Vec<String>)], subs: &[String]) -> Vec<String> {
    let help: BTreeMap<String, BTreeMap<String, Opt>> =
        subs.iter().map(|s| (s.clone(), options(s))).collect();
    let mut problems = vec![];
    for (sub, words) in spans {
        let flags: Vec<String> = words.iter().filter_map(|w| flag_name(w)).collect();
        match sub {
            Some(s) => {
                let Some(opts) = help.get(s) else {
                    problems.push(format!("`{}`: no subcommand {s}", words.join(" ")));
                    continue;
                };
                for f in &flags {
                    if !opts.contains_key(f) {
                        problems.push(format!("`{}`: {s} has no --{f}", words.join(" ")));
                    }
                }
                // Literal values: through the binary's own parsing and validation.
                let literal = words
                    .iter()
                    .all(|w| flag_name(w).is_some() || !is_placeholder(w));
                let valued = words.iter().enumerate().all(|(i, w)| {
                    flag_name(w).is_none_or(|f| {
                        !opts.get(&f).is_some_and(|o| o.takes_value)
                            || words.get(i + 1).is_some_and(|v| flag_name(v).is_none())
                    })
                });
                let all_flags_known = flags.iter().all(|f| opts.contains_key(f));
                if ["bar", "study"].contains(&s.as_str()) && literal && valued && all_flags_known {
                    if let Err(e) = validates(s, words) {
                        problems.push(e);
                    }
                }
            }
            None => {
                for f in &flags {
                    if !help.values().any(|o| o.contains_key(f)) {
                        problems.push(format!("`{}`: no subcommand has --{f}", words.join(" ")));
                    }
                }
            }
        }
    }
    problems
}

#[test]
fn every_flag_the_prose_mentions_is_accepted() {
    let subs = subcommands();
    let md = sim_readme();
    let spans = prose_flag_spans(&md, &subs, |_| true);
    assert!(spans.len() > 30, "{spans:?}");
    let problems = check_prose_spans(&spans, &subs);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_top_level_readme_names_flags_that_exist_with_values_they_accept() {
    let subs = subcommands();
    let md = top_readme();
    let spans = prose_flag_spans(&md, &subs, |h| h.contains("(simulated study)"));
    // The flags it names for `bar`: at least these, each accepted with its value.
    let mut bar_flags = BTreeSet::new();
    for (sub, words) in &spans {
        if sub.as_deref() == Some("bar") {
            bar_flags.extend(words.iter().filter_map(|w| flag_name(w)));
        }
    }
    for f in [
        "draws",
        "prior-scale",
        "rate",
        "replicas",
        "feedback",
        "order",
        "orders",
    ] {
        assert!(bar_flags.contains(f), "--{f} not found: {spans:?}");
    }
    let problems = check_prose_spans(&spans, &subs);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// Runnable examples.

/// Every runnable `kvroute-sim` example of the README's code blocks, with the block's other
/// lines (the `curl` examples beside the `serve` one).
fn runnable_examples(md: &str) -> Vec<(BlockCommand, Vec<String>)> {
    let mut out = vec![];
    for section in sections(md) {
        let (blocks, _) = split_fences(&section.lines);
        for block in blocks {
            for c in block_commands(&block) {
                if !c.is_synopsis() {
                    out.push((c, block.clone()));
                }
            }
        }
    }
    out
}

/// The value of `--flag` in an argument list.
fn arg<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let i = args.iter().position(|a| a == flag)?;
    args.get(i + 1).map(String::as_str)
}

/// `kvroute-sim bar`: one row per draw, order and phase (the draw column `variant/order` for
/// other orders) with the misses, a table of means with more than one draw or order, a summary
/// line, exit 1 exactly when some phase missed.
fn check_bar(args: &[String], out: &Output) {
    let stdout = text(&out.stdout);
    let ctx = format!("bar {}:\n{stdout}{}", args.join(" "), text(&out.stderr));
    let num = |flag: &str, default: u64| -> u64 {
        arg(args, flag).map_or(default, |v| v.parse().expect("a number"))
    };
    let (variant, order) = (num("--variant", 0), num("--order", 0));
    let (draws, orders) = (num("--draws", 1), num("--orders", 1));
    let phases_per_draw = if arg(args, "--round").is_some() { 4 } else { 8 };
    let candidate = arg(args, "--candidate").unwrap_or("least-ttft");

    assert!(
        stdout.starts_with(&format!("| draw | phase | {candidate} within SLO |")),
        "{ctx}"
    );
    let is_label = |s: &str| {
        let mut parts = s.split('/');
        let ok = parts
            .by_ref()
            .take(2)
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        ok && parts.next().is_none()
    };
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .map(|l| l.split('|').map(str::trim).collect::<Vec<_>>())
        .filter(|cells| cells.len() > 2 && is_label(cells[1]))
        .collect();
    assert_eq!(rows.len() as u64, draws * orders * phases_per_draw, "{ctx}");
    let labels: BTreeSet<String> = rows.iter().map(|r| r[1].to_owned()).collect();
    let mut want = BTreeSet::new();
    for o in order..order + orders {
        for v in variant..variant + draws {
            want.insert(if o == 0 {
                v.to_string()
            } else {
                format!("{v}/{o}")
            });
        }
    }
    assert_eq!(labels, want, "{ctx}");
    let missed_rows = rows.iter().filter(|r| r[r.len() - 2] != "-").count();

    let means = stdout.lines().any(|l| l.starts_with("| phase | draws |"));
    assert_eq!(means, draws * orders > 1, "means table: {ctx}");

    let last = stdout.lines().last().unwrap_or_default();
    let rest = last
        .strip_prefix(&format!("{candidate}: "))
        .unwrap_or_else(|| panic!("summary line: {ctx}"));
    let words: Vec<&str> = rest.split_whitespace().collect();
    // "N misses in M of P phases (D draws × O family orders)"
    let misses: u64 = words[0].parse().unwrap();
    assert_eq!(words[1..3], ["misses", "in"], "{ctx}");
    assert_eq!(words[3].parse::<usize>().unwrap(), missed_rows, "{ctx}");
    assert_eq!(words[5].parse::<usize>().unwrap(), rows.len(), "{ctx}");
    assert!(
        rest.ends_with(&format!("phases ({draws} draws × {orders} family orders)")),
        "{ctx}"
    );
    assert_eq!(
        out.status.code(),
        Some(if misses == 0 { 0 } else { 1 }),
        "{ctx}"
    );
}

/// The bar section's numbers over other family orders: "cold / 1 gives least-ttft A–B within
/// SLO and the best of the other three C–D", from the `--orders` example's rows.
fn check_order_ranges(md: &str, stdout: &str) {
    let (mut ours, mut best) = (vec![], vec![]);
    for l in stdout.lines() {
        let cells: Vec<&str> = l.split('|').map(str::trim).collect();
        if cells.len() > 4 && cells[1].contains('/') && cells[2] == "cold / 1" {
            ours.push(cells[3].parse::<u32>().unwrap());
            best.push(cells[4].parse::<u32>().unwrap());
        }
    }
    let range = |v: &[u32]| format!("{}–{}", v.iter().min().unwrap(), v.iter().max().unwrap());
    let claim = format!(
        "gives least-ttft {} within SLO and the best of the other three {}",
        range(&ours),
        range(&best)
    );
    assert!(
        md.replace('\n', " ").contains(&claim),
        "sim/README.md should say: {claim}"
    );
}

/// `kvroute-sim run`: a reasons line per strategy and the study-layout table, and every table
/// row its block shows beside it.
fn check_run(args: &[String], out: &Output, block: &[String]) {
    let stdout = text(&out.stdout);
    let ctx = format!("run {}:\n{stdout}{}", args.join(" "), text(&out.stderr));
    assert!(out.status.success(), "{ctx}");
    let i = args.iter().position(|a| a == "--strategy");
    let strategies: Vec<&String> = match i {
        Some(i) => args[i + 1..]
            .iter()
            .take_while(|a| !a.starts_with("--"))
            .collect(),
        None => vec![],
    };
    assert!(!strategies.is_empty(), "{ctx}");
    assert!(
        stdout.contains("| scenario / round | strategy | TTFT P95 s |"),
        "{ctx}"
    );
    for s in strategies {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(&format!("{s}: reasons "))),
            "{s}: {ctx}"
        );
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(&format!("| trace | {s} |"))),
            "{s}: {ctx}"
        );
    }
    for shown in block.iter().filter(|l| l.starts_with("| ")) {
        assert!(
            stdout.lines().any(|l| l == shown),
            "the README shows {shown:?}: {ctx}"
        );
    }
}

#[test]
fn runnable_examples_run_as_written_and_print_what_the_readme_says() {
    let md = sim_readme();
    let examples = runnable_examples(&md);
    let md = &md;
    let by_sub = |s: &str| examples.iter().filter(|(c, _)| c.sub == s).count();
    assert_eq!(by_sub("bar"), 3, "{examples:?}");
    assert_eq!(by_sub("run"), 6, "{examples:?}");
    assert_eq!(by_sub("serve"), 1, "{examples:?}");
    assert_eq!(by_sub("suite"), 2, "{examples:?}");
    // The simulations at once (2 cores: about 5 s), the server meanwhile.
    std::thread::scope(|scope| {
        for (c, block) in &examples {
            let args = shell_words(&c.rest);
            match c.sub.as_str() {
                "bar" | "run" => {
                    scope.spawn(move || {
                        let t = Instant::now();
                        let out = bin().arg(&c.sub).args(&args).output().expect("runs");
                        println!("{} ({:.1?})", c.line, t.elapsed());
                        if c.sub == "bar" {
                            check_bar(&args, &out);
                            if args.iter().any(|a| a == "--orders") {
                                check_order_ranges(md, &text(&out.stdout));
                            }
                        } else {
                            check_run(&args, &out, block);
                        }
                    });
                }
                "serve" => check_serve(&args, block),
                // Run and compared with the section's tables by readme/suite.rs.
                "suite" => {}
                other => panic!("no check for a runnable `{other}` example: {}", c.line),
            }
        }
    });
}

// ---------------------------------------------------------------------------------------------
// The study.

/// The table rows of a markdown table whose header line starts with `header`.
fn table_rows<'a>(md: &'a str, header: &str) -> Vec<&'a str> {
    let mut lines = md.lines().skip_while(|l| !l.starts_with(header));
    assert!(lines.next().is_some(), "no table {header}");
    lines
        .skip(1) // |---|
        .take_while(|l| l.starts_with('|'))
        .collect()
}

/// The cells of a printed table's rows (between the outer pipes), header and rule excluded.
fn cells(out: &str, header: &str) -> Vec<Vec<String>> {
    table_rows(out, header)
        .iter()
        .map(|r| {
            r.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_owned())
                .collect()
        })
        .collect()
}

#[test]
fn study_prints_the_readmes_tables_and_writes_what_out_lists() {
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("readme-study");
    let _ = std::fs::remove_dir_all(&out_dir);
    let out = bin()
        .args(["study", "--out"])
        .arg(&out_dir)
        .output()
        .expect("runs");
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let printed: BTreeSet<&str> = stdout.lines().collect();

    // sim/README.md: the study's three strategies' rows, as printed.
    let sim_md = sim_readme();
    let rows = table_rows(&sim_md, "| scenario / round | strategy |");
    assert_eq!(rows.len(), 24);
    for row in rows {
        assert!(printed.contains(row), "{row} not printed:\n{stdout}");
    }
    // Four strategies × four scenarios × two rounds, in the study table and the cached-tokens
    // table after it.
    for header in [
        "| scenario / round | strategy | TTFT P95 s |",
        "| scenario / round | strategy | predicted cached |",
    ] {
        assert_eq!(table_rows(&stdout, header).len(), 32, "{header}\n{stdout}");
    }
    assert!(stdout.contains("simulated 32 phases"), "{stdout}");

    // The top-level README's table: "TTFT P95 / SLO" per phase and strategy, rounded.
    let top = top_readme();
    let header = "| phase | random | least-request | prefix-cache | **least-ttft** |";
    let strategies = ["random", "least-request", "prefix-cache", "least-ttft"];
    let rows = table_rows(&top, header);
    assert_eq!(rows.len(), 8);
    for row in rows {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let phase = cells[1].split(" (").next().unwrap();
        for (strategy, cell) in strategies.iter().zip(&cells[2..6]) {
            let cell = cell.trim_matches('*');
            let (ttft, slo) = cell.split_once(" s / ").expect("T s / N");
            let printed_row = stdout
                .lines()
                .find(|l| l.starts_with(&format!("| {phase} | {strategy} |")))
                .unwrap_or_else(|| panic!("no row {phase} {strategy}"));
            let p: Vec<&str> = printed_row.split('|').map(str::trim).collect();
            let (p_ttft, p_slo): (f64, &str) = (p[3].parse().unwrap(), p[6]);
            let decimals = ttft.split_once('.').map_or(0, |(_, d)| d.len()) as i32;
            let t: f64 = ttft.parse().unwrap();
            assert!(
                (t - p_ttft).abs() <= 0.5 * 10f64.powi(-decimals) + 1e-9 && slo == p_slo,
                "top-level README {phase} {strategy}: {cell}, printed {p_ttft} s / {p_slo}"
            );
        }
    }

    // --out: records.jsonl, summary.json and ttft-SCENARIO.svg.
    let mut files: Vec<String> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "records.jsonl",
            "summary.json",
            "ttft-cold.svg",
            "ttft-hot50.svg",
            "ttft-hot90.svg",
            "ttft-warm.svg"
        ]
    );
    let records = read(&out_dir.join("records.jsonl"));
    assert_eq!(records.lines().count(), 32 * 96);
    let _ = std::fs::remove_dir_all(&out_dir);
}

/// The within-SLO counts of a study run's rows for one phase label prefix and strategy.
fn slo(stdout: &str, phase: &str, strategy: &str) -> u32 {
    let row = stdout
        .lines()
        .find(|l| l.starts_with(&format!("| {phase} | {strategy} |")))
        .unwrap_or_else(|| panic!("no row {phase} {strategy}:\n{stdout}"));
    row.split('|')
        .map(str::trim)
        .nth(6)
        .unwrap()
        .parse()
        .unwrap()
}

fn study(args: &[&str]) -> String {
    let out = bin().arg("study").args(args).output().expect("runs");
    assert!(
        out.status.success(),
        "study {args:?}: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

#[test]
fn the_numbers_the_prose_quotes_from_study_flags_are_current() {
    let md = sim_readme().replace('\n', " ");
    // --router-max-seqs: "told 256 instead of 8, least-ttft gets hot50/1 A/96 and hot90/1 B/96
    // instead of C and D".
    let told = study(&[
        "--round",
        "1",
        "--strategy",
        "least-ttft",
        "--router-max-seqs",
        "256",
    ]);
    let default = study(&["--round", "1", "--strategy", "least-ttft"]);
    let claim = format!(
        "told 256 instead of 8, least-ttft gets hot50/1 {}/96 and hot90/1 {}/96 instead of {} and {}",
        slo(&told, "hot50 / 1", "least-ttft"),
        slo(&told, "hot90 / 1", "least-ttft"),
        slo(&default, "hot50 / 1", "least-ttft"),
        slo(&default, "hot90 / 1", "least-ttft"),
    );
    assert!(md.contains(&claim), "sim/README.md should say: {claim}");

    // --arrivals poisson: "least-request falls to A–B/96 in hot50 (both rounds), warm/2 and
    // hot90/2".
    let poisson = study(&["--arrivals", "poisson", "--strategy", "least-request"]);
    let counts: Vec<u32> = ["hot50 / 1", "hot50 / 2", "warm / 2", "hot90 / 2"]
        .iter()
        .map(|p| slo(&poisson, p, "least-request"))
        .collect();
    let claim = format!(
        "least-request falls to {}–{}/96 in hot50 (both rounds), warm/2 and hot90/2",
        counts.iter().min().unwrap(),
        counts.iter().max().unwrap()
    );
    assert!(md.contains(&claim), "sim/README.md should say: {claim}");
}

// ---------------------------------------------------------------------------------------------
// The ignored simulation tests.

#[test]
fn the_readmes_command_for_the_ignored_tests_is_make_test_sims() {
    let md = sim_readme();
    let section = section(&md, "## Fidelity tests");
    let (_, prose) = split_fences(&section.lines);
    let spans = spans_by_paragraph(&prose).concat();
    let readme_cmd = spans
        .iter()
        .find(|s| s.starts_with("cargo test") && s.contains("--ignored"))
        .expect("a cargo test command with --ignored");
    assert!(prose.join(" ").contains("`make test-sim`"));

    let mk = read(&repo_root().join("mk/sim.mk"));
    let makefile = read(&repo_root().join("Makefile"));
    let cargo_test = makefile
        .lines()
        .find_map(|l| l.strip_prefix("CARGO_TEST := "))
        .expect("CARGO_TEST in the root Makefile");
    let recipe = mk
        .lines()
        .skip_while(|l| !l.starts_with("test-sim:"))
        .nth(1)
        .expect("a test-sim recipe");
    let words = |s: &str| -> Vec<String> {
        s.replace("$(CARGO_TEST)", cargo_test)
            .replace("$(CARGO)", "cargo")
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(words(readme_cmd), words(recipe), "README vs mk/sim.mk");
    // The test targets it names are the ones with tests ignored in builds with debug
    // assertions, all of them.
    let mut named: Vec<String> = words(readme_cmd)
        .windows(2)
        .filter(|w| w[0] == "--test")
        .map(|w| w[1].clone())
        .collect();
    named.sort();
    let tests_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut ignoring: Vec<String> = std::fs::read_dir(tests_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .filter(|p| read(p).contains("#[cfg_attr(\n    debug_assertions,\n    ignore"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    ignoring.sort();
    assert_eq!(named, ignoring, "make test-sim's --test names vs sim/tests");
}
