//! The sans-IO contract, mechanically: kvroute-core's normal dependency tree is an allow-list
//! of pure-computation crates, in the default build and with the optional `json` feature
//! (`kvroute_core::body`). Adding tokio, mio, hyper, getrandom, libc, … fails this test.

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
    // Pure encoding (session-affinity's ids), no IO, alloc only.
    "base64",
];

/// What the `json` feature may add.
const ALLOWED_WITH_JSON: &[&str] = &[
    "serde",
    "serde_core",
    "serde_derive",
    "serde_json",
    "itoa",
    "memchr",
    "zmij",
];

/// The crate names in kvroute-core's normal dependency tree with `features`.
fn dependency_tree(features: &[&str]) -> BTreeSet<String> {
    let mut args = vec!["tree", "-p", "kvroute-core", "-e", "normal"];
    if !features.is_empty() {
        args.push("--features");
        args.extend(features);
    }
    args.extend(["--prefix", "none", "--format", "{p}"]);
    let out = Command::new(env!("CARGO"))
        .args(&args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

fn outside<'a>(names: &'a BTreeSet<String>, allowed: &[&[&str]]) -> Vec<&'a String> {
    names
        .iter()
        .filter(|n| !allowed.iter().any(|list| list.contains(&n.as_str())))
        .collect()
}

#[test]
fn normal_dependencies_are_all_allow_listed() {
    let names = dependency_tree(&[]);
    assert!(
        names.contains("xxhash-rust"),
        "unexpected cargo tree output: {names:?}"
    );
    let extra = outside(&names, &[ALLOWED]);
    assert!(
        extra.is_empty(),
        "kvroute-core gained dependencies outside the no-IO allow-list: {extra:?}"
    );
}

#[test]
fn json_feature_dependencies_are_all_allow_listed() {
    let names = dependency_tree(&["json"]);
    assert!(
        names.contains("serde_json"),
        "unexpected cargo tree output: {names:?}"
    );
    let extra = outside(&names, &[ALLOWED, ALLOWED_WITH_JSON]);
    assert!(
        extra.is_empty(),
        "kvroute-core --features json gained dependencies outside the no-IO allow-list: {extra:?}"
    );
}
