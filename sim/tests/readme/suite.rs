//! sim/README.md's `kvroute-sim suite` section against the binary: the workload list is what
//! `--list` prints, the tables are what `suite` and the section's example print, and the
//! workloads the prose says least-ttft is behind on are those the verdicts say.

use super::*;

/// The section's markdown tables, each as its rows (header and rule included), in order.
fn md_tables(body: &str) -> Vec<Vec<&str>> {
    let mut out: Vec<Vec<&str>> = vec![];
    let mut in_table = false;
    for line in body.lines() {
        if line.starts_with('|') {
            if !in_table {
                out.push(vec![]);
            }
            out.last_mut().expect("pushed").push(line);
            in_table = true;
        } else {
            in_table = false;
        }
    }
    out
}

fn suite(args: &[&str]) -> Output {
    let out = bin().arg("suite").args(args).output().expect("runs");
    assert!(
        out.status.success() || out.status.code() == Some(1),
        "suite {args:?}: {}",
        text(&out.stderr)
    );
    out
}

#[test]
fn the_suite_section_shows_what_suite_prints() {
    let md = sim_readme();
    let section = section(&md, "## `kvroute-sim suite`");
    let body = section.lines.join("\n");
    let tables = md_tables(&body);
    assert_eq!(
        tables.len(),
        7,
        "workloads, suite's two, the example's two, envoy feedback's verdicts, the settings"
    );

    // The workload list.
    let list = text(&suite(&["--list"]).stdout);
    let listed: Vec<String> = list
        .lines()
        .map(|l| {
            let mut words = l.splitn(3, char::is_whitespace).filter(|w| !w.is_empty());
            let name = words.next().unwrap_or_default().to_owned();
            let rest = l[name.len()..].trim_start();
            let (family, about) = rest.split_once(char::is_whitespace).expect("three columns");
            format!("| {name} | {family} | {} |", about.trim_start())
        })
        .collect();
    assert_eq!(listed.len(), 9, "{list}");
    assert_eq!(tables[0][2..], listed[..], "--list");

    // The full suite, and the example the section gives.
    let full = text(&suite(&[]).stdout);
    let command = section
        .lines
        .iter()
        .find(|l| l.starts_with("kvroute-sim suite --"))
        .expect("the example");
    let args = shell_words(command.trim_start_matches("kvroute-sim suite"));
    let example = suite(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(example.status.code(), Some(0), "without --require");
    let example = text(&example.stdout);
    assert!(
        section
            .lines
            .iter()
            .any(|l| *l == "kvroute-sim suite --feedback envoy"),
        "the envoy feedback command"
    );
    let envoy = text(&suite(&["--feedback", "envoy"]).stdout);
    for (shown, printed) in [
        (&tables[1], &full),
        (&tables[2], &full),
        (&tables[3], &example),
        (&tables[4], &example),
        (&tables[5], &envoy),
    ] {
        let want = table_rows(printed, shown[0]);
        assert_eq!(shown[2..], want[..], "{}\n{printed}", shown[0]);
    }

    // The prose names, in bold, the workloads least-ttft is behind on.
    let behind: Vec<&str> = tables[2][2..]
        .iter()
        .filter(|r| r.ends_with("| behind |"))
        .map(|r| {
            r.trim_start_matches("| ")
                .split(' ')
                .next()
                .unwrap_or_default()
        })
        .collect();
    let bold: Vec<&str> = section
        .lines
        .iter()
        .filter_map(|l| l.strip_prefix("- **")?.split("**").next())
        .collect();
    assert_eq!(bold, behind, "the bullets vs the verdicts");
    let summary = full
        .lines()
        .find(|l| l.starts_with("least-ttft: as good as the best other on"))
        .expect("a summary line");
    assert!(body.contains(summary), "{summary}");

    // The settings table: each row's verdicts from a run with that one setting.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("readme-suite");
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let rows = &tables[6][2..];
    let printed: Vec<String> = std::thread::scope(|scope| {
        let runs: Vec<_> = rows
            .iter()
            .enumerate()
            .map(|(i, row)| {
                let dir = &dir;
                scope.spawn(move || {
                    let label = row
                        .trim_start_matches("| ")
                        .split(" |")
                        .next()
                        .unwrap_or("");
                    let mut args = vec![];
                    let path = dir.join(format!("setting-{i}.toml"));
                    if let Some(setting) = label.strip_prefix('`') {
                        let setting = setting.trim_end_matches('`');
                        std::fs::write(&path, format!("[ttft]\n{setting}\n")).expect("written");
                        args = vec!["--router-config".to_owned(), path.display().to_string()];
                    } else {
                        assert!(label.starts_with("the defaults"), "{row}");
                    }
                    let out =
                        text(&suite(&args.iter().map(String::as_str).collect::<Vec<_>>()).stdout);
                    settings_row(label, &out)
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().expect("a run")).collect()
    });
    assert_eq!(rows, printed, "the settings table");
}

/// A row of the settings table from `suite`'s output: how many verdicts are "as good", the
/// candidate's mean within-SLO share over the workloads, the workloads it is behind on.
fn settings_row(label: &str, out: &str) -> String {
    let cells = cells(out, "| workload | least-ttft within SLO %");
    let as_good = |c: &&Vec<String>| c.last().is_some_and(|v| v == "as good");
    let good = cells.iter().filter(as_good).count();
    let mean = cells
        .iter()
        .map(|c| c[1].parse::<f64>().expect("a share"))
        .sum::<f64>()
        / cells.len() as f64;
    let behind: Vec<&str> = cells
        .iter()
        .filter(|c| !as_good(c))
        .map(|c| c[0].as_str())
        .collect();
    let behind = if behind.is_empty() {
        "–".to_owned()
    } else {
        behind.join(", ")
    };
    format!(
        "| {label} | {good} of {} | {mean:.1} | {behind} |",
        cells.len()
    )
}
