//! The load-balancing policy's hooks (`envoy_dynamic_module_on_lb_*`) over
//! [`crate::balancer`], and its [`ClusterView`] over Envoy's callbacks.
//!
//! Ownership: a policy configuration is a `Box<BalancerConfig>` made in `lb_config_new` and
//! freed in `lb_config_destroy`; a thread's balancer a `Box<Mutex<Balancer>>` made in `lb_new`
//! and freed in `lb_destroy` (Envoy calls a balancer's hooks from its own thread; the mutex,
//! never contended, keeps the type `Sync` without trusting that). Panics are caught: a failed
//! choice answers no host (Envoy's 503), a failed update changes nothing.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use parking_lot::Mutex;

use super::sys::{self, EnvoyBuffer, LbConfigEnvoyPtr, LbConfigModulePtr, LbContextEnvoyPtr};
use super::sys::{HostHealth, LbEnvoyPtr, LbModulePtr, LogLevel};
use super::{envoy_bytes, envoy_log, module_buffer};
use crate::balancer::{Balancer, BalancerConfig, ClusterView, DESTINATION_HEADER};

/// Envoy's cluster during one hook.
struct Cluster(LbEnvoyPtr);

impl Cluster {
    fn address(
        &self,
        get: unsafe extern "C" fn(LbEnvoyPtr, u32, usize, *mut EnvoyBuffer) -> bool,
        priority: u32,
        index: usize,
    ) -> Option<String> {
        let mut out = EnvoyBuffer {
            ptr: ptr::null(),
            length: 0,
        };
        // SAFETY: `self.0` is the balancer Envoy passed to the running hook; `out` is written
        // by Envoy and read before the hook returns.
        let found = unsafe { get(self.0, priority, index, &mut out) };
        // SAFETY: as above.
        found.then(|| String::from_utf8_lossy(unsafe { envoy_bytes(out) }).into_owned())
    }
}

impl ClusterView for Cluster {
    fn priorities(&self) -> u32 {
        // SAFETY: see `address`.
        let n = unsafe { sys::envoy_dynamic_module_callback_lb_get_priority_set_size(self.0) };
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    fn hosts(&self, priority: u32) -> Vec<(String, bool)> {
        // SAFETY: see `address`.
        let n = unsafe { sys::envoy_dynamic_module_callback_lb_get_hosts_count(self.0, priority) };
        (0..n)
            .filter_map(|i| {
                let address = self.address(
                    sys::envoy_dynamic_module_callback_lb_get_host_address,
                    priority,
                    i,
                )?;
                // SAFETY: see `address`.
                let health = unsafe {
                    sys::envoy_dynamic_module_callback_lb_get_host_health(self.0, priority, i)
                };
                Some((address, health == HostHealth::HEALTHY))
            })
            .collect()
    }

    fn healthy_hosts(&self, priority: u32) -> Vec<String> {
        // SAFETY: see `address`.
        let n = unsafe {
            sys::envoy_dynamic_module_callback_lb_get_healthy_hosts_count(self.0, priority)
        };
        (0..n)
            .map(|i| {
                self.address(
                    sys::envoy_dynamic_module_callback_lb_get_healthy_host_address,
                    priority,
                    i,
                )
                // Keep the indices aligned with Envoy's even if an address cannot be read.
                .unwrap_or_default()
            })
            .collect()
    }
}

/// A policy configuration: `config` (the policy's `lb_policy_config`) names the kvroute filter
/// (`filter_name`) whose router decides. NULL (Envoy refuses it) when it is not a name.
///
/// # Safety
/// Envoy's contract: `name` and `config` are readable during the call.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_lb_config_new(
    _config_envoy: LbConfigEnvoyPtr,
    _name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> LbConfigModulePtr {
    // SAFETY: Envoy's contract.
    let bytes = unsafe { envoy_bytes(config) };
    match catch_unwind(|| BalancerConfig::parse(bytes)) {
        Ok(Ok(c)) => Box::into_raw(Box::new(c)).cast_const().cast(),
        Ok(Err(e)) => {
            envoy_log(LogLevel::ERROR, &format!("kvroute load balancer: {e}"));
            ptr::null()
        }
        Err(_) => ptr::null(),
    }
}
const _: sys::LbConfigNewHook = envoy_dynamic_module_on_lb_config_new;

/// Frees a policy configuration.
///
/// # Safety
/// `config` came from `lb_config_new` and is not used again.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_lb_config_destroy(config: LbConfigModulePtr) {
    if !config.is_null() {
        // SAFETY: made by `Box::into_raw` in `lb_config_new`, destroyed once.
        drop(unsafe { Box::from_raw(config.cast_mut().cast::<BalancerConfig>()) });
    }
}
const _: sys::LbConfigDestroyHook = envoy_dynamic_module_on_lb_config_destroy;

/// One thread's balancer.
///
/// # Safety
/// `config` came from `lb_config_new` and outlives the balancer.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_lb_new(
    config: LbConfigModulePtr,
    _lb_envoy: LbEnvoyPtr,
) -> LbModulePtr {
    if config.is_null() {
        return ptr::null();
    }
    // SAFETY: the contract above.
    let config = unsafe { &*config.cast::<BalancerConfig>() };
    match catch_unwind(|| Balancer::new(config)) {
        Ok(b) => Box::into_raw(Box::new(Mutex::new(b))).cast_const().cast(),
        Err(_) => ptr::null(),
    }
}
const _: sys::LbNewHook = envoy_dynamic_module_on_lb_new;

/// # Safety
/// `lb_module` came from `lb_new` and is not destroyed.
unsafe fn balancer<'a>(lb_module: LbModulePtr) -> Option<&'a Mutex<Balancer>> {
    // SAFETY: the contract above.
    (!lb_module.is_null()).then(|| unsafe { &*lb_module.cast::<Mutex<Balancer>>() })
}

/// The host for one request attempt: the one the filter named, or the next healthy one.
///
/// # Safety
/// Envoy's contract: the pointers are the balancer's and the request's, valid during the call;
/// the result pointers are writable.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_lb_choose_host(
    _lb_envoy: LbEnvoyPtr,
    lb_module: LbModulePtr,
    context: LbContextEnvoyPtr,
    priority: *mut u32,
    index: *mut u32,
) -> bool {
    // SAFETY: Envoy's contract.
    let Some(b) = (unsafe { balancer(lb_module) }) else {
        return false;
    };
    if priority.is_null() || index.is_null() {
        return false;
    }
    let destination = if context.is_null() {
        None
    } else {
        let mut out = EnvoyBuffer {
            ptr: ptr::null(),
            length: 0,
        };
        let key = DESTINATION_HEADER.as_bytes();
        // SAFETY: `context` is the request's, valid during the call; `out` is read before the
        // hook returns.
        let found = unsafe {
            sys::envoy_dynamic_module_callback_lb_context_get_downstream_header(
                context,
                module_buffer(key),
                &mut out,
                0,
                ptr::null_mut(),
            )
        };
        // SAFETY: as above.
        found.then(|| unsafe { envoy_bytes(out) }.to_vec())
    };
    match catch_unwind(AssertUnwindSafe(|| b.lock().choose(destination.as_deref()))) {
        Ok(Some((p, i))) => {
            // SAFETY: checked non-null; Envoy's contract makes them writable.
            unsafe {
                *priority = p;
                *index = i;
            }
            true
        }
        _ => false,
    }
}
const _: sys::LbChooseHostHook = envoy_dynamic_module_on_lb_choose_host;

/// The cluster's hosts or their health changed: read them again and publish them.
///
/// # Safety
/// Envoy's contract: the pointers are valid during the call.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_lb_on_host_membership_update(
    lb_envoy: LbEnvoyPtr,
    lb_module: LbModulePtr,
    _added: usize,
    _removed: usize,
) {
    // SAFETY: Envoy's contract.
    let Some(b) = (unsafe { balancer(lb_module) }) else {
        return;
    };
    let cluster = Cluster(lb_envoy);
    if catch_unwind(AssertUnwindSafe(|| b.lock().on_membership_update(&cluster))).is_err() {
        envoy_log(
            LogLevel::ERROR,
            "kvroute load balancer: panic in a membership update",
        );
    }
}
const _: sys::LbMembershipUpdateHook = envoy_dynamic_module_on_lb_on_host_membership_update;

/// Frees a thread's balancer.
///
/// # Safety
/// `lb_module` came from `lb_new` and is not used again.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_lb_destroy(lb_module: LbModulePtr) {
    if !lb_module.is_null() {
        // SAFETY: made by `Box::into_raw` in `lb_new`, destroyed once.
        drop(unsafe { Box::from_raw(lb_module.cast_mut().cast::<Mutex<Balancer>>()) });
    }
}
const _: sys::LbDestroyHook = envoy_dynamic_module_on_lb_destroy;
