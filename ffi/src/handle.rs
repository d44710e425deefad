//! Every raw-pointer cast of the C API, in one audited file.
//!
//! The C side only ever sees opaque handle types (`kvroute_router` and friends: zero-sized
//! `#[repr(C)]` structs, forward-declared in the header). Each one implements [`Castable`], which
//! names the Rust type behind the pointer and how it is owned:
//!
//! - [`OwnershipBox`]: the pointer came from `Box::into_raw`; it is freed with [`free_box`]
//!   (or consumed with [`take_box`]) and may be borrowed mutably;
//! - [`OwnershipArc`]: the pointer came from `Arc::into_raw`; it is freed with [`free_arc`],
//!   and only ever borrowed immutably.
//!
//! Because the ownership is an associated type, freeing an `Arc` handle as a `Box` (or the
//! reverse) does not compile. The model is rustls-ffi's `ffi.rs`.
//!
//! The `try_*!` macros at the bottom are what exported functions use; they check for NULL and
//! return `KVROUTE_STATUS_NULL_PARAMETER` from the enclosing panic-boundary closure. Their safety
//! rests on the C caller honouring the header's contract: a non-NULL handle pointer came from the
//! matching `_new`/`_build` and was not freed; a non-NULL data pointer is valid for `len` bytes
//! for the duration of the call; an out-pointer is valid for writes of its type.

use std::ffi::{c_char, CStr};
use std::mem::MaybeUninit;
use std::sync::Arc;

use crate::status::kvroute_status;

/// Ownership marker: the handle is a `Box<RustType>`.
pub(crate) struct OwnershipBox;
/// Ownership marker: the handle is an `Arc<RustType>`.
pub(crate) struct OwnershipArc;

/// A C handle type and the Rust value behind it.
pub(crate) trait Castable {
    /// [`OwnershipBox`] or [`OwnershipArc`].
    type Ownership;
    /// What the pointer really points at.
    type RustType;
}

/// Moves `value` to the heap and returns the handle the C caller will own.
pub(crate) fn to_boxed_mut_ptr<C: Castable<Ownership = OwnershipBox>>(
    value: C::RustType,
) -> *mut C {
    Box::into_raw(Box::new(value)).cast()
}

/// Turns an `Arc` into the handle the C caller will own (one strong count).
pub(crate) fn to_arc_const_ptr<C: Castable<Ownership = OwnershipArc>>(
    value: Arc<C::RustType>,
) -> *const C {
    Arc::into_raw(value).cast()
}

/// Frees a boxed handle. NULL is a no-op.
///
/// # Safety
/// `ptr` is NULL or came from [`to_boxed_mut_ptr`] for the same `C` and was not freed or taken.
pub(crate) unsafe fn free_box<C: Castable<Ownership = OwnershipBox>>(ptr: *mut C) {
    if !ptr.is_null() {
        // SAFETY: per the contract, `ptr` is a live `Box<C::RustType>` we own from now on.
        drop(unsafe { Box::from_raw(ptr.cast::<C::RustType>()) });
    }
}

/// Takes ownership of a boxed handle back from C.
///
/// # Safety
/// As [`free_box`].
pub(crate) unsafe fn take_box<C: Castable<Ownership = OwnershipBox>>(
    ptr: *mut C,
) -> Result<Box<C::RustType>, kvroute_status> {
    if ptr.is_null() {
        return Err(kvroute_status::NullParameter);
    }
    // SAFETY: per the contract, `ptr` is a live `Box<C::RustType>` we own from now on.
    Ok(unsafe { Box::from_raw(ptr.cast::<C::RustType>()) })
}

/// Releases the C caller's strong count of an `Arc` handle. NULL is a no-op.
///
/// # Safety
/// `ptr` is NULL or came from [`to_arc_const_ptr`] for the same `C` and was not freed.
pub(crate) unsafe fn free_arc<C: Castable<Ownership = OwnershipArc>>(ptr: *const C) {
    if !ptr.is_null() {
        // SAFETY: per the contract, `ptr` holds one strong count, which we give up here.
        drop(unsafe { Arc::from_raw(ptr.cast::<C::RustType>()) });
    }
}

/// Borrows the value behind a handle of either ownership.
///
/// # Safety
/// `ptr` is NULL or a live handle of type `C`, not mutably borrowed elsewhere, valid for `'a`.
pub(crate) unsafe fn ref_from_ptr<'a, C: Castable>(
    ptr: *const C,
) -> Result<&'a C::RustType, kvroute_status> {
    // SAFETY: per the contract.
    unsafe { ptr.cast::<C::RustType>().as_ref() }.ok_or(kvroute_status::NullParameter)
}

/// Borrows the value behind a boxed handle mutably.
///
/// # Safety
/// `ptr` is NULL or a live boxed handle of type `C`, not borrowed elsewhere, valid for `'a`.
pub(crate) unsafe fn mut_from_ptr<'a, C: Castable<Ownership = OwnershipBox>>(
    ptr: *mut C,
) -> Result<&'a mut C::RustType, kvroute_status> {
    // SAFETY: per the contract.
    unsafe { ptr.cast::<C::RustType>().as_mut() }.ok_or(kvroute_status::NullParameter)
}

/// Borrows a plain `#[repr(C)]` input struct (not a handle) whose fields are integers and
/// floats only, so that every bit pattern is a valid value.
///
/// # Safety
/// `ptr` is NULL or valid for reads of one `T` for `'a`, suitably aligned, not written
/// meanwhile.
pub(crate) unsafe fn plain_ref<'a, T: Copy>(ptr: *const T) -> Result<&'a T, kvroute_status> {
    // SAFETY: per the contract.
    unsafe { ptr.as_ref() }.ok_or(kvroute_status::NullParameter)
}

/// Borrows `len` input bytes. `(NULL, 0)` is the empty slice; `(NULL, n > 0)` is
/// `NULL_PARAMETER`.
///
/// # Safety
/// A non-NULL `data` is valid for reads of `len` bytes for `'a` and not written meanwhile.
pub(crate) unsafe fn slice_from_ptr<'a>(
    data: *const u8,
    len: usize,
) -> Result<&'a [u8], kvroute_status> {
    if data.is_null() {
        return if len == 0 {
            Ok(&[])
        } else {
            Err(kvroute_status::NullParameter)
        };
    }
    if len > isize::MAX as usize {
        return Err(kvroute_status::InvalidParameter);
    }
    // SAFETY: per the contract; `len` fits `isize`.
    Ok(unsafe { std::slice::from_raw_parts(data, len) })
}

/// Borrows an optional input array of `len` elements: `(NULL, 0)` is `None` (no array),
/// `(NULL, n > 0)` is `NULL_PARAMETER`, and a non-NULL pointer is an array, possibly empty.
///
/// # Safety
/// A non-NULL `data` is valid for reads of `len` elements of `T` for `'a`, suitably aligned,
/// and not written meanwhile.
pub(crate) unsafe fn opt_array_from_ptr<'a, T>(
    data: *const T,
    len: usize,
) -> Result<Option<&'a [T]>, kvroute_status> {
    if data.is_null() {
        return if len == 0 {
            Ok(None)
        } else {
            Err(kvroute_status::NullParameter)
        };
    }
    if len
        .checked_mul(size_of::<T>())
        .is_none_or(|bytes| bytes > isize::MAX as usize)
    {
        return Err(kvroute_status::InvalidParameter);
    }
    // SAFETY: per the contract; the byte length fits `isize`.
    Ok(Some(unsafe { std::slice::from_raw_parts(data, len) }))
}

/// Borrows the bytes of a NUL-terminated C string, without the NUL. NULL is `NULL_PARAMETER`.
///
/// # Safety
/// A non-NULL `s` points at a NUL-terminated string valid for reads for `'a` and not written
/// meanwhile.
pub(crate) unsafe fn cstr_from_ptr<'a>(s: *const c_char) -> Result<&'a [u8], kvroute_status> {
    if s.is_null() {
        return Err(kvroute_status::NullParameter);
    }
    // SAFETY: per the contract.
    Ok(unsafe { CStr::from_ptr(s) }.to_bytes())
}

/// Borrows an output buffer of `len` elements, possibly uninitialised. `(NULL, 0)` is an empty
/// buffer (a size query); `(NULL, n > 0)` is `NULL_PARAMETER`.
///
/// # Safety
/// A non-NULL `buf` is valid for writes of `len` elements for `'a` and not accessed meanwhile.
pub(crate) unsafe fn out_slice_from_ptr<'a, T>(
    buf: *mut T,
    len: usize,
) -> Result<&'a mut [MaybeUninit<T>], kvroute_status> {
    if buf.is_null() {
        return if len == 0 {
            Ok(&mut [])
        } else {
            Err(kvroute_status::NullParameter)
        };
    }
    if len
        .checked_mul(size_of::<T>())
        .is_none_or(|bytes| bytes > isize::MAX as usize)
    {
        return Err(kvroute_status::InvalidParameter);
    }
    // SAFETY: per the contract; `MaybeUninit` makes no claim about the current contents.
    Ok(unsafe { std::slice::from_raw_parts_mut(buf.cast::<MaybeUninit<T>>(), len) })
}

/// Borrows an out-parameter, possibly uninitialised. NULL is `NULL_PARAMETER`.
///
/// # Safety
/// A non-NULL `out` is valid for writes of one `T` for `'a`, suitably aligned.
pub(crate) unsafe fn out_from_ptr<'a, T>(
    out: *mut T,
) -> Result<&'a mut MaybeUninit<T>, kvroute_status> {
    // SAFETY: per the contract; `MaybeUninit` makes no claim about the current contents.
    unsafe { out.cast::<MaybeUninit<T>>().as_mut() }.ok_or(kvroute_status::NullParameter)
}

/// Writes a handle through a `**out` parameter (the caller checked it was non-NULL by borrowing
/// it with [`try_out!`]).
pub(crate) fn set_out<T>(out: &mut MaybeUninit<T>, value: T) {
    out.write(value);
}

/// `&C::RustType` from a handle pointer, or return `NULL_PARAMETER`.
macro_rules! try_ref {
    ( $ptr:expr ) => {
        try_status!(unsafe { $crate::handle::ref_from_ptr($ptr) })
    };
}

/// `&mut C::RustType` from a boxed handle pointer, or return `NULL_PARAMETER`.
macro_rules! try_mut {
    ( $ptr:expr ) => {
        try_status!(unsafe { $crate::handle::mut_from_ptr($ptr) })
    };
}

/// `Box<C::RustType>` taken back from a boxed handle pointer, or return `NULL_PARAMETER`.
macro_rules! try_take_box {
    ( $ptr:expr ) => {
        try_status!(unsafe { $crate::handle::take_box($ptr) })
    };
}

/// Frees a boxed handle; NULL is a no-op.
macro_rules! free_box {
    ( $ptr:expr ) => {
        unsafe { $crate::handle::free_box($ptr) }
    };
}

/// Frees an `Arc` handle; NULL is a no-op.
macro_rules! free_arc {
    ( $ptr:expr ) => {
        unsafe { $crate::handle::free_arc($ptr) }
    };
}

/// `&T` from a pointer to a required plain input struct, or return `NULL_PARAMETER`.
macro_rules! try_plain_ref {
    ( $ptr:expr ) => {
        try_status!(unsafe { $crate::handle::plain_ref($ptr) })
    };
}

/// `Option<&T>` from a pointer to a plain input struct; NULL is `None`.
macro_rules! opt_plain_ref {
    ( $ptr:expr ) => {
        unsafe { $crate::handle::plain_ref($ptr) }.ok()
    };
}

/// `&[u8]` from `(data, len)`, or return `NULL_PARAMETER`.
macro_rules! try_slice {
    ( $data:expr, $len:expr ) => {
        try_status!(unsafe { $crate::handle::slice_from_ptr($data, $len) })
    };
}

/// `&mut [MaybeUninit<T>]` from `(buf, len)`, or return `NULL_PARAMETER`.
macro_rules! try_out_slice {
    ( $buf:expr, $len:expr ) => {
        try_status!(unsafe { $crate::handle::out_slice_from_ptr($buf, $len) })
    };
}

/// `Option<&[T]>` from an optional input array `(data, len)` (`(NULL, 0)`: `None`), or return
/// `NULL_PARAMETER`.
macro_rules! try_opt_array {
    ( $data:expr, $len:expr ) => {
        try_status!(unsafe { $crate::handle::opt_array_from_ptr($data, $len) })
    };
}

/// `&[u8]` from a NUL-terminated C string (without the NUL), or return `NULL_PARAMETER`.
macro_rules! try_cstr {
    ( $s:expr ) => {
        try_status!(unsafe { $crate::handle::cstr_from_ptr($s) })
    };
}

/// `Option<&mut MaybeUninit<T>>` from an optional out-pointer; NULL is `None`.
macro_rules! opt_out {
    ( $out:expr ) => {
        unsafe { $crate::handle::out_from_ptr($out) }.ok()
    };
}

/// `&mut MaybeUninit<T>` from an out-pointer, or return `NULL_PARAMETER`.
macro_rules! try_out {
    ( $out:expr ) => {
        try_status!(unsafe { $crate::handle::out_from_ptr($out) })
    };
}
