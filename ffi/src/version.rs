//! The library version. Its only source is `version` in the workspace `Cargo.toml`: the runtime
//! values below come from Cargo's environment at compile time, and the header's
//! `KVROUTE_VERSION*` macros are written from the same values when the header is generated
//! (`ffi/tests/header.rs`), which fails if they drift.

use std::ffi::c_char;

/// `major.minor.patch`, NUL-terminated.
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");

const fn parse(s: &str) -> u32 {
    let b = s.as_bytes();
    let mut i = 0;
    let mut n = 0u32;
    while i < b.len() {
        assert!(b[i].is_ascii_digit(), "version component is not a number");
        n = n * 10 + (b[i] - b'0') as u32;
        i += 1;
    }
    n
}

/// The major version.
pub(crate) const MAJOR: u32 = parse(env!("CARGO_PKG_VERSION_MAJOR"));
/// The minor version.
pub(crate) const MINOR: u32 = parse(env!("CARGO_PKG_VERSION_MINOR"));
/// The patch version.
pub(crate) const PATCH: u32 = parse(env!("CARGO_PKG_VERSION_PATCH"));
/// `(MAJOR << 16) | (MINOR << 8) | PATCH`, the value of `KVROUTE_VERSION_NUMBER`.
pub(crate) const NUMBER: u32 = (MAJOR << 16) | (MINOR << 8) | PATCH;

const _: () = assert!(
    MINOR < 256 && PATCH < 256,
    "KVROUTE_VERSION_NUMBER packs minor and patch in 8 bits each"
);

/// The version of the library actually linked, `"major.minor.patch"` (compare with the
/// header's `KVROUTE_VERSION`).
///
/// Returns a static NUL-terminated string that the caller must not free. Never NULL.
#[no_mangle]
pub extern "C" fn kvroute_version() -> *const c_char {
    ffi_panic_boundary! { VERSION.as_ptr().cast() }
}

/// The version of the library actually linked as one number,
/// `(major << 16) | (minor << 8) | patch` (compare with the header's `KVROUTE_VERSION_NUMBER`).
#[no_mangle]
pub extern "C" fn kvroute_version_number() -> u32 {
    ffi_panic_boundary! { NUMBER }
}

/// The `#define`s the generated header carries, derived from the same constants.
pub fn header_macros() -> String {
    format!(
        "#define KVROUTE_VERSION \"{}\"\n#define KVROUTE_VERSION_MAJOR {MAJOR}\n#define KVROUTE_VERSION_MINOR {MINOR}\n#define KVROUTE_VERSION_PATCH {PATCH}\n#define KVROUTE_VERSION_NUMBER ((KVROUTE_VERSION_MAJOR << 16) | (KVROUTE_VERSION_MINOR << 8) | KVROUTE_VERSION_PATCH)",
        env!("CARGO_PKG_VERSION")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_packs_the_cargo_version() {
        let parts: Vec<u32> = env!("CARGO_PKG_VERSION")
            .split('.')
            .map(|p| p.parse().unwrap())
            .collect();
        assert_eq!(parts, [MAJOR, MINOR, PATCH]);
        assert_eq!(
            kvroute_version_number(),
            (parts[0] << 16) | (parts[1] << 8) | parts[2]
        );
    }
}
