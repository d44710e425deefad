//! `kvroute_config_builder` (mutable, one owner) and `kvroute_config` (immutable, shared).

use kvroute_core::{RouterConfig, StrategySpec, MAX_BLOCK_SIZE};

use crate::handle::{self, Castable, OwnershipArc, OwnershipBox};
use crate::status::kvroute_status;

/// A router configuration being put together. Create it with `kvroute_config_builder_new()`,
/// change it with the `kvroute_config_builder_set_*()` functions, then turn it into a
/// `kvroute_config` with `kvroute_config_builder_build()`, which consumes it.
///
/// Under the hood this is a `Box<RouterConfig>`. It is not thread-safe: use it from one thread
/// at a time. Every setting starts at the value AIBrix v0.7.0 ships (block size 128, index
/// capacity 200000 blocks, index TTL 20 min, ticket TTL 30 min, imbalance count 16, stddev
/// factor 2, strategy `prefix-cache`, seed 0), and the pod-health rules at Envoy's
/// outlier-detection defaults (5 upstream errors or 3 gateway failures in a row eject a pod for
/// 30 s, growing to at most 300 s, at most 10% of a model's pods ejected at once; 3 failed
/// active checks take a pod out of service, 1 passed check brings it back).
pub struct kvroute_config_builder {
    _private: [u8; 0],
}

impl Castable for kvroute_config_builder {
    type Ownership = OwnershipBox;
    type RustType = RouterConfig;
}

/// A validated, immutable router configuration. Under the hood this is an
/// `Arc<RouterConfig>`: it is thread-safe, and `kvroute_router_new()` takes its own reference,
/// so the caller may free the config as soon as the routers it needs are built.
pub struct kvroute_config {
    _private: [u8; 0],
}

impl Castable for kvroute_config {
    type Ownership = OwnershipArc;
    type RustType = RouterConfig;
}

/// A new builder holding the default configuration. The caller owns it and must pass it to
/// `kvroute_config_builder_build()` or `kvroute_config_builder_free()` exactly once.
///
/// Returns NULL only if the library panicked.
#[no_mangle]
pub extern "C" fn kvroute_config_builder_new() -> *mut kvroute_config_builder {
    ffi_panic_boundary! { handle::to_boxed_mut_ptr::<kvroute_config_builder>(RouterConfig::default()) }
}

/// Frees a builder that was not built. NULL is a no-op. Do not call it after
/// `kvroute_config_builder_build()`, which consumed the builder.
#[no_mangle]
pub extern "C" fn kvroute_config_builder_free(builder: *mut kvroute_config_builder) {
    ffi_panic_boundary! { free_box!(builder) }
}

/// Applies `f` to the builder's configuration.
fn update(
    builder: *mut kvroute_config_builder,
    f: impl FnOnce(&mut RouterConfig) -> Result<(), kvroute_status>,
) -> kvroute_status {
    let config = try_mut!(builder);
    try_status!(f(config));
    kvroute_status::Ok
}

fn nonzero<T: Default + PartialEq>(v: T) -> Result<T, kvroute_status> {
    if v == T::default() {
        Err(kvroute_status::InvalidParameter)
    } else {
        Ok(v)
    }
}

/// Sets the strategy used when a route call names none (AIBrix's `ROUTING_ALGORITHM`):
/// `spec` is `name[:weight][,name[:weight]...]` over `random`, `least-request`, `prefix-cache`,
/// `least-ttft` and AIBrix's `least-kv-cache`, `least-gpu-cache`, `least-busy-time`,
/// `least-utilization`, `least-latency`, `throughput`, `power-of-two` (not weightable) and
/// `session-affinity`, case-insensitive, for example `"least-ttft"` or
/// `"prefix-cache:2,least-request:1"`. The strategies that read engine metrics read what
/// `kvroute_router_observe_engine()` reported. `(spec, spec_len)` is borrowed for the call only and need
/// not be NUL-terminated.
///
/// Returns `KVROUTE_STATUS_INVALID_STRATEGY` (builder unchanged) for a spec that does not parse,
/// `KVROUTE_STATUS_INVALID_UTF8`, or `KVROUTE_STATUS_NULL_PARAMETER`.
#[no_mangle]
pub extern "C" fn kvroute_config_builder_set_strategy(
    builder: *mut kvroute_config_builder,
    spec: *const u8,
    spec_len: usize,
) -> kvroute_status {
    ffi_panic_boundary! {
        let spec = try_str!(spec, spec_len);
        update(builder, |c| {
            c.default_strategy = StrategySpec::parse(spec)?;
            Ok(())
        })
    }
}

/// Sets one setting of least-ttft's TTFT model by name, as the Envoy service's `[ttft]` TOML
/// section names it: `bytes_per_token`, `engine_block_tokens` (the engine's KV block size in
/// tokens, default 16), `max_seqs` (default sequences per pod, default 256),
/// `prefill_tokens_per_s`, `tpot_ms`, `overhead_ms`, `output_tokens`, `learning_rate`,
/// `max_sample_ratio`, `snapshot_max_age_ms`, `tie_ms`, `stall_weight`, `explore_wait_ms`
/// (defaults and meanings: kvroute-core's `TtftConfig`). Counts must be whole numbers.
/// `(key, key_len)` is borrowed for the call only and need not be NUL-terminated.
///
/// Returns `KVROUTE_STATUS_INVALID_PARAMETER` (builder unchanged) for an unknown key or a value
/// out of the setting's range, `KVROUTE_STATUS_INVALID_UTF8`, or
/// `KVROUTE_STATUS_NULL_PARAMETER`.
#[no_mangle]
pub extern "C" fn kvroute_config_builder_set_ttft(
    builder: *mut kvroute_config_builder,
    key: *const u8,
    key_len: usize,
    value: f64,
) -> kvroute_status {
    ffi_panic_boundary! {
        let key = try_str!(key, key_len);
        update(builder, |c| {
            c.ttft
                .set(key, value)
                .map_err(|_| kvroute_status::InvalidParameter)
        })
    }
}

/// Sets the block size in bytes of the prompt hash (default 128). Returns
/// `KVROUTE_STATUS_INVALID_PARAMETER` (builder unchanged) for 0 or more than 1 MiB.
#[no_mangle]
pub extern "C" fn kvroute_config_builder_set_block_size(
    builder: *mut kvroute_config_builder,
    block_size: usize,
) -> kvroute_status {
    ffi_panic_boundary! {
        update(builder, |c| {
            if block_size > MAX_BLOCK_SIZE {
                return Err(kvroute_status::InvalidParameter);
            }
            c.block_size = nonzero(block_size)?;
            Ok(())
        })
    }
}

/// Sets the prefix-index capacity in blocks, over all models and pods (default 200000).
/// Returns `KVROUTE_STATUS_INVALID_PARAMETER` (builder unchanged) for 0.
#[no_mangle]
pub extern "C" fn kvroute_config_builder_set_index_capacity(
    builder: *mut kvroute_config_builder,
    blocks: usize,
) -> kvroute_status {
    ffi_panic_boundary! {
        update(builder, |c| {
            c.index_capacity = nonzero(blocks)?;
            Ok(())
        })
    }
}

/// Sets how long a pod's index entry stays valid after it was last written, in ms (default
/// 1200000, 20 min). Returns `KVROUTE_STATUS_INVALID_PARAMETER` (builder unchanged) for 0.
#[no_mangle]
pub extern "C" fn kvroute_config_builder_set_index_ttl_ms(
    builder: *mut kvroute_config_builder,
    ttl_ms: u64,
) -> kvroute_status {
    ffi_panic_boundary! {
        update(builder, |c| {
            c.index_ttl_ms = nonzero(ttl_ms)?;
            Ok(())
        })
    }
}

/// Sets how long a ticket may stay open before `kvroute_router_tick()` expires it and releases
/// its in-flight slot, in ms (default 1800000, 30 min). A safety net for lost completions only.
/// Returns `KVROUTE_STATUS_INVALID_PARAMETER` (builder unchanged) for 0.
#[no_mangle]
pub extern "C" fn kvroute_config_builder_set_ticket_ttl_ms(
    builder: *mut kvroute_config_builder,
    ttl_ms: u64,
) -> kvroute_status {
    ffi_panic_boundary! {
        update(builder, |c| {
            c.ticket_ttl_ms = nonzero(ttl_ms)?;
            Ok(())
        })
    }
}

/// Sets prefix-cache's imbalance threshold: when `max - min` in-flight over the ready pods
/// exceeds it, the least-loaded pod is chosen (default 16).
#[no_mangle]
pub extern "C" fn kvroute_config_builder_set_imbalance_abs_count(
    builder: *mut kvroute_config_builder,
    count: u32,
) -> kvroute_status {
    ffi_panic_boundary! {
        update(builder, |c| {
            c.imbalance_abs_count = count;
            Ok(())
        })
    }
}

/// Sets `k` in prefix-cache's `load <= mean + k * stddev` filter (default 2.0). Returns
/// `KVROUTE_STATUS_INVALID_PARAMETER` (builder unchanged) for a negative or non-finite value.
#[no_mangle]
pub extern "C" fn kvroute_config_builder_set_stddev_factor(
    builder: *mut kvroute_config_builder,
    factor: f64,
) -> kvroute_status {
    ffi_panic_boundary! {
        update(builder, |c| {
            if !factor.is_finite() || factor < 0.0 {
                return Err(kvroute_status::InvalidParameter);
            }
            c.stddev_factor = factor;
            Ok(())
        })
    }
}

/// Sets the seed of every random choice (tie-breaks, `random`) and, unless
/// `kvroute_config_builder_set_hash_seed()` is called, of the prompt hash. The same seed and the
/// same calls give the same decisions. Production callers pass fresh OS randomness.
#[no_mangle]
pub extern "C" fn kvroute_config_builder_set_seed(
    builder: *mut kvroute_config_builder,
    seed: u64,
) -> kvroute_status {
    ffi_panic_boundary! {
        update(builder, |c| {
            c.seed = seed;
            Ok(())
        })
    }
}

/// Fixes the XXH64 seed of the prompt hash chain (AIBrix's `AIBRIX_PREFIX_CACHE_HASH_SEED`).
/// Set it to the same value wherever block hashes must agree; by default it is derived from
/// the seed.
#[no_mangle]
pub extern "C" fn kvroute_config_builder_set_hash_seed(
    builder: *mut kvroute_config_builder,
    hash_seed: u64,
) -> kvroute_status {
    ffi_panic_boundary! {
        update(builder, |c| {
            c.hash_seed = Some(hash_seed);
            Ok(())
        })
    }
}

/// Sets how many upstream errors in a row eject a pod (default 5; 0 turns the rule off). Every
/// failure outcome counts: `KVROUTE_OUTCOME_FAILED`, `_CONNECT_FAILED`, `_RESET`, `_TIMEOUT`;
/// a success resets the count and a cancel leaves it alone. Envoy's `consecutive_5xx`.
#[no_mangle]
pub extern "C" fn kvroute_config_builder_set_consecutive_5xx(
    builder: *mut kvroute_config_builder,
    count: u32,
) -> kvroute_status {
    ffi_panic_boundary! {
        update(builder, |c| {
            c.health.consecutive_5xx = count;
            Ok(())
        })
    }
}

/// Sets how many gateway failures in a row (`KVROUTE_OUTCOME_CONNECT_FAILED`, `_RESET`,
/// `_TIMEOUT`: the pod was not reached or did not answer) eject a pod (default 3; 0 turns the
/// rule off). Envoy's `consecutive_gateway_failure`, enforced.
#[no_mangle]
pub extern "C" fn kvroute_config_builder_set_consecutive_gateway_failures(
    builder: *mut kvroute_config_builder,
    count: u32,
) -> kvroute_status {
    ffi_panic_boundary! {
        update(builder, |c| {
            c.health.consecutive_gateway_failures = count;
            Ok(())
        })
    }
}

/// Sets the first ejection's length in ms (default 30000); a pod's n-th ejection lasts n times
/// as long (n decays by one for each such length the pod then spends in service), capped by
/// `kvroute_config_builder_set_max_ejection_ms()`. Returns `KVROUTE_STATUS_INVALID_PARAMETER`
/// (builder unchanged) for 0.
#[no_mangle]
pub extern "C" fn kvroute_config_builder_set_base_ejection_ms(
    builder: *mut kvroute_config_builder,
    ms: u64,
) -> kvroute_status {
    ffi_panic_boundary! {
        update(builder, |c| {
            c.health.base_ejection_ms = nonzero(ms)?;
            Ok(())
        })
    }
}

/// Sets the longest ejection in ms (default 300000); a value below the base ejection time is
/// taken as the base ejection time.
#[no_mangle]
pub extern "C" fn kvroute_config_builder_set_max_ejection_ms(
    builder: *mut kvroute_config_builder,
    ms: u64,
) -> kvroute_status {
    ffi_panic_boundary! {
        update(builder, |c| {
            c.health.max_ejection_ms = ms;
            Ok(())
        })
    }
}

/// Sets the most pods of a model that may be ejected at once, as a percentage of its pods
/// (default 10). One pod may always be ejected, and one pod of every model always stays in
/// service: an ejection that would break either rule is not made
/// (`KVROUTE_HEALTH_EVENT_EJECTION_SKIPPED`). Returns `KVROUTE_STATUS_INVALID_PARAMETER`
/// (builder unchanged) above 100.
#[no_mangle]
pub extern "C" fn kvroute_config_builder_set_max_ejection_percent(
    builder: *mut kvroute_config_builder,
    percent: u32,
) -> kvroute_status {
    ffi_panic_boundary! {
        update(builder, |c| {
            c.health.max_ejection_percent = match u8::try_from(percent) {
                Ok(p) if p <= 100 => p,
                _ => return Err(kvroute_status::InvalidParameter),
            };
            Ok(())
        })
    }
}

/// Sets how many failed active checks in a row (`kvroute_router_report_health_check()`) take
/// a pod out of service (default 3; 0: checks never do).
#[no_mangle]
pub extern "C" fn kvroute_config_builder_set_unhealthy_threshold(
    builder: *mut kvroute_config_builder,
    count: u32,
) -> kvroute_status {
    ffi_panic_boundary! {
        update(builder, |c| {
            c.health.unhealthy_threshold = count;
            Ok(())
        })
    }
}

/// Sets how many passed active checks in a row bring a pod whose checks were failing back
/// into service (default 1; 0 is taken as 1).
#[no_mangle]
pub extern "C" fn kvroute_config_builder_set_healthy_threshold(
    builder: *mut kvroute_config_builder,
    count: u32,
) -> kvroute_status {
    ffi_panic_boundary! {
        update(builder, |c| {
            c.health.healthy_threshold = count;
            Ok(())
        })
    }
}

/// Validates the builder's settings and turns them into a configuration.
///
/// The builder is consumed whether this succeeds or fails: do not use or free it afterwards
/// (a NULL `builder` is `KVROUTE_STATUS_NULL_PARAMETER`). On success `*config_out` is a new
/// configuration the caller owns and frees with `kvroute_config_free()`. Returns
/// `KVROUTE_STATUS_INVALID_CONFIG` if the settings do not fit together, or
/// `KVROUTE_STATUS_NULL_PARAMETER` if `config_out` is NULL (the builder is still consumed).
#[no_mangle]
pub extern "C" fn kvroute_config_builder_build(
    builder: *mut kvroute_config_builder,
    config_out: *mut *const kvroute_config,
) -> kvroute_status {
    ffi_panic_boundary! {
        let config = try_take_box!(builder);
        let out = try_out!(config_out);
        try_status!(config.validate());
        handle::set_out(out, handle::to_arc_const_ptr::<kvroute_config>(config.into()));
        kvroute_status::Ok
    }
}

/// Releases the caller's reference to a configuration. NULL is a no-op. Routers built from it
/// keep their own reference.
#[no_mangle]
pub extern "C" fn kvroute_config_free(config: *const kvroute_config) {
    ffi_panic_boundary! { free_arc!(config) }
}
