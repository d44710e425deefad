//! `kvroute-sim bar`: the table, the summary line and the exit status (0 cleared, 1 missed,
//! 2 bad arguments).

use std::process::{Command, Output};

fn bar(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvroute-sim"))
        .arg("bar")
        .args(args)
        .output()
        .expect("kvroute-sim runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn least_ttft_clears_the_bar_on_round_one_and_random_does_not() {
    let ours = bar(&["--round", "1"]);
    let text = stdout(&ours);
    assert_eq!(ours.status.code(), Some(0), "{text}");
    assert_eq!(text.lines().filter(|l| l.starts_with("| 0 |")).count(), 4);
    assert!(
        text.contains("least-ttft: 0 misses in 0 of 4 phases (1 draws × 1 family orders)"),
        "{text}"
    );

    let random = bar(&["--round", "1", "--candidate", "random", "--draws", "2"]);
    let text = stdout(&random);
    assert_eq!(random.status.code(), Some(1), "{text}");
    assert_eq!(text.lines().filter(|l| l.starts_with("| 1 |")).count(), 4);
    assert!(text.contains("within SLO <"), "{text}");
    assert!(
        text.contains("of 8 phases (2 draws × 1 family orders)"),
        "{text}"
    );
}

#[test]
fn other_family_orders_are_labelled_and_summarised() {
    let o = bar(&["--round", "2", "--order", "3", "--orders", "2"]);
    let text = stdout(&o);
    assert!(matches!(o.status.code(), Some(0 | 1)), "{text}");
    for label in ["| 0/3 | cold / 2 |", "| 0/4 | hot90 / 2 |"] {
        assert!(text.contains(label), "{label}: {text}");
    }
    // The summary: one row per phase over both orders.
    assert!(text.contains("| phase | draws |"), "{text}");
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("| cold / 2 | 2 |"))
            .count(),
        1
    );
    assert!(text.contains("(1 draws × 2 family orders)"), "{text}");
    // Another order sends other requests: the study's order gives other numbers.
    let study = stdout(&bar(&["--round", "2"]));
    let row = |t: &str, prefix: &str| {
        t.lines()
            .find(|l| l.starts_with(prefix))
            .map(|l| l.split('|').skip(3).collect::<Vec<_>>().join("|"))
    };
    assert_ne!(
        row(&study, "| 0 | cold / 2 |"),
        row(&text, "| 0/3 | cold / 2 |")
    );
}

#[test]
fn bad_arguments_exit_with_2_and_say_which() {
    for (args, flag) in [
        (&["--candidate", "nope"][..], "--candidate"),
        (&["--ttft-ratio", "0"][..], "--ttft-ratio"),
        (&["--prior-scale=-1"][..], "--prior-scale"),
        (&["--draws", "0"][..], "--draws"),
        (&["--orders", "0"][..], "--orders"),
    ] {
        let o = bar(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(flag), "{args:?}: {err}");
    }
}
