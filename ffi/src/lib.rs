//! # kvroute-ffi
//!
//! A C ABI over `kvroute-core`, so that gateways written in C, Go or anything with a C FFI can
//! link the router in-process. The header is `include/kvroute.h`, generated from this crate by
//! cbindgen (`ffi/tests/header.rs` fails when it drifts); the calling conventions are in
//! `ffi/README.md`.
//!
//! Layout (rustls-ffi's): `handle.rs` holds every raw-pointer cast; `panic.rs` the panic
//! boundary that wraps every export; `status.rs` the stable status numbers; one module per C
//! object (`config.rs`, `router.rs`, `pods.rs`, `decision.rs`), with the router's route calls
//! in `route.rs` and what it learns from (completion outcomes and timings, engine metrics, health
//! checks) in `feedback.rs`, plus `hashing.rs`, `version.rs` and
//! `prompt.rs` (maps the core's shared extractor, `kvroute_core::body`, to C statuses).

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]
// C naming: `kvroute_router`, `kvroute_status`, ...
#![allow(non_camel_case_types)]
// Exported functions take raw pointers from C and are `extern "C" fn`, not `unsafe fn`: the
// header is their contract. Every dereference goes through `handle.rs`.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

#[macro_use]
mod panic;
#[macro_use]
mod handle;
#[macro_use]
mod bytes;

mod config;
mod decision;
mod feedback;
mod hashing;
mod pods;
pub mod prompt;
mod route;
mod router;
mod status;
#[doc(hidden)]
pub mod version;

#[cfg(test)]
mod tests;

pub use config::*;
pub use decision::*;
pub use feedback::*;
pub use hashing::*;
pub use pods::*;
pub use route::*;
pub use router::*;
pub use status::*;
pub use version::{kvroute_version, kvroute_version_number};
