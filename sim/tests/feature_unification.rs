//! `make test` builds the workspace once (`cargo test --workspace`), then runs more cargo
//! commands: the Quick starts' builds, the envoy README's `cargo run --bin kvroute-ext-proc`, and
//! the test targets' `cargo test -p kvroute-ext-proc -p kvroute-sim ...` (the root Makefile's
//! `CARGO_TEST`). Each reuses that build only if it resolves every dependency with the same
//! features; a dependency resolved with other features is compiled again, with everything above
//! it (tokio under tonic, axum and hyper: about a minute per command on 2 cores).
//! sim/Cargo.toml enables, in a normal dependency, the features that only dev-dependencies
//! enabled ("Feature unification"). This test asks `cargo tree` how each of those commands
//! resolves and fails, naming the crates, when one differs from `cargo test --workspace`.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// Every crate of a resolution with its features, one line each (`name vX.Y.Z [a,b]`), as
/// `cargo tree` prints them for the given package selection and dependency kinds.
fn resolution(selection: &[&str], kinds: &str) -> BTreeSet<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(&root)
        .args([
            "tree",
            "--locked",
            "--prefix",
            "none",
            "-f",
            "{p} [{f}]",
            "-e",
            kinds,
        ])
        .args(selection)
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree {selection:?} -e {kinds}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.replace(" (*)", "").replace(" (proc-macro)", ""))
        .filter(|l| !l.trim().is_empty())
        .collect()
}

#[test]
fn make_tests_cargo_commands_resolve_the_features_of_cargo_test_workspace() {
    let workspace = resolution(&["--workspace"], "normal,build,dev");
    let commands: [(&str, &[&str], &str); 5] = [
        (
            "cargo test -p kvroute-ext-proc -p kvroute-sim (CARGO_TEST)",
            &["-p", "kvroute-ext-proc", "-p", "kvroute-sim"],
            "normal,build,dev",
        ),
        (
            "cargo test -p kvroute-envoy -p kvroute-sim",
            &["-p", "kvroute-envoy", "-p", "kvroute-sim"],
            "normal,build,dev",
        ),
        (
            "cargo build -p kvroute-ext-proc -p kvroute-sim (ext-proc Quick start)",
            &["-p", "kvroute-ext-proc", "-p", "kvroute-sim"],
            "normal,build",
        ),
        (
            "cargo build -p kvroute-envoy -p kvroute-sim (envoy-module Quick start)",
            &["-p", "kvroute-envoy", "-p", "kvroute-sim"],
            "normal,build",
        ),
        (
            "cargo run --bin kvroute-ext-proc (the default members, envoy/README.md)",
            &[],
            "normal,build",
        ),
    ];
    for (command, selection, kinds) in commands {
        let differs: Vec<String> = resolution(selection, kinds)
            .into_iter()
            .filter(|line| !workspace.contains(line))
            .collect();
        assert!(
            differs.is_empty(),
            "`{command}` resolves these crates with features `cargo test --workspace` does not \
             (enable them in sim/Cargo.toml's feature unification, or select the packages \
             together): {differs:#?}"
        );
    }
}
