//! The sans-IO contract for the optional `json` feature (`kvroute_core::body`): with it,
//! kvroute-core's normal dependency tree may add serde, serde_json and their pure-computation
//! dependencies, nothing else. (`no_io_dependencies.rs` checks the default build.)

use std::collections::BTreeSet;
use std::process::Command;

const ALLOWED: &[&str] = &[
    // The default build's allow-list (no_io_dependencies.rs).
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
    // The `json` feature's.
    "serde",
    "serde_core",
    "serde_derive",
    "serde_json",
    "itoa",
    "memchr",
    "zmij",
];

#[test]
fn json_feature_dependencies_are_all_allow_listed() {
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "-p",
            "kvroute-core",
            "--features",
            "json",
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
        names.contains("serde_json"),
        "unexpected cargo tree output: {names:?}"
    );
    let extra: Vec<&String> = names
        .iter()
        .filter(|n| !ALLOWED.contains(&n.as_str()))
        .collect();
    assert!(
        extra.is_empty(),
        "kvroute-core --features json gained dependencies outside the no-IO allow-list: {extra:?}"
    );
}
