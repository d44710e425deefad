//! The panic boundary around every exported function.
//!
//! Since Rust 1.81 a panic that unwinds out of an `extern "C"` function aborts the process.
//! [`ffi_panic_boundary!`] catches it first and returns a fallback chosen by the function's
//! return type ([`PanicOrDefault`]): `KVROUTE_STATUS_PANIC` for status-returning functions, NULL
//! for pointers, and a documented neutral value for the few plain-value functions. This only
//! works while the crate is built with `panic = "unwind"` (the default; the workspace profiles
//! do not change it).
//!
//! A panic while the router's lock is held also poisons the router (see `router.rs`).

use crate::status::kvroute_status;

/// The value an exported function returns when its body panicked.
///
/// Implemented per type on purpose, not as a blanket impl over `Default`: every return type of
/// the C API must decide explicitly what "panicked" looks like to a C caller.
pub(crate) trait PanicOrDefault {
    fn value() -> Self;
}

impl PanicOrDefault for kvroute_status {
    fn value() -> Self {
        kvroute_status::Panic
    }
}

impl<T> PanicOrDefault for *const T {
    fn value() -> Self {
        core::ptr::null()
    }
}

impl<T> PanicOrDefault for *mut T {
    fn value() -> Self {
        core::ptr::null_mut()
    }
}

impl PanicOrDefault for u32 {
    fn value() -> Self {
        0
    }
}

impl PanicOrDefault for () {
    fn value() -> Self {}
}

/// Runs the body, turning a panic into the return type's [`PanicOrDefault`] value.
macro_rules! ffi_panic_boundary {
    ( $($tt:tt)* ) => {
        match ::std::panic::catch_unwind(::std::panic::AssertUnwindSafe(|| { $($tt)* })) {
            Ok(value) => value,
            Err(_) => <_ as $crate::panic::PanicOrDefault>::value(),
        }
    };
}

/// Evaluates a `Result<T, kvroute_status>`, returning the status from the enclosing function
/// (or panic-boundary closure) on error.
macro_rules! try_status {
    ( $e:expr ) => {
        match $e {
            Ok(value) => value,
            Err(status) => return ::core::convert::From::from(status),
        }
    };
}
