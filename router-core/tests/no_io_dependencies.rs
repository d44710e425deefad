//! The sans-IO contract, mechanically: kvroute-core's normal dependency tree is an allow-list
//! of pure-computation crates. Adding tokio, mio, hyper, getrandom, libc, … fails this test.

use std::collections::BTreeSet;
use std::process::Command;

const ALLOWED: &[&str] = &[
    "kvroute-core",
    "xxhash-rust",
    "fastrand",
    "hashbrown",
    "ahash",
    "cfg-if",
    "once_cell",
    "version_check",
    "zerocopy",
    "zerocopy-derive",
    "proc-macro2",
    "quote",
    "syn",
    "unicode-ident",
    "smallvec",
    "thiserror",
    "thiserror-impl",
];

#[test]
fn normal_dependencies_are_all_allow_listed() {
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "-p",
            "kvroute-core",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect();
    assert!(
        names.contains("xxhash-rust"),
        "unexpected cargo tree output: {names:?}"
    );
    let extra: Vec<&String> = names
        .iter()
        .filter(|n| !ALLOWED.contains(&n.as_str()))
        .collect();
    assert!(
        extra.is_empty(),
        "kvroute-core gained dependencies outside the no-IO allow-list: {extra:?}"
    );
}
