//! Running cargo from a test as a user would: without the variables cargo sets for the test
//! itself.
//!
//! A test process inherits `CARGO_MANIFEST_DIR`, `CARGO_PKG_*` and the like from `cargo test`.
//! A build script that watches one of them (ring's does) sees another value in a cargo started
//! from the test, so that cargo rebuilds it and everything above it (rustls, tonic,
//! kvroute-ext-proc: about 12 s on 2 cores), and the next `cargo test` rebuilds them again.

use std::process::Command;

/// Whether cargo set `name` for the running test (or a build script), as opposed to the user.
fn set_by_cargo(name: &str) -> bool {
    name == "CARGO"
        || name == "OUT_DIR"
        || name == "CARGO_CRATE_NAME"
        || name == "CARGO_PRIMARY_PACKAGE"
        || name == "CARGO_TARGET_TMPDIR"
        || name == "CARGO_RUSTC_CURRENT_DIR"
        || name.starts_with("CARGO_MANIFEST_")
        || name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_BIN_")
}

/// Removes from `cmd`'s environment what cargo set for the running test.
pub fn remove_test_env(cmd: &mut Command) {
    for (name, _) in std::env::vars() {
        if set_by_cargo(&name) {
            cmd.env_remove(&name);
        }
    }
}

/// `cargo build -q -p PACKAGE...` as a user would run it (in the test's package directory, in
/// the same workspace); fails the test if the build fails. Callers select kvroute-sim beside
/// the package they need, as `make test` does (the root Makefile's `CARGO_TEST`): that
/// selection resolves the features of the build the tests came from, so nothing is built again.
pub fn build(packages: &[&str]) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-q"]);
    for p in packages {
        cmd.args(["-p", p]);
    }
    remove_test_env(&mut cmd);
    let status = cmd.status().expect("run cargo build");
    assert!(status.success(), "cargo build -p {packages:?} failed");
}
