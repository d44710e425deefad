//! Gives the shared library an SONAME of the exact version (`libkvroute.so.0.1.0`): before 1.0
//! there is no ABI promise between versions, so programs must load the version they were
//! linked against. `make install` creates the matching file and the `libkvroute.so` link.

fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        let version = std::env::var("CARGO_PKG_VERSION").expect("cargo sets CARGO_PKG_VERSION");
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libkvroute.so.{version}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
