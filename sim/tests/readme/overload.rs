//! sim/README.md's `kvroute-sim overload` section against the binary: its two tables are what
//! the command prints, and the ranges its prose quotes are those tables' (and the study
//! check's, for the phases below saturation).

use super::*;

fn number(cell: &str) -> f64 {
    let n: String = cell
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    n.parse().unwrap_or_else(|_| panic!("a number in {cell:?}"))
}

fn span(values: impl Iterator<Item = f64>, digits: usize) -> String {
    let v: Vec<f64> = values.collect();
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{lo:.digits$}–{hi:.digits$}")
}

#[test]
fn the_overload_tables_and_numbers_are_what_overload_prints() {
    let md = sim_readme();
    let section = section(&md, "## `kvroute-sim overload`");
    let out = bin().arg("overload").output().expect("runs");
    assert!(out.status.success());
    let out = text(&out.stdout);
    let body = section.lines.join("\n");
    for header in [
        "| workload | contender |",
        "| workload | goodput with admission",
    ] {
        let want = table_rows(&out, header);
        assert!(!want.is_empty(), "{header} in\n{out}");
        assert_eq!(
            table_rows(&body, header),
            want,
            "the section's table vs\n{out}"
        );
    }

    let rows = cells(&out, "| workload | contender |");
    let admitted = |r: &&Vec<String>| r[1].ends_with("+ admission");
    let routing: Vec<&Vec<String>> = rows.iter().filter(|r| !admitted(r)).collect();
    let with: Vec<&Vec<String>> = rows.iter().filter(admitted).collect();
    let plain = |r: &&&Vec<String>| !r[0].contains("priorities");
    let ratios = cells(&out, "| workload | goodput with admission");
    let checks =
        kvroute_sim::overload::study_check(&kvroute_sim::study::StudyConfig::default()).unwrap();
    let shedding: Vec<_> = checks.iter().filter(|c| c.shed > 0).collect();
    let identical: Vec<&str> = checks
        .iter()
        .filter(|c| c.differ == 0)
        .map(|c| c.label.as_str())
        .collect();
    assert_eq!(
        identical,
        [
            "warm / 1",
            "hot90 / 1",
            "warm / 2",
            "hot50 / 2",
            "hot90 / 2"
        ]
    );
    let list = |f: &dyn Fn(&kvroute_sim::overload::StudyCheck) -> usize| {
        let v: Vec<String> = shedding.iter().map(|c| f(c).to_string()).collect();
        format!("{}, {} and {}", v[0], v[1], v[2])
    };
    let text = body.split_whitespace().collect::<Vec<_>>().join(" ");
    let claims = [
        format!(
            "Routing alone keeps {} of 96 or 192",
            span(routing.iter().map(|r| number(&r[2])), 0)
        ),
        format!(
            "TTFT P95 grows to {} s",
            span(routing.iter().map(|r| number(&r[5])), 0)
        ),
        format!(
            "least-ttft keeps {}× the goodput",
            span(ratios.iter().map(|r| number(&r[1])), 1)
        ),
        format!(
            "sheds {}% of the requests",
            span(with.iter().map(|r| number(&r[4])), 0)
        ),
        format!(
            "start within {} s at P95 ({:.1} s with priorities",
            span(with.iter().filter(plain).map(|r| number(&r[5])), 1),
            with.iter()
                .find(|r| !plain(r))
                .map(|r| number(&r[5]))
                .unwrap()
        ),
        format!(
            "it sheds {} request and keeps {} within the SLO ({} without)",
            list(&|c| c.shed),
            list(&|c| c.within_slo_on),
            list(&|c| c.within_slo_off)
        ),
    ];
    for claim in claims {
        assert!(text.contains(&claim), "sim/README.md should say: {claim}");
    }
    let top = top_readme()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let claim = format!(
        "keeps {}× the goodput of the best of random, least-request and prefix-cache",
        span(ratios.iter().map(|r| number(&r[1])), 1)
    );
    assert!(top.contains(&claim), "README.md should say: {claim}");
    assert!(
        with.iter().all(|r| r[8] == "–" || number(&r[8]) == 0.0),
        "no sheddable request served over a critical one"
    );
}
