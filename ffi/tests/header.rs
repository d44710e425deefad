//! `include/kvroute.h` is generated from this crate by the cbindgen library (version pinned in
//! `ffi/Cargo.toml` and `Cargo.lock`) and committed, together with an identical copy in the Go
//! package, `ffi/go/kvroute.h` (the Go package compiles against its own copy so that it builds
//! outside a checkout). This test regenerates the header and fails when either committed file
//! differs. To update both after changing the API:
//!
//! ```sh
//! KVROUTE_BLESS=1 cargo test -p kvroute-ffi --test header
//! ```

use std::path::Path;

fn config() -> cbindgen::Config {
    let mut c = cbindgen::Config {
        language: cbindgen::Language::C,
        header: Some(
            "/*\n * kvroute: a KV-cache-aware request router for LLM inference fleets, as a C library.\n *\n * Generated from ffi/src by cbindgen; do not edit. Conventions (ownership, NULL, out-buffers,\n * threads, panics, versioning): ffi/README.md.\n */"
                .into(),
        ),
        include_guard: Some("KVROUTE_H".into()),
        cpp_compat: true,
        no_includes: true,
        sys_includes: vec!["stdbool.h".into(), "stddef.h".into(), "stdint.h".into()],
        after_includes: Some(format!("\n{}", kvroute::version::header_macros())),
        usize_is_size_t: true,
        style: cbindgen::Style::Both,
        documentation_style: cbindgen::DocumentationStyle::Doxy,
        ..Default::default()
    };
    c.enumeration.prefix_with_name = true;
    c.enumeration.rename_variants = cbindgen::RenameRule::ScreamingSnakeCase;
    c.export.include = vec![
        "kvroute_status".into(),
        "kvroute_reason".into(),
        "kvroute_outcome".into(),
        "kvroute_health_event".into(),
    ];
    c
}

fn generate() -> String {
    let crate_dir = env!("CARGO_MANIFEST_DIR");
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config())
        .generate()
        .expect("cbindgen parses the crate")
        .write(&mut out);
    String::from_utf8(out).expect("cbindgen writes UTF-8")
}

/// The committed copies of the header, from the repository's root: the C one and the Go
/// package's.
const COPIES: [&str; 2] = ["include/kvroute.h", "ffi/go/kvroute.h"];

#[test]
fn committed_header_matches_the_code() {
    let fresh = generate();
    for copy in COPIES {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(copy);
        if std::env::var_os("KVROUTE_BLESS").is_some() {
            std::fs::write(&path, &fresh).unwrap_or_else(|e| panic!("write {copy}: {e}"));
            continue;
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == fresh,
            "{copy} is out of date with ffi/src; regenerate include/kvroute.h and ffi/go/kvroute.h with\n  KVROUTE_BLESS=1 cargo test -p kvroute-ffi --test header\nand commit them. First differing line:\n{}",
            first_difference(&committed, &fresh)
        );
    }
}

fn first_difference(a: &str, b: &str) -> String {
    for (i, (x, y)) in a.lines().zip(b.lines()).enumerate() {
        if x != y {
            return format!("line {}:\n  committed: {x}\n  generated: {y}", i + 1);
        }
    }
    format!(
        "lengths differ: committed {} lines, generated {} lines",
        a.lines().count(),
        b.lines().count()
    )
}
