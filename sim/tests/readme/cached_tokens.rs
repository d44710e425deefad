//! `readme.rs`: the section on predicted and actual cached tokens (eviction and skewed4).

use super::*;

/// The section on predicted and actual cached tokens: its cached-tokens tables are printed, each
/// by one of the four runs it names (index and events, at the study's rate and at half), and its skewed4 table's "TTFT P95 / SLO" cells are those
/// runs' study rows.
#[test]
fn the_cached_tokens_tables_are_what_study_prints() {
    let md = sim_readme();
    let section = sections(&md)
        .into_iter()
        .find(|s| {
            s.heading
                .starts_with("## Predicted and actual cached tokens")
        })
        .expect("a section on predicted and actual cached tokens");
    let base = "--phases eviction,skewed4 --strategy random least-request prefix-cache least-ttft";
    let prose = section.lines.join(" ");
    assert!(prose.contains(&format!(
        "`kvroute-sim study {base} --router-blocks tokens`"
    )));
    let run = |extra: &str| {
        study(
            &shell_words(&format!("{base} {extra}"))
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        )
    };
    assert!(prose.contains(&format!(
        "`kvroute-sim study {base} --router-blocks tokens --rate 0.8`"
    )));
    let (index, events) = (run("--router-blocks tokens"), run("--kv-events"));
    let half = [
        run("--router-blocks tokens --rate 0.8"),
        run("--kv-events --rate 0.8"),
    ];
    let printed = |out: &str, row: &str| out.lines().any(|l| l == row);
    let mut tables = 0;
    for table in section.lines.split(|l| !l.starts_with('|')) {
        let rows: Vec<&String> = table
            .iter()
            .filter(|l| l.starts_with("| eviction / "))
            .collect();
        if rows.is_empty() {
            continue;
        }
        tables += 1;
        assert!(
            [&index, &events, &half[0], &half[1]]
                .iter()
                .any(|out| rows.iter().all(|r| printed(out, r))),
            "a table of rows not all printed by one run:\n{}\n--- index:\n{index}\n--- events:\n{events}",
            table.join("\n")
        );
    }
    assert_eq!(tables, 4);
    let rows = table_rows(&md, "| skewed4 / round |");
    assert_eq!(rows.len(), 4);
    for row in rows {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let (round, source) = cells[1].split_once(", ").unwrap();
        let out = if source == "index" { &index } else { &events };
        for (strategy, cell) in ["prefix-cache", "least-request", "least-ttft"]
            .iter()
            .zip(&cells[2..5])
        {
            let printed_row = out
                .lines()
                .find(|l| l.starts_with(&format!("| skewed4 / {round} | {strategy} |")))
                .unwrap_or_else(|| panic!("no skewed4 / {round} {strategy}"));
            let p: Vec<&str> = printed_row.split('|').map(str::trim).collect();
            let want = format!("{} / {}", p[3], p[6]);
            assert!(
                cell.starts_with(&want),
                "skewed4 {round} {source} {strategy}: {cell}, printed {want}"
            );
        }
    }
}
