/*
 * kvroute: a KV-cache-aware request router for LLM inference fleets, as a C library.
 *
 * Generated from ffi/src by cbindgen; do not edit. Conventions (ownership, NULL, out-buffers,
 * threads, panics, versioning): ffi/README.md.
 */

#ifndef KVROUTE_H
#define KVROUTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVROUTE_VERSION "0.3.0"
#define KVROUTE_VERSION_MAJOR 0
#define KVROUTE_VERSION_MINOR 3
#define KVROUTE_VERSION_PATCH 0
#define KVROUTE_VERSION_NUMBER ((KVROUTE_VERSION_MAJOR << 16) | (KVROUTE_VERSION_MINOR << 8) | KVROUTE_VERSION_PATCH)

/**
 * `kvroute_timings.known`: `first_token_ms` is set.
 */
#define KVROUTE_TIMING_FIRST_TOKEN_MS (1 << 0)

/**
 * `kvroute_timings.known`: `total_ms` is set.
 */
#define KVROUTE_TIMING_TOTAL_MS (1 << 1)

/**
 * `kvroute_timings.known`: `output_tokens` is set.
 */
#define KVROUTE_TIMING_OUTPUT_TOKENS (1 << 2)

/**
 * `kvroute_timings.known`: `cached_tokens` is set.
 */
#define KVROUTE_TIMING_CACHED_TOKENS (1 << 3)

/**
 * `kvroute_timings.known`: `prompt_tokens` is set.
 */
#define KVROUTE_TIMING_PROMPT_TOKENS (1 << 4)

/**
 * `kvroute_engine_snapshot.known`: `kv_usage` is set.
 */
#define KVROUTE_ENGINE_KV_USAGE (1 << 0)

/**
 * `kvroute_engine_snapshot.known`: `prefix_queries` is set.
 */
#define KVROUTE_ENGINE_PREFIX_QUERIES (1 << 1)

/**
 * `kvroute_engine_snapshot.known`: `prefix_hits` is set.
 */
#define KVROUTE_ENGINE_PREFIX_HITS (1 << 2)

/**
 * `kvroute_engine_timing.known`: `prefill_seconds` and `prefills` are set (a pair: the sum and
 * the count of one histogram).
 */
#define KVROUTE_ENGINE_TIMING_PREFILL (1 << 0)

/**
 * `kvroute_engine_timing.known`: `inter_token_seconds` and `inter_tokens` are set (a pair: the
 * sum and the count of one histogram).
 */
#define KVROUTE_ENGINE_TIMING_INTER_TOKEN (1 << 1)

/**
 * vLLM's default KV-cache block size in tokens (its `--block-size`): the `block_tokens` of
 * `kvroute_router_route_tokens()` for an engine run with the default.
 */
#define KVROUTE_DEFAULT_BLOCK_TOKENS 16

/**
 * The largest `block_tokens` accepted.
 */
#define KVROUTE_MAX_BLOCK_TOKENS 65536

/**
 * The result of every fallible `kvroute_` function. `KVROUTE_STATUS_OK` (0) is success; every
 * other value is an error, and no output parameter was written (except `*out_n` on
 * `KVROUTE_STATUS_INSUFFICIENT_SIZE`, which holds the buffer size needed).
 *
 * Functions return it as a `uint32_t`; `kvroute_status_str()` names it.
 */
enum kvroute_status
#if defined(__cplusplus) || __STDC_VERSION__ >= 202311L
  : uint32_t
#endif // defined(__cplusplus) || __STDC_VERSION__ >= 202311L
 {
  /**
   * Success.
   */
  KVROUTE_STATUS_OK = 0,
  /**
   * A required pointer argument was NULL (or a NULL data pointer came with a non-zero length).
   */
  KVROUTE_STATUS_NULL_PARAMETER = 1,
  /**
   * An argument is out of range: an unknown enum value, a zero size, a value the router
   * rejects.
   */
  KVROUTE_STATUS_INVALID_PARAMETER = 2,
  /**
   * A string argument is not valid UTF-8.
   */
  KVROUTE_STATUS_INVALID_UTF8 = 3,
  /**
   * The output buffer is too small; `*out_n` holds the size needed and nothing else was
   * written.
   */
  KVROUTE_STATUS_INSUFFICIENT_SIZE = 4,
  /**
   * No pod serves the requested model (AIBrix answers 400 `model_not_found`).
   */
  KVROUTE_STATUS_UNKNOWN_MODEL = 5,
  /**
   * The model is known but none of its pods is ready and in service (not ejected, active
   * checks not failing) (AIBrix answers 503).
   */
  KVROUTE_STATUS_NO_READY_POD = 6,
  /**
   * The pod id was never issued, or the pod was removed; or no live pod has that name.
   */
  KVROUTE_STATUS_UNKNOWN_POD = 7,
  /**
   * The ticket was never issued by this router (for `kvroute_router_explain()`: the ticket
   * is not open).
   */
  KVROUTE_STATUS_UNKNOWN_TICKET = 8,
  /**
   * The ticket was already completed or expired (a double completion). Nothing changed.
   */
  KVROUTE_STATUS_TICKET_NOT_OPEN = 9,
  /**
   * The routing strategy string is not a valid spec (`name[:weight][,name[:weight]...]`
   * over `random`, `least-request`, `prefix-cache`, `least-ttft`).
   */
  KVROUTE_STATUS_INVALID_STRATEGY = 10,
  /**
   * The pod address is not `ip:port` with a numeric IP.
   */
  KVROUTE_STATUS_INVALID_ADDRESS = 11,
  /**
   * A pod or model name is empty.
   */
  KVROUTE_STATUS_EMPTY_NAME = 12,
  /**
   * The request body is not JSON, or its `messages` / `prompt` field has the wrong type.
   */
  KVROUTE_STATUS_INVALID_BODY = 13,
  /**
   * The configuration is invalid (zero capacity or TTL, bad block size, bad σ factor, a zero
   * base ejection time or an ejection percentage over 100).
   */
  KVROUTE_STATUS_INVALID_CONFIG = 14,
  /**
   * The request named an endpoint subset (`kvroute_router_route_subset()`,
   * `kvroute_router_route_json_subset()`) and no pod of the model in it is ready and in
   * service: "no ready pod for model in the endpoint subset" (the Gateway API Inference
   * Extension answers 503). An empty subset, or one of addresses no pod of the model has,
   * gives it too.
   */
  KVROUTE_STATUS_NO_POD_IN_SUBSET = 15,
  /**
   * The library panicked; the call had no effect unless it held the router lock, in which
   * case the router is now poisoned. This is a bug in kvroute: please report it.
   */
  KVROUTE_STATUS_PANIC = 100,
  /**
   * An earlier call panicked while holding this router's lock, so its state can no longer be
   * trusted. Every later call on the router returns this; free it and build a new one.
   */
  KVROUTE_STATUS_POISONED = 101,
};
#ifndef __cplusplus
#if __STDC_VERSION__ >= 202311L
typedef enum kvroute_status kvroute_status;
#else
typedef uint32_t kvroute_status;
#endif // __STDC_VERSION__ >= 202311L
#endif // __cplusplus

/**
 * Why the router chose the pod: `kvroute_decision.reason`. `kvroute_reason_str()` names it
 * with the label AIBrix uses (`prefix_match`, `least_request_fallback`, ...).
 */
enum kvroute_reason
#if defined(__cplusplus) || __STDC_VERSION__ >= 202311L
  : uint32_t
#endif // defined(__cplusplus) || __STDC_VERSION__ >= 202311L
 {
  /**
   * `random`: uniform choice.
   */
  KVROUTE_REASON_RANDOM = 0,
  /**
   * `least-request`: fewest in-flight requests.
   */
  KVROUTE_REASON_LEAST_REQUEST = 1,
  /**
   * `prefix-cache`: the best-matching pod within `mean + k*stddev` load.
   */
  KVROUTE_REASON_PREFIX_MATCH = 2,
  /**
   * `prefix-cache`: some pod matched but none passed the load filter; least-loaded instead.
   */
  KVROUTE_REASON_PREFIX_MATCH_SKIPPED = 3,
  /**
   * `prefix-cache`: no pod matched; least-loaded instead.
   */
  KVROUTE_REASON_LEAST_REQUEST_FALLBACK = 4,
  /**
   * A weighted multi-strategy spec: highest combined score.
   */
  KVROUTE_REASON_WEIGHTED = 5,
  /**
   * `least-ttft`: the smallest predicted time to first token plus prefill stall charge.
   */
  KVROUTE_REASON_LEAST_TTFT = 6,
  /**
   * `least-ttft`: sent to a pod not yet probed, because the cheapest pod would have made it
   * wait at least the configured exploration wait (500 ms by default).
   */
  KVROUTE_REASON_LEAST_TTFT_PROBE = 7,
  /**
   * `least-kv-cache`: the least KV-cache usage.
   */
  KVROUTE_REASON_LEAST_KV_CACHE = 8,
  /**
   * `least-gpu-cache`: the least GPU KV-cache usage.
   */
  KVROUTE_REASON_LEAST_GPU_CACHE = 9,
  /**
   * `least-busy-time`: the least busy-time ratio.
   */
  KVROUTE_REASON_LEAST_BUSY_TIME = 10,
  /**
   * `least-latency`: the least expected latency.
   */
  KVROUTE_REASON_LEAST_LATENCY = 11,
  /**
   * `throughput`: the fewest weighted tokens per request served.
   */
  KVROUTE_REASON_THROUGHPUT = 12,
  /**
   * `least-utilization`: the least utilization.
   */
  KVROUTE_REASON_LEAST_UTILIZATION = 13,
  /**
   * `power-of-two`: the less loaded of two random pods.
   */
  KVROUTE_REASON_POWER_OF_TWO = 14,
  /**
   * `session-affinity`: the pod the request's session id names (a request without a
   * usable one goes to a random pod: `KVROUTE_REASON_RANDOM`, as do the metric strategies
   * when no pod has their metric).
   */
  KVROUTE_REASON_SESSION_AFFINITY = 15,
};
#ifndef __cplusplus
#if __STDC_VERSION__ >= 202311L
typedef enum kvroute_reason kvroute_reason;
#else
typedef uint32_t kvroute_reason;
#endif // __STDC_VERSION__ >= 202311L
#endif // __cplusplus

/**
 * How a request ended, passed to `kvroute_router_complete()` and its variants as a
 * `uint32_t`. The outcome also feeds the pod's health (outlier detection, modelled on Envoy's):
 * `KVROUTE_OUTCOME_FAILED`, `_CONNECT_FAILED`, `_RESET` and `_TIMEOUT` are upstream errors, and
 * `kvroute_config_builder_set_consecutive_5xx()` of them in a row eject the pod (default 5);
 * `_CONNECT_FAILED`, `_RESET` and `_TIMEOUT` are also gateway failures, and
 * `kvroute_config_builder_set_consecutive_gateway_failures()` of those in a row eject it
 * (default 3). A success resets both counts; a cancel never counts against the pod. An ejected
 * pod gets no requests until its ejection time is over, then one probe request at a time: the
 * probe's success readmits it, its failure ejects it again for longer.
 */
enum kvroute_outcome
#if defined(__cplusplus) || __STDC_VERSION__ >= 202311L
  : uint32_t
#endif // defined(__cplusplus) || __STDC_VERSION__ >= 202311L
 {
  /**
   * The response finished normally (a client error such as a 4xx counts as success: the pod
   * worked). Resets the pod's error counts; the success of a probe readmits the pod.
   */
  KVROUTE_OUTCOME_SUCCESS = 0,
  /**
   * The client went away before the response finished. Says nothing about the pod: counts
   * neither for nor against it (a cancelled probe lets the next request probe).
   */
  KVROUTE_OUTCOME_CANCELLED = 1,
  /**
   * The upstream answered with a server error (5xx), or failed in a way the caller cannot
   * tell apart. An upstream error.
   */
  KVROUTE_OUTCOME_FAILED = 2,
  /**
   * The pod could not be connected to (refused, unreachable, connect timeout). An upstream
   * error and a gateway failure.
   */
  KVROUTE_OUTCOME_CONNECT_FAILED = 3,
  /**
   * The pod closed or reset the connection before the response ended. An upstream error and
   * a gateway failure.
   */
  KVROUTE_OUTCOME_RESET = 4,
  /**
   * The pod did not answer in time. An upstream error and a gateway failure.
   */
  KVROUTE_OUTCOME_TIMEOUT = 5,
};
#ifndef __cplusplus
#if __STDC_VERSION__ >= 202311L
typedef enum kvroute_outcome kvroute_outcome;
#else
typedef uint32_t kvroute_outcome;
#endif // __STDC_VERSION__ >= 202311L
#endif // __cplusplus

/**
 * A change of a pod's health, written by `kvroute_router_report_health_check()` and
 * `kvroute_router_complete_with_event()` to their `event_out` as a `uint32_t`, for logs and
 * metrics. `kvroute_health_event_str()` names it. New events may be added: handle unknown
 * values. `kvroute_router_pod_info()` shows the pod's state after the change.
 */
enum kvroute_health_event
#if defined(__cplusplus) || __STDC_VERSION__ >= 202311L
  : uint32_t
#endif // defined(__cplusplus) || __STDC_VERSION__ >= 202311L
 {
  /**
   * Nothing changed.
   */
  KVROUTE_HEALTH_EVENT_NONE = 0,
  /**
   * The pod was ejected: it gets no requests until `kvroute_pod_info.ejected_until_ms`, then
   * one probe request at a time.
   */
  KVROUTE_HEALTH_EVENT_EJECTED = 1,
  /**
   * The pod met an ejection rule, but ejecting it would have taken more of a model's pods
   * out of service than `kvroute_config_builder_set_max_ejection_percent()` allows (or the
   * model's last pod in service): it stays in service.
   */
  KVROUTE_HEALTH_EVENT_EJECTION_SKIPPED = 2,
  /**
   * The pod is back in service: its probe succeeded, or (after an ejection for gateway
   * failures) an active check passed after one had failed.
   */
  KVROUTE_HEALTH_EVENT_READMITTED = 3,
  /**
   * Its active checks failed `unhealthy_threshold` times in a row: out of service until
   * they pass again.
   */
  KVROUTE_HEALTH_EVENT_CHECKS_FAILING = 4,
  /**
   * Its active checks passed `healthy_threshold` times in a row: back in service unless
   * ejected.
   */
  KVROUTE_HEALTH_EVENT_CHECKS_PASSING = 5,
};
#ifndef __cplusplus
#if __STDC_VERSION__ >= 202311L
typedef enum kvroute_health_event kvroute_health_event;
#else
typedef uint32_t kvroute_health_event;
#endif // __STDC_VERSION__ >= 202311L
#endif // __cplusplus

/**
 * A validated, immutable router configuration. Under the hood this is an
 * `Arc<RouterConfig>`: it is thread-safe, and `kvroute_router_new()` takes its own reference,
 * so the caller may free the config as soon as the routers it needs are built.
 */
typedef struct kvroute_config kvroute_config;

/**
 * A router configuration being put together. Create it with `kvroute_config_builder_new()`,
 * change it with the `kvroute_config_builder_set_*()` functions, then turn it into a
 * `kvroute_config` with `kvroute_config_builder_build()`, which consumes it.
 *
 * Under the hood this is a `Box<RouterConfig>`. It is not thread-safe: use it from one thread
 * at a time. Every setting starts at the value AIBrix v0.7.0 ships (block size 128, index
 * capacity 200000 blocks, index TTL 20 min, ticket TTL 30 min, imbalance count 16, stddev
 * factor 2, strategy `prefix-cache`, seed 0), and the pod-health rules at Envoy's
 * outlier-detection defaults (5 upstream errors or 3 gateway failures in a row eject a pod for
 * 30 s, growing to at most 300 s, at most 10% of a model's pods ejected at once; 3 failed
 * active checks take a pod out of service, 1 passed check brings it back).
 */
typedef struct kvroute_config_builder kvroute_config_builder;

/**
 * The router: pods, the prefix index, in-flight counts and open tickets.
 *
 * Under the hood this is a `Box` holding a `kvroute_core::Router` behind a mutex, so one
 * router may be used from many threads at once (prompt hashing and JSON parsing happen outside
 * the lock). Create it with `kvroute_router_new()` and free it once with
 * `kvroute_router_free()`, after every other call on it has returned.
 *
 * If the library ever panics while holding the router's lock, the router is poisoned: every
 * later call on it returns `KVROUTE_STATUS_POISONED`. Free it and build a new one.
 */
typedef struct kvroute_router kvroute_router;

/**
 * An in-flight ticket, issued by a route call. Complete it exactly once with
 * `kvroute_router_complete()`.
 */
typedef uint64_t kvroute_ticket;

/**
 * Counters of the whole router (all models), read by `kvroute_router_stats()`. Fields are
 * never moved or removed; new counters are appended at the end (the completions by the
 * outcomes that came with pod health follow `decisions_by_match_bucket`).
 */
typedef struct kvroute_stats {
  /**
   * Live pods.
   */
  uint64_t pods;
  /**
   * Live pods that are ready.
   */
  uint64_t ready_pods;
  /**
   * Models known (served by a pod now or earlier).
   */
  uint64_t models;
  /**
   * Sum of the live pods' in-flight counts.
   */
  uint64_t in_flight;
  /**
   * Tickets open now.
   */
  uint64_t tickets_open;
  /**
   * Tickets issued (successful routes).
   */
  uint64_t tickets_issued;
  /**
   * Completions accepted with `KVROUTE_OUTCOME_SUCCESS`.
   */
  uint64_t completed_success;
  /**
   * Completions accepted with `KVROUTE_OUTCOME_CANCELLED`.
   */
  uint64_t completed_cancelled;
  /**
   * Completions accepted with `KVROUTE_OUTCOME_FAILED`.
   */
  uint64_t completed_failed;
  /**
   * Tickets released by the ticket TTL because no completion came.
   */
  uint64_t tickets_expired;
  /**
   * Tickets whose pod had been removed when they were completed or expired.
   */
  uint64_t tickets_orphaned;
  /**
   * Completions and first-token reports rejected (a ticket never issued, or already
   * completed or expired).
   */
  uint64_t tickets_rejected;
  /**
   * Blocks in the prefix index.
   */
  uint64_t index_blocks;
  /**
   * The index capacity in blocks.
   */
  uint64_t index_capacity;
  /**
   * New blocks inserted into the index.
   */
  uint64_t index_inserted;
  /**
   * Blocks evicted to make room.
   */
  uint64_t index_evicted;
  /**
   * Blocks dropped by the index TTL.
   */
  uint64_t index_expired;
  /**
   * Blocks dropped because their last pod was removed.
   */
  uint64_t index_purged;
  /**
   * Route calls for a model no pod serves.
   */
  uint64_t unknown_model;
  /**
   * Route calls rejected because no pod of the model was ready and in service (or, with an
   * endpoint subset, none in the subset: `KVROUTE_STATUS_NO_POD_IN_SUBSET` counts here too).
   */
  uint64_t no_ready_pod;
  /**
   * Times prefix-cache's imbalance guard fired.
   */
  uint64_t imbalance_events;
  /**
   * Decisions by reason, indexed by `kvroute_reason` value (one entry per reason, 0 to
   * `KVROUTE_REASON_SESSION_AFFINITY`).
   */
  uint64_t routed_by_reason[16];
  /**
   * prefix-cache decisions by the chosen pod's match percent, in AIBrix's buckets
   * `0`, `1-25`, `26-50`, `51-75`, `76-100`.
   */
  uint64_t decisions_by_match_bucket[5];
  /**
   * Completions accepted with `KVROUTE_OUTCOME_CONNECT_FAILED`.
   */
  uint64_t completed_connect_failed;
  /**
   * Completions accepted with `KVROUTE_OUTCOME_RESET`.
   */
  uint64_t completed_reset;
  /**
   * Completions accepted with `KVROUTE_OUTCOME_TIMEOUT`.
   */
  uint64_t completed_timeout;
} kvroute_stats;

/**
 * What the caller observed about a request, passed to `kvroute_router_complete_with_timings()`
 * when it finished, or to `kvroute_router_first_token()` when its first token came. Only the
 * fields whose `KVROUTE_TIMING_*` bit is set in `known` are read. The layout is frozen.
 */
typedef struct kvroute_timings {
  /**
   * Time from routing to the first response byte (or first token), ms.
   */
  uint64_t first_token_ms;
  /**
   * Time from routing to the end of the response, ms.
   */
  uint64_t total_ms;
  /**
   * Tokens generated.
   */
  uint32_t output_tokens;
  /**
   * Prompt tokens the engine served from its prefix cache (`usage.prompt_tokens_details`).
   */
  uint32_t cached_tokens;
  /**
   * Prompt tokens as the engine counted them (`usage.prompt_tokens`).
   */
  uint32_t prompt_tokens;
  /**
   * Which fields are set: an OR of `KVROUTE_TIMING_*` bits.
   */
  uint32_t known;
} kvroute_timings;

/**
 * A pod id, issued by `kvroute_router_add_pod()` / `kvroute_router_upsert_pod()`. Ids are never
 * reused: a pod removed and added again under the same name gets a new id.
 */
typedef uint32_t kvroute_pod_id;

/**
 * An engine's own view of its load, as scraped from its metrics (vLLM names below), passed to
 * `kvroute_router_observe_engine()` or `kvroute_router_observe_engine_timed()`. `running` and
 * `waiting` are always read; the other fields only when their `KVROUTE_ENGINE_*` bit is set in
 * `known`. The layout is frozen (the engine's timing counters come in a separate
 * `kvroute_engine_timing`).
 */
typedef struct kvroute_engine_snapshot {
  /**
   * KV-cache usage in [0, 1] (`vllm:kv_cache_usage_perc`; several engines: the fullest).
   * When the free share of the pod's KV cache (its size from
   * `kvroute_router_set_engine_kv_cache_tokens()`) cannot hold a request's uncached prompt,
   * least-ttft takes the pod to run no more sequences than `running`.
   */
  double kv_usage;
  /**
   * Prefix-cache queries in tokens, cumulative (`vllm:prefix_cache_queries_total`).
   */
  uint64_t prefix_queries;
  /**
   * Prefix-cache hits in tokens, cumulative (`vllm:prefix_cache_hits_total`).
   */
  uint64_t prefix_hits;
  /**
   * Sequences running (`vllm:num_requests_running`).
   */
  uint32_t running;
  /**
   * Requests waiting (`vllm:num_requests_waiting`).
   */
  uint32_t waiting;
  /**
   * Which optional fields are set: an OR of `KVROUTE_ENGINE_*` bits.
   */
  uint32_t known;
} kvroute_engine_snapshot;

/**
 * An engine's cumulative timing counters, as scraped from its metrics (vLLM names below),
 * passed beside a `kvroute_engine_snapshot` to `kvroute_router_observe_engine_timed()`. Each
 * pair is read only when its `KVROUTE_ENGINE_TIMING_*` bit is set in `known`. The layout is
 * frozen.
 */
typedef struct kvroute_engine_timing {
  /**
   * Seconds from scheduling to first token, summed over requests, cumulative
   * (`vllm:request_prefill_time_seconds_sum`); finite and >= 0.
   */
  double prefill_seconds;
  /**
   * Seconds between consecutive output tokens, summed, cumulative
   * (`vllm:inter_token_latency_seconds_sum`, or `vllm:time_per_output_token_seconds_sum` on
   * older vLLM); finite and >= 0.
   */
  double inter_token_seconds;
  /**
   * Requests counted in `prefill_seconds`, cumulative
   * (`vllm:request_prefill_time_seconds_count`).
   */
  uint64_t prefills;
  /**
   * Gaps counted in `inter_token_seconds`, cumulative (the same histogram's `_count`).
   */
  uint64_t inter_tokens;
  /**
   * Which pairs are set: an OR of `KVROUTE_ENGINE_TIMING_*` bits.
   */
  uint32_t known;
} kvroute_engine_timing;

/**
 * One pod as the router sees it, read by `kvroute_router_pod_info()`. Fields are never moved
 * or removed; new ones are appended at the end (the health fields after `ready`).
 */
typedef struct kvroute_pod_info {
  /**
   * Requests routed to the pod since it was added.
   */
  uint64_t routed;
  /**
   * The pod's id.
   */
  kvroute_pod_id id;
  /**
   * Requests routed to it and not yet completed or expired.
   */
  uint32_t in_flight;
  /**
   * How many models it serves.
   */
  uint32_t models;
  /**
   * Whether it may receive new requests (as set by `kvroute_router_add_pod()` and
   * `kvroute_router_set_pod_ready()`; its health is below).
   */
  bool ready;
  /**
   * Ejected by outlier detection and not yet back in service: waiting out its ejection
   * (`ejected_until_ms`), or probing.
   */
  bool ejected;
  /**
   * Its ejection time is over and it takes one probe request at a time, whose outcome
   * decides whether it is back in service (`ejected` is still set).
   */
  bool probing;
  /**
   * Its active checks are failing (`kvroute_router_report_health_check()`): out of service
   * until they pass again.
   */
  bool checks_failing;
  /**
   * While it waits out an ejection, when that ends on the caller's clock (ms); 0 otherwise
   * (in service, or probing).
   */
  uint64_t ejected_until_ms;
  /**
   * Times it was ejected for consecutive upstream errors (`consecutive_5xx`), kept when the
   * pod is removed and added again under its name.
   */
  uint64_t ejections_5xx;
  /**
   * Times it was ejected for consecutive gateway failures (connect failures, resets,
   * timeouts), kept likewise.
   */
  uint64_t ejections_gateway;
} kvroute_pod_info;

/**
 * One routing decision, written by `kvroute_router_route()` / `kvroute_router_route_json()`
 * (and their `_subset` and `_session` variants, and the token calls).
 *
 * The request holds an in-flight slot on `pod` until `ticket` is passed to
 * `kvroute_router_complete()`. Fields are never moved or removed; new ones are appended at the
 * end (`excluded` and `health_probe` came with pod health, `data_parallel_rank` with
 * data-parallel servers). The session id of
 * `session-affinity` is no field (its length follows the pod's address):
 * `kvroute_router_session_id()` reads it.
 */
typedef struct kvroute_decision {
  /**
   * The ticket to complete exactly once.
   */
  kvroute_ticket ticket;
  /**
   * The mean in-flight load over the ready pods, before this request.
   */
  double load_mean;
  /**
   * The chosen pod (see `kvroute_router_pod_name()` / `kvroute_router_pod_address()`).
   */
  kvroute_pod_id pod;
  /**
   * Why this pod: a `kvroute_reason` value.
   */
  uint32_t reason;
  /**
   * Leading blocks of the prompt the chosen pod held in the prefix index.
   */
  uint32_t matched_blocks;
  /**
   * Complete blocks in the prompt.
   */
  uint32_t total_blocks;
  /**
   * `matched_blocks * 100 / total_blocks` rounded down, 0 when the prompt has no complete
   * block.
   */
  uint32_t match_percent;
  /**
   * The chosen pod's in-flight load, before this request.
   */
  uint32_t load;
  /**
   * The smallest in-flight load over the ready pods, before this request.
   */
  uint32_t load_min;
  /**
   * The largest in-flight load over the ready pods, before this request.
   */
  uint32_t load_max;
  /**
   * How many pods of the model were ready.
   */
  uint32_t ready_pods;
  /**
   * Whether prefix-cache's imbalance guard (`max - min > imbalance count`) fired.
   */
  bool imbalance;
  /**
   * Ready pods of the model that were no candidates because of their health (ejected, one
   * probe already out, or failing active checks); pods set not ready are not counted.
   */
  uint32_t excluded;
  /**
   * The request is the probe of a pod whose ejection is over: its outcome decides whether
   * the pod is back in service (success readmits it, a failure ejects it again for longer,
   * a cancel lets the next request probe).
   */
  bool health_probe;
  /**
   * The chosen pod's engine rank when it is one engine of a data-parallel server
   * (`kvroute_router_set_pod_data_parallel_rank()`): send it upstream as vLLM's
   * `X-data-parallel-rank` header. -1 for a whole server.
   */
  int64_t data_parallel_rank;
} kvroute_decision;

/**
 * Every status, in number order.
 */
#define kvroute_status_ALL { kvroute_status_Ok, kvroute_status_NullParameter, kvroute_status_InvalidParameter, kvroute_status_InvalidUtf8, kvroute_status_InsufficientSize, kvroute_status_UnknownModel, kvroute_status_NoReadyPod, kvroute_status_UnknownPod, kvroute_status_UnknownTicket, kvroute_status_TicketNotOpen, kvroute_status_InvalidStrategy, kvroute_status_InvalidAddress, kvroute_status_EmptyName, kvroute_status_InvalidBody, kvroute_status_InvalidConfig, kvroute_status_NoPodInSubset, kvroute_status_Panic, kvroute_status_Poisoned, }

/**
 * Every reason, in number order.
 */
#define kvroute_reason_ALL { kvroute_reason_Random, kvroute_reason_LeastRequest, kvroute_reason_PrefixMatch, kvroute_reason_PrefixMatchSkipped, kvroute_reason_LeastRequestFallback, kvroute_reason_Weighted, kvroute_reason_LeastTtft, kvroute_reason_LeastTtftProbe, kvroute_reason_LeastKvCache, kvroute_reason_LeastGpuCache, kvroute_reason_LeastBusyTime, kvroute_reason_LeastLatency, kvroute_reason_Throughput, kvroute_reason_LeastUtilization, kvroute_reason_PowerOfTwo, kvroute_reason_SessionAffinity, }

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

/**
 * A new builder holding the default configuration. The caller owns it and must pass it to
 * `kvroute_config_builder_build()` or `kvroute_config_builder_free()` exactly once.
 *
 * Returns NULL only if the library panicked.
 */
struct kvroute_config_builder *kvroute_config_builder_new(void);

/**
 * Frees a builder that was not built. NULL is a no-op. Do not call it after
 * `kvroute_config_builder_build()`, which consumed the builder.
 */
void kvroute_config_builder_free(struct kvroute_config_builder *builder);

/**
 * Sets the strategy used when a route call names none (AIBrix's `ROUTING_ALGORITHM`):
 * `spec` is `name[:weight][,name[:weight]...]` over `random`, `least-request`, `prefix-cache`,
 * `least-ttft` and AIBrix's `least-kv-cache`, `least-gpu-cache`, `least-busy-time`,
 * `least-utilization`, `least-latency`, `throughput`, `power-of-two` (not weightable) and
 * `session-affinity`, case-insensitive, for example `"least-ttft"` or
 * `"prefix-cache:2,least-request:1"`. The strategies that read engine metrics read what
 * `kvroute_router_observe_engine()` reported. `(spec, spec_len)` is borrowed for the call only and need
 * not be NUL-terminated.
 *
 * Returns `KVROUTE_STATUS_INVALID_STRATEGY` (builder unchanged) for a spec that does not parse,
 * `KVROUTE_STATUS_INVALID_UTF8`, or `KVROUTE_STATUS_NULL_PARAMETER`.
 */
kvroute_status kvroute_config_builder_set_strategy(struct kvroute_config_builder *builder,
                                                   const uint8_t *spec,
                                                   size_t spec_len);

/**
 * Sets one setting of least-ttft's TTFT model by name, as the Envoy service's `[ttft]` TOML
 * section names it: `bytes_per_token`, `engine_block_tokens` (the engine's KV block size in
 * tokens, default 16), `max_seqs` (default sequences per pod, default 256),
 * `prefill_tokens_per_s`, `tpot_ms`, `overhead_ms`, `output_tokens`, `learning_rate`,
 * `max_sample_ratio`, `snapshot_max_age_ms`, `tie_ms`, `stall_weight`, `explore_wait_ms`
 * (defaults and meanings: kvroute-core's `TtftConfig`). Counts must be whole numbers.
 * `(key, key_len)` is borrowed for the call only and need not be NUL-terminated.
 *
 * Returns `KVROUTE_STATUS_INVALID_PARAMETER` (builder unchanged) for an unknown key or a value
 * out of the setting's range, `KVROUTE_STATUS_INVALID_UTF8`, or
 * `KVROUTE_STATUS_NULL_PARAMETER`.
 */
kvroute_status kvroute_config_builder_set_ttft(struct kvroute_config_builder *builder,
                                               const uint8_t *key,
                                               size_t key_len,
                                               double value);

/**
 * Sets the block size in bytes of the prompt hash (default 128). Returns
 * `KVROUTE_STATUS_INVALID_PARAMETER` (builder unchanged) for 0 or more than 1 MiB.
 */
kvroute_status kvroute_config_builder_set_block_size(struct kvroute_config_builder *builder,
                                                     size_t block_size);

/**
 * Sets the prefix-index capacity in blocks, over all models and pods (default 200000).
 * Returns `KVROUTE_STATUS_INVALID_PARAMETER` (builder unchanged) for 0.
 */
kvroute_status kvroute_config_builder_set_index_capacity(struct kvroute_config_builder *builder,
                                                         size_t blocks);

/**
 * Sets how long a pod's index entry stays valid after it was last written, in ms (default
 * 1200000, 20 min). Returns `KVROUTE_STATUS_INVALID_PARAMETER` (builder unchanged) for 0.
 */
kvroute_status kvroute_config_builder_set_index_ttl_ms(struct kvroute_config_builder *builder,
                                                       uint64_t ttl_ms);

/**
 * Sets how long a ticket may stay open before `kvroute_router_tick()` expires it and releases
 * its in-flight slot, in ms (default 1800000, 30 min). A safety net for lost completions only.
 * Returns `KVROUTE_STATUS_INVALID_PARAMETER` (builder unchanged) for 0.
 */
kvroute_status kvroute_config_builder_set_ticket_ttl_ms(struct kvroute_config_builder *builder,
                                                        uint64_t ttl_ms);

/**
 * Sets prefix-cache's imbalance threshold: when `max - min` in-flight over the ready pods
 * exceeds it, the least-loaded pod is chosen (default 16).
 */
kvroute_status kvroute_config_builder_set_imbalance_abs_count(struct kvroute_config_builder *builder,
                                                              uint32_t count);

/**
 * Sets `k` in prefix-cache's `load <= mean + k * stddev` filter (default 2.0). Returns
 * `KVROUTE_STATUS_INVALID_PARAMETER` (builder unchanged) for a negative or non-finite value.
 */
kvroute_status kvroute_config_builder_set_stddev_factor(struct kvroute_config_builder *builder,
                                                        double factor);

/**
 * Sets the seed of every random choice (tie-breaks, `random`) and, unless
 * `kvroute_config_builder_set_hash_seed()` is called, of the prompt hash. The same seed and the
 * same calls give the same decisions. Production callers pass fresh OS randomness.
 */
kvroute_status kvroute_config_builder_set_seed(struct kvroute_config_builder *builder,
                                               uint64_t seed);

/**
 * Fixes the XXH64 seed of the prompt hash chain (AIBrix's `AIBRIX_PREFIX_CACHE_HASH_SEED`).
 * Set it to the same value wherever block hashes must agree; by default it is derived from
 * the seed.
 */
kvroute_status kvroute_config_builder_set_hash_seed(struct kvroute_config_builder *builder,
                                                    uint64_t hash_seed);

/**
 * Sets how many upstream errors in a row eject a pod (default 5; 0 turns the rule off). Every
 * failure outcome counts: `KVROUTE_OUTCOME_FAILED`, `_CONNECT_FAILED`, `_RESET`, `_TIMEOUT`;
 * a success resets the count and a cancel leaves it alone. Envoy's `consecutive_5xx`.
 */
kvroute_status kvroute_config_builder_set_consecutive_5xx(struct kvroute_config_builder *builder,
                                                          uint32_t count);

/**
 * Sets how many gateway failures in a row (`KVROUTE_OUTCOME_CONNECT_FAILED`, `_RESET`,
 * `_TIMEOUT`: the pod was not reached or did not answer) eject a pod (default 3; 0 turns the
 * rule off). Envoy's `consecutive_gateway_failure`, enforced.
 */
kvroute_status kvroute_config_builder_set_consecutive_gateway_failures(struct kvroute_config_builder *builder,
                                                                       uint32_t count);

/**
 * Sets the first ejection's length in ms (default 30000); a pod's n-th ejection lasts n times
 * as long (n decays by one for each such length the pod then spends in service), capped by
 * `kvroute_config_builder_set_max_ejection_ms()`. Returns `KVROUTE_STATUS_INVALID_PARAMETER`
 * (builder unchanged) for 0.
 */
kvroute_status kvroute_config_builder_set_base_ejection_ms(struct kvroute_config_builder *builder,
                                                           uint64_t ms);

/**
 * Sets the longest ejection in ms (default 300000); a value below the base ejection time is
 * taken as the base ejection time.
 */
kvroute_status kvroute_config_builder_set_max_ejection_ms(struct kvroute_config_builder *builder,
                                                          uint64_t ms);

/**
 * Sets the most pods of a model that may be ejected at once, as a percentage of its pods
 * (default 10). One pod may always be ejected, and one pod of every model always stays in
 * service: an ejection that would break either rule is not made
 * (`KVROUTE_HEALTH_EVENT_EJECTION_SKIPPED`). Returns `KVROUTE_STATUS_INVALID_PARAMETER`
 * (builder unchanged) above 100.
 */
kvroute_status kvroute_config_builder_set_max_ejection_percent(struct kvroute_config_builder *builder,
                                                               uint32_t percent);

/**
 * Sets how many failed active checks in a row (`kvroute_router_report_health_check()`) take
 * a pod out of service (default 3; 0: checks never do).
 */
kvroute_status kvroute_config_builder_set_unhealthy_threshold(struct kvroute_config_builder *builder,
                                                              uint32_t count);

/**
 * Sets how many passed active checks in a row bring a pod whose checks were failing back
 * into service (default 1; 0 is taken as 1).
 */
kvroute_status kvroute_config_builder_set_healthy_threshold(struct kvroute_config_builder *builder,
                                                            uint32_t count);

/**
 * Validates the builder's settings and turns them into a configuration.
 *
 * The builder is consumed whether this succeeds or fails: do not use or free it afterwards
 * (a NULL `builder` is `KVROUTE_STATUS_NULL_PARAMETER`). On success `*config_out` is a new
 * configuration the caller owns and frees with `kvroute_config_free()`. Returns
 * `KVROUTE_STATUS_INVALID_CONFIG` if the settings do not fit together, or
 * `KVROUTE_STATUS_NULL_PARAMETER` if `config_out` is NULL (the builder is still consumed).
 */
kvroute_status kvroute_config_builder_build(struct kvroute_config_builder *builder,
                                            const struct kvroute_config **config_out);

/**
 * Releases the caller's reference to a configuration. NULL is a no-op. Routers built from it
 * keep their own reference.
 */
void kvroute_config_free(const struct kvroute_config *config);

/**
 * Writes the one-line explanation of the decision that issued `ticket` to `(buf, len)`,
 * NUL-terminated, for logs and the `x-kvroute-decision` response header, e.g.
 * `strategy=prefix-cache reason=prefix_match pod=vllm-b match=100% blocks=218/218 imbalance=0
 * load=12 min=3 max=12 mean=5.00 ready=3 ticket=17 ...` (one line, ASCII, no commas or
 * quotes; the text is the core's `Decision` rendering and may gain fields).
 *
 * The explanation is kept while the ticket is open: call it before
 * `kvroute_router_complete()`. Returns `KVROUTE_STATUS_UNKNOWN_TICKET` for a ticket that is
 * not open (never issued, completed or expired). On success `*out_n` is the length without
 * the NUL. If `len` is too small, returns `KVROUTE_STATUS_INSUFFICIENT_SIZE` with `*out_n` set
 * to the `len` needed (length + 1) and `buf` untouched; `(NULL, 0)` is a valid size query.
 * 512 bytes is enough unless pod names are long.
 */
kvroute_status kvroute_router_explain(const struct kvroute_router *router,
                                      kvroute_ticket ticket,
                                      uint8_t *buf,
                                      size_t len,
                                      size_t *out_n);

/**
 * Writes the session id of the decision that issued `ticket` to `(buf, len)`, NUL-terminated:
 * for AIBrix's `session-affinity`, the value to return to the client in the response's
 * `x-session-id` header. The client's next request passes it back (to
 * `kvroute_router_route_session()` or another `_session` call) and goes to the same pod while
 * that pod is a candidate. The id is the standard base64 (padded, ASCII) of the chosen pod's
 * `ip:port` as given to `kvroute_router_add_pod()`, AIBrix's encoding: 4 bytes for every 3 of
 * the address, so 96 bytes hold the id of any address written without leading zeros.
 *
 * A decision carries a session id when the strategy spec it was routed with (the request's,
 * or the configured default) includes `session-affinity` or `least-ttft` (whose model counts
 * the pod a session id names as holding the previous answer), whichever route call made it and
 * whether or not the request had a session id. Otherwise its session id is empty: `*out_n` is
 * 0 and `buf` holds only the NUL (a session id is never empty).
 *
 * The rest is as in `kvroute_router_explain()`: the id is kept while the ticket is open (call
 * it before `kvroute_router_complete()`; `KVROUTE_STATUS_UNKNOWN_TICKET` for a ticket that is
 * not open); `KVROUTE_STATUS_INSUFFICIENT_SIZE` with `*out_n` set to the length + 1 and `buf`
 * untouched when `len` is too small; `(NULL, 0)` is a valid size query.
 */
kvroute_status kvroute_router_session_id(const struct kvroute_router *router,
                                         kvroute_ticket ticket,
                                         uint8_t *buf,
                                         size_t len,
                                         size_t *out_n);

/**
 * Reads every counter of the router into `*stats_out`.
 */
kvroute_status kvroute_router_stats(const struct kvroute_router *router,
                                    struct kvroute_stats *stats_out);

/**
 * `kvroute_router_complete()` plus what was observed about the request: the timings of a
 * successful request teach the `least-ttft` model the pod's prefill and decode rates. `timings`
 * may be NULL (no timings, the same as `kvroute_router_complete()`); it is borrowed for the
 * call only. A `first_token_ms` or `total_ms` longer than the time since routing (on the
 * router's clock, `now_ms`) is taken as that time. Returns `KVROUTE_STATUS_INVALID_PARAMETER`
 * for unknown bits in `timings->known`, otherwise the statuses of `kvroute_router_complete()`.
 */
kvroute_status kvroute_router_complete_with_timings(struct kvroute_router *router,
                                                    kvroute_ticket ticket,
                                                    uint32_t outcome,
                                                    const struct kvroute_timings *timings,
                                                    uint64_t now_ms);

/**
 * `kvroute_router_complete_with_timings()` that also says what the outcome changed in the
 * pod's health: on success, when `event_out` is not NULL, `*event_out` is a
 * `kvroute_health_event` (`KVROUTE_HEALTH_EVENT_NONE` when nothing changed;
 * `_EJECTED` when this failure ejected the pod; `_EJECTION_SKIPPED` when it met an ejection
 * rule but the model could not spare it; `_READMITTED` when it was the pod's successful
 * probe). `timings` and `event_out` may each be NULL; nothing is written on error. A ticket
 * whose pod was removed meanwhile gives `KVROUTE_HEALTH_EVENT_NONE`. Statuses as
 * `kvroute_router_complete_with_timings()`.
 */
kvroute_status kvroute_router_complete_with_event(struct kvroute_router *router,
                                                  kvroute_ticket ticket,
                                                  uint32_t outcome,
                                                  const struct kvroute_timings *timings,
                                                  uint64_t now_ms,
                                                  uint32_t *event_out);

/**
 * Reports an active health check of the pod (the caller's `GET /health` or metrics scrape of
 * its engine) that `passed` or failed at `now_ms`. `unhealthy_threshold` failed checks in a
 * row (default 3) take the pod out of service (`KVROUTE_HEALTH_EVENT_CHECKS_FAILING`: routes
 * skip it and count it in `kvroute_decision.excluded`); `healthy_threshold` passed checks in a
 * row (default 1) bring it back (`_CHECKS_PASSING`). A passed check also ends an ejection for
 * gateway failures when a check failed since the ejection began (the pod went down and came
 * back: `_READMITTED`); it never ends an ejection for upstream errors (5xx), which is what
 * outcome-based ejection is for.
 *
 * On success, when `event_out` is not NULL, `*event_out` is the `kvroute_health_event` the
 * check caused (`KVROUTE_HEALTH_EVENT_NONE` when nothing changed). `event_out` may be NULL.
 * Returns `KVROUTE_STATUS_UNKNOWN_POD` for an id never issued or removed,
 * `KVROUTE_STATUS_NULL_PARAMETER` for a NULL router, `KVROUTE_STATUS_POISONED`; nothing is
 * written or changed on error.
 */
kvroute_status kvroute_router_report_health_check(struct kvroute_router *router,
                                                  kvroute_pod_id pod,
                                                  bool passed,
                                                  uint64_t now_ms,
                                                  uint32_t *event_out);

/**
 * Reports the first token of an open request (routed, not yet completed), as soon as the
 * caller sees it: a streaming proxy sees it long before the completion, and the `least-ttft`
 * model then learns the pod's prompt-side rates (prefill rate or overhead, bytes per token,
 * how much of the prompt the engine's cache served) a whole decode earlier. Optional: a caller
 * that never calls it loses only that head start. Nothing is released: the ticket stays open
 * and must still be completed once (its explanation stays available too).
 *
 * Of `timings` (borrowed for the call only) only `first_token_ms`, `prompt_tokens` and
 * `cached_tokens` are read. `KVROUTE_TIMING_FIRST_TOKEN_MS` is required (the time from
 * routing to the first token, which the caller measured: a report that arrives late must not
 * read as a slow prefill; longer than the time since routing, it is taken as that time);
 * `prompt_tokens` and `cached_tokens` are read when their bits are set.
 * The other `KVROUTE_TIMING_*` bits (`TOTAL_MS`, `OUTPUT_TOKENS`) are accepted and not read,
 * so one struct can be filled in as the response streams, passed here at the first token and
 * to `kvroute_router_complete_with_timings()` at the end. Each part of the prompt side is
 * learned once per ticket: the first-token time here; prompt and cached tokens here when
 * their bits are set (a vLLM stream carries usage at its first token only with continuous
 * usage stats), else from the completion's. A second report for the same ticket
 * returns `KVROUTE_STATUS_OK` and is ignored. Reporting a ticket whose pod was removed
 * meanwhile succeeds.
 *
 * Returns `KVROUTE_STATUS_NULL_PARAMETER` if `router` or `timings` is NULL,
 * `KVROUTE_STATUS_INVALID_PARAMETER` for unknown bits in `timings->known` or a missing
 * `KVROUTE_TIMING_FIRST_TOKEN_MS`, `KVROUTE_STATUS_UNKNOWN_TICKET` for a ticket this router
 * never issued, `KVROUTE_STATUS_TICKET_NOT_OPEN` for one already completed or expired,
 * `KVROUTE_STATUS_POISONED`. Nothing changes on any error.
 */
kvroute_status kvroute_router_first_token(struct kvroute_router *router,
                                          kvroute_ticket ticket,
                                          const struct kvroute_timings *timings,
                                          uint64_t now_ms);

/**
 * Records the pod's engine state as scraped at `now_ms`. The `least-ttft` model uses it until
 * it grows old, adding engine load the router did not route. `snapshot` is borrowed for the
 * call only. Returns `KVROUTE_STATUS_UNKNOWN_POD`, `KVROUTE_STATUS_NULL_PARAMETER`, or
 * `KVROUTE_STATUS_INVALID_PARAMETER` for unknown bits in `known` or a `kv_usage` outside [0, 1].
 * The same as `kvroute_router_observe_engine_timed()` with a NULL `timing`.
 */
kvroute_status kvroute_router_observe_engine(struct kvroute_router *router,
                                             kvroute_pod_id pod,
                                             const struct kvroute_engine_snapshot *snapshot,
                                             uint64_t now_ms);

/**
 * `kvroute_router_observe_engine()` plus the engine's cumulative timing counters. Where the
 * pod's completions come without first-token times (`kvroute_router_complete()`, or timings
 * without `KVROUTE_TIMING_FIRST_TOKEN_MS`, as behind Envoy), the `least-ttft` model learns the
 * pod's prefill rate and overhead from the prefill pair together with the snapshot's
 * `prefix_queries` and `prefix_hits` (prompt tokens computed per second of prefill, one
 * sample per at least 4 prefills); where they come without a first-token time or without
 * output tokens, its time per output token from the inter-token pair (one sample per pair of
 * snapshots with a gap between them). A counter that went down (engine restart)
 * starts a new window. `snapshot` and `timing` are borrowed for the call only; `timing` may be
 * NULL (no timing counters, the same as `kvroute_router_observe_engine()`). Returns
 * `KVROUTE_STATUS_INVALID_PARAMETER` for unknown bits in `timing->known` or a set
 * `prefill_seconds` or `inter_token_seconds` that is negative or not finite, otherwise the
 * statuses of `kvroute_router_observe_engine()`.
 */
kvroute_status kvroute_router_observe_engine_timed(struct kvroute_router *router,
                                                   kvroute_pod_id pod,
                                                   const struct kvroute_engine_snapshot *snapshot,
                                                   const struct kvroute_engine_timing *timing,
                                                   uint64_t now_ms);

/**
 * Sets the size of the pod's engine KV cache in tokens (vLLM: `num_gpu_blocks` ×
 * `block_size`, labels of `vllm:cache_config_info`; its log's "GPU KV cache size"), added to
 * every engine snapshot recorded for the pod afterwards; 0 makes it unknown again (the
 * default). With it and a snapshot's `kv_usage`, least-ttft takes a request whose uncached
 * prompt does not fit in the free share to wait for a running sequence to end; without it,
 * the KV cache is never taken as full. Returns `KVROUTE_STATUS_UNKNOWN_POD` for an id never
 * issued or removed.
 */
kvroute_status kvroute_router_set_engine_kv_cache_tokens(struct kvroute_router *router,
                                                         kvroute_pod_id pod,
                                                         uint64_t tokens);

/**
 * Sets the pod's engine capacity in concurrent sequences (vLLM `--max-num-seqs`) for the
 * `least-ttft` model; 0 is treated as 1. Returns `KVROUTE_STATUS_UNKNOWN_POD` for an id never
 * issued or removed.
 */
kvroute_status kvroute_router_set_pod_capacity(struct kvroute_router *router,
                                               kvroute_pod_id pod,
                                               uint32_t max_seqs);

/**
 * Computes the block hashes of a prompt with hash scheme v1 (the router's: the prompt's bytes
 * cut into `block_size`-byte blocks, a trailing partial block ignored, each block hashed as
 * `XXH64_seed(LE64(previous hash, or seed for the first) || block)`), into `(buf, len)`.
 *
 * `(prompt, prompt_len)` is borrowed for the call only. On success `*out_n` is the number of
 * hashes (`prompt_len / block_size`). If `len` is too small, returns
 * `KVROUTE_STATUS_INSUFFICIENT_SIZE` with `*out_n` set to that number and `buf` untouched;
 * `(NULL, 0)` is a valid count query. Returns `KVROUTE_STATUS_INVALID_PARAMETER` for a
 * `block_size` of 0 or above 1 MiB.
 */
kvroute_status kvroute_prefix_hashes(size_t block_size,
                                     uint64_t seed,
                                     const uint8_t *prompt,
                                     size_t prompt_len,
                                     uint64_t *buf,
                                     size_t len,
                                     size_t *out_n);

/**
 * Computes the token-block keys of a tokenized prompt, as `kvroute_router_route_tokens()` keys
 * it with `seed` the router's hash seed, into `(buf, len)`: for callers that precompute keys
 * (and route on them with `kvroute_router_route_keys()`) or check them.
 *
 * The scheme (kvroute's own): the ids are cut into blocks of `block_tokens` tokens, a trailing
 * partial block ignored; block `i`'s key is
 * `XXH64_seed(LE64(parent) || LE32(id) for each id of the block || extras)`, where `parent` is
 * `seed ^ 0x746f6b656e730001` for the first block and the previous block's key after it, and
 * `extras` is `0x01 || LE32(length) || name` for the LoRA adapter (every block) followed by
 * `0x02 || LE32(length) || salt` for the cache salt (first block only), each present only when
 * given.
 *
 * `(tokens, tokens_len)` is the prompt's token ids (`(NULL, 0)`: none); `(lora, lora_len)`
 * and `(cache_salt, cache_salt_len)` are as in `kvroute_router_route_tokens()` (`(NULL, 0)` or
 * empty: no LoRA, no salt). All are borrowed for the call only. On success `*out_n` is the
 * number of keys (`tokens_len / block_tokens`). If `len` is too small, returns
 * `KVROUTE_STATUS_INSUFFICIENT_SIZE` with `*out_n` set to that number and `buf` untouched;
 * `(NULL, 0)` is a valid count query. Returns `KVROUTE_STATUS_INVALID_PARAMETER` for a
 * `block_tokens` of 0 or above `KVROUTE_MAX_BLOCK_TOKENS`, `KVROUTE_STATUS_INVALID_UTF8` for a
 * LoRA name or salt that is not UTF-8.
 */
kvroute_status kvroute_token_block_keys(uint32_t block_tokens,
                                        uint64_t seed,
                                        const uint32_t *tokens,
                                        size_t tokens_len,
                                        const uint8_t *lora,
                                        size_t lora_len,
                                        const uint8_t *cache_salt,
                                        size_t cache_salt_len,
                                        uint64_t *buf,
                                        size_t len,
                                        size_t *out_n);

/**
 * Extracts the prompt text of an OpenAI-style JSON body exactly as
 * `kvroute_router_route_json()` does, into `(buf, len)`, NUL-terminated. On success `*out_n` is
 * its length in bytes without the NUL. If `len` is too small, returns
 * `KVROUTE_STATUS_INSUFFICIENT_SIZE` with `*out_n` set to the `len` needed (length + 1) and
 * `buf` untouched. Returns `KVROUTE_STATUS_INVALID_BODY` for a body that is not a JSON object
 * or whose `messages` or `prompt` field has the wrong type.
 */
kvroute_status kvroute_extract_prompt(const uint8_t *body,
                                      size_t body_len,
                                      uint8_t *buf,
                                      size_t len,
                                      size_t *out_n);

/**
 * Makes the pod named `name` serve `model`: creates the pod if no live pod has that name,
 * otherwise updates its address and readiness (keeping its in-flight count) and adds `model`
 * to the models it serves. On success `*pod_out` is the pod's id.
 *
 * `name`, `model` and `address` are UTF-8 `(ptr, len)` strings borrowed for the call only;
 * `address` is `ip:port` with a numeric IP (`10.0.0.1:8000`, `[::1]:8000`). Returns
 * `KVROUTE_STATUS_EMPTY_NAME`, `KVROUTE_STATUS_INVALID_ADDRESS`, `KVROUTE_STATUS_INVALID_UTF8`
 * or `KVROUTE_STATUS_NULL_PARAMETER` with nothing changed.
 */
kvroute_status kvroute_router_add_pod(struct kvroute_router *router,
                                      const uint8_t *model,
                                      size_t model_len,
                                      const uint8_t *name,
                                      size_t name_len,
                                      const uint8_t *address,
                                      size_t address_len,
                                      bool ready,
                                      kvroute_pod_id *pod_out);

/**
 * Creates or updates the pod named `name` (address and readiness; its in-flight count and
 * models are kept) without changing which models it serves. A new pod serves no model until
 * `kvroute_router_add_pod()` attaches one. On success `*pod_out` is the pod's id. Errors as
 * `kvroute_router_add_pod()`.
 */
kvroute_status kvroute_router_upsert_pod(struct kvroute_router *router,
                                         const uint8_t *name,
                                         size_t name_len,
                                         const uint8_t *address,
                                         size_t address_len,
                                         bool ready,
                                         kvroute_pod_id *pod_out);

/**
 * Sets whether the pod may receive new requests (its in-flight count is kept). Returns
 * `KVROUTE_STATUS_UNKNOWN_POD` for an id never issued or removed.
 */
kvroute_status kvroute_router_set_pod_ready(struct kvroute_router *router,
                                            kvroute_pod_id pod,
                                            bool ready);

/**
 * Makes the pod engine `rank` of a data-parallel server (vLLM `--data-parallel-size`: several
 * engines, each with its own KV cache and queue, behind one address), or a whole server again
 * with a negative `rank`. Add each engine as a pod of its own (its own name, the server's
 * address) and set its rank; a decision for it carries the rank
 * (`kvroute_decision.data_parallel_rank`), which the caller sends upstream as vLLM's
 * `X-data-parallel-rank` request header. Returns `KVROUTE_STATUS_UNKNOWN_POD`, or
 * `KVROUTE_STATUS_INVALID_PARAMETER` for a rank above `UINT32_MAX`, with nothing changed.
 */
kvroute_status kvroute_router_set_pod_data_parallel_rank(struct kvroute_router *router,
                                                         kvroute_pod_id pod,
                                                         int64_t rank);

/**
 * Changes the pod's `ip:port` address (UTF-8, borrowed for the call only). Returns
 * `KVROUTE_STATUS_UNKNOWN_POD` or `KVROUTE_STATUS_INVALID_ADDRESS` with nothing changed.
 */
kvroute_status kvroute_router_set_pod_address(struct kvroute_router *router,
                                              kvroute_pod_id pod,
                                              const uint8_t *address,
                                              size_t address_len);

/**
 * Stops the pod from serving `model` (UTF-8, borrowed for the call only) and forgets its
 * prefix-index entries for that model. Returns `KVROUTE_STATUS_UNKNOWN_POD` or
 * `KVROUTE_STATUS_UNKNOWN_MODEL` with nothing changed.
 */
kvroute_status kvroute_router_detach_pod(struct kvroute_router *router,
                                         const uint8_t *model,
                                         size_t model_len,
                                         kvroute_pod_id pod);

/**
 * Removes the model (UTF-8, borrowed for the call only): its pods stop serving it (they keep
 * their other models), its prefix-index entries are purged, and routing it returns
 * `KVROUTE_STATUS_UNKNOWN_MODEL` until `kvroute_router_add_pod()` attaches a pod to it again.
 * Its open tickets complete as usual and its statistics are kept. Returns
 * `KVROUTE_STATUS_UNKNOWN_MODEL` for a model not served, with nothing changed.
 */
kvroute_status kvroute_router_remove_model(struct kvroute_router *router,
                                           const uint8_t *model,
                                           size_t model_len);

/**
 * Removes the pod: it gets no new requests, its prefix-index entries are purged, and its open
 * tickets become orphans (completing them still succeeds). Its id is never reused. Returns
 * `KVROUTE_STATUS_UNKNOWN_POD` for an id never issued or already removed.
 */
kvroute_status kvroute_router_remove_pod(struct kvroute_router *router, kvroute_pod_id pod);

/**
 * Looks up the live pod named `name` (UTF-8, borrowed for the call only); on success
 * `*pod_out` is its id. Returns `KVROUTE_STATUS_UNKNOWN_POD` if there is none.
 */
kvroute_status kvroute_router_pod_id(const struct kvroute_router *router,
                                     const uint8_t *name,
                                     size_t name_len,
                                     kvroute_pod_id *pod_out);

/**
 * Lists the ids of every live pod, in the order they were added, into `(buf, len)`; on
 * success `*out_n` is their count. If `len` is too small, returns
 * `KVROUTE_STATUS_INSUFFICIENT_SIZE` with `*out_n` set to the count and `buf` untouched;
 * `(NULL, 0)` is a valid count query. (Pods may be added between a query and the next call.)
 */
kvroute_status kvroute_router_pods(const struct kvroute_router *router,
                                   kvroute_pod_id *buf,
                                   size_t len,
                                   size_t *out_n);

/**
 * Reads the pod's state into `*info_out`. Returns `KVROUTE_STATUS_UNKNOWN_POD` for an id never
 * issued or removed.
 */
kvroute_status kvroute_router_pod_info(const struct kvroute_router *router,
                                       kvroute_pod_id pod,
                                       struct kvroute_pod_info *info_out);

/**
 * The pod's in-flight count into `*in_flight_out`. Returns `KVROUTE_STATUS_UNKNOWN_POD` for an
 * id never issued or removed.
 */
kvroute_status kvroute_router_in_flight(const struct kvroute_router *router,
                                        kvroute_pod_id pod,
                                        uint32_t *in_flight_out);

/**
 * Copies the pod's name into `(buf, len)`, NUL-terminated; on success `*out_n` is its length
 * without the NUL. If `len` is too small, returns `KVROUTE_STATUS_INSUFFICIENT_SIZE` with
 * `*out_n` set to the `len` needed (length + 1) and `buf` untouched; `(NULL, 0)` is a valid size
 * query. Returns `KVROUTE_STATUS_UNKNOWN_POD` for an id never issued or removed.
 */
kvroute_status kvroute_router_pod_name(const struct kvroute_router *router,
                                       kvroute_pod_id pod,
                                       uint8_t *buf,
                                       size_t len,
                                       size_t *out_n);

/**
 * Copies the pod's `ip:port` address into `(buf, len)`, with the same rules as
 * `kvroute_router_pod_name()`. A proxy connects to this address.
 */
kvroute_status kvroute_router_pod_address(const struct kvroute_router *router,
                                          kvroute_pod_id pod,
                                          uint8_t *buf,
                                          size_t len,
                                          size_t *out_n);

/**
 * Routes one request whose prompt is given as raw bytes (the text the engine will see, as
 * UTF-8; any bytes are accepted and hashed as they are).
 *
 * - `(model, model_len)`: the model name, UTF-8, required.
 * - `(prompt, prompt_len)`: the prompt bytes; `(NULL, 0)` is an empty prompt (no blocks: no
 *   prefix can match).
 * - `(strategy, strategy_len)`: the request's strategy spec (AIBrix's `routing-strategy`
 *   header), or `(NULL, 0)` for the configured default.
 * - `now_ms`: the caller's monotonic clock in ms. Time never goes back for the router: an
 *   earlier value is treated as the latest one seen.
 *
 * Every input is borrowed for the call only. On success `*decision_out` holds the chosen pod
 * and a ticket: the pod's in-flight count is now one higher until the ticket is passed to
 * `kvroute_router_complete()`. On any error nothing changed and `*decision_out` is untouched:
 * `KVROUTE_STATUS_UNKNOWN_MODEL` (no pod serves the model), `KVROUTE_STATUS_NO_READY_POD`,
 * `KVROUTE_STATUS_INVALID_STRATEGY`, `KVROUTE_STATUS_INVALID_UTF8` (model or strategy),
 * `KVROUTE_STATUS_NULL_PARAMETER`, `KVROUTE_STATUS_POISONED`. The request carries no
 * output-token limit here; `kvroute_router_route_json()` reads one from the body. It carries
 * no session id either: with `session-affinity`, route with `kvroute_router_route_session()`.
 */
kvroute_status kvroute_router_route(struct kvroute_router *router,
                                    const uint8_t *model,
                                    size_t model_len,
                                    const uint8_t *prompt,
                                    size_t prompt_len,
                                    const uint8_t *strategy,
                                    size_t strategy_len,
                                    uint64_t now_ms,
                                    struct kvroute_decision *decision_out);

/**
 * `kvroute_router_route()` restricted to an endpoint subset: only the model's pods whose
 * `ip:port` address (as given to `kvroute_router_add_pod()`) is one of the
 * `endpoint_subset_len` NUL-terminated UTF-8 strings at `endpoint_subset` are candidates (the
 * Gateway API Inference Extension's subset hint, `x-gateway-destination-endpoint-subset`).
 * Unlike the `(ptr, len)` strings elsewhere, the addresses are C strings; the array and the
 * strings are borrowed for the call only.
 *
 * `(NULL, 0)` is no subset: the call is `kvroute_router_route()`. `(NULL, n > 0)` or a NULL
 * entry is `KVROUTE_STATUS_NULL_PARAMETER`, an entry that is not UTF-8
 * `KVROUTE_STATUS_INVALID_UTF8`. When no pod of the model in the subset is ready and in
 * service (an empty subset, addresses no pod of the model has, or only unready, ejected or
 * failing pods), the status is `KVROUTE_STATUS_NO_POD_IN_SUBSET` (503) instead of
 * `KVROUTE_STATUS_NO_READY_POD`; an unknown model is still `KVROUTE_STATUS_UNKNOWN_MODEL`.
 * Everything else is as in `kvroute_router_route()`.
 */
kvroute_status kvroute_router_route_subset(struct kvroute_router *router,
                                           const uint8_t *model,
                                           size_t model_len,
                                           const uint8_t *prompt,
                                           size_t prompt_len,
                                           const uint8_t *strategy,
                                           size_t strategy_len,
                                           const char *const *endpoint_subset,
                                           size_t endpoint_subset_len,
                                           uint64_t now_ms,
                                           struct kvroute_decision *decision_out);

/**
 * `kvroute_router_route_subset()` with the request's session id, for AIBrix's
 * `session-affinity` strategy. `(session_id, session_id_len)` is the value of the request's
 * `x-session-id` header: the session id a previous response carried, read from its decision
 * with `kvroute_router_session_id()`.
 *
 * When the strategy spec (the request's, or the configured default) includes
 * `session-affinity`, a session id naming a candidate (a pod of the model that is ready, in
 * service and, with a subset, in the subset) sends the request to it
 * (`KVROUTE_REASON_SESSION_AFFINITY`; in a weighted spec that pod scores 1 for
 * session-affinity and the others 0). A request without a session id, or with one naming no
 * candidate (its pod was removed, is not ready, is ejected or failing its checks, is outside
 * the subset, or the id is not the base64 of an address), goes to a uniformly random
 * candidate (`KVROUTE_REASON_RANDOM`) under `session-affinity` alone. Either way the decision
 * carries the chosen pod's session id (`kvroute_router_session_id()`), which the caller
 * returns to the client in the response's `x-session-id` header so that its next request
 * comes back to the same pod. Under `least-ttft` the session id does not pick the pod: the
 * TTFT model counts the pod it names as holding the previous turn's answer (which the prefix
 * index never saw), and the decision carries the chosen pod's session id as well. Other
 * strategies ignore it.
 *
 * A session id is stateless, AIBrix's encoding: the standard base64 (padded) of the pod's
 * `ip:port` address as given to `kvroute_router_add_pod()`, so whichever pod of the model has
 * that address takes the session. It is decoded as Go's `base64.StdEncoding` does (`\r` and
 * `\n` ignored), as given: no whitespace is trimmed.
 *
 * The session id is borrowed for the call only. `(NULL, 0)` and an empty id are no session
 * id; `(NULL, n > 0)` is `KVROUTE_STATUS_NULL_PARAMETER`. Any other bytes are accepted and are
 * never an error (a client's bad header must not fail its request): bytes that are not UTF-8
 * or not base64 name no pod. Everything else is as in `kvroute_router_route_subset()`.
 */
kvroute_status kvroute_router_route_session(struct kvroute_router *router,
                                            const uint8_t *model,
                                            size_t model_len,
                                            const uint8_t *prompt,
                                            size_t prompt_len,
                                            const uint8_t *strategy,
                                            size_t strategy_len,
                                            const char *const *endpoint_subset,
                                            size_t endpoint_subset_len,
                                            const uint8_t *session_id,
                                            size_t session_id_len,
                                            uint64_t now_ms,
                                            struct kvroute_decision *decision_out);

/**
 * Routes one request given as its OpenAI-style JSON body (`/v1/chat/completions` or
 * `/v1/completions`). The prompt is extracted as AIBrix v0.7.0 does: the `messages[].content`
 * values joined by one space (string contents unescaped, array or object contents appended as
 * the raw JSON text received), else the `prompt` string, else empty.
 *
 * `(model, model_len)` names the model; `(NULL, 0)` takes it from the body's `model` field
 * (`KVROUTE_STATUS_INVALID_BODY` if that is missing). Everything else is as in
 * `kvroute_router_route()`, plus `KVROUTE_STATUS_INVALID_BODY` for a body that is not a JSON
 * object or whose `messages`, `prompt` or `model` field has the wrong type. The body's
 * `max_completion_tokens` (else `max_tokens`), when it is an integer, caps the decode the
 * `least-ttft` model predicts for this request; any other value there is ignored.
 */
kvroute_status kvroute_router_route_json(struct kvroute_router *router,
                                         const uint8_t *model,
                                         size_t model_len,
                                         const uint8_t *body,
                                         size_t body_len,
                                         const uint8_t *strategy,
                                         size_t strategy_len,
                                         uint64_t now_ms,
                                         struct kvroute_decision *decision_out);

/**
 * `kvroute_router_route_json()` restricted to an endpoint subset, with the subset's rules and
 * statuses as in `kvroute_router_route_subset()`.
 */
kvroute_status kvroute_router_route_json_subset(struct kvroute_router *router,
                                                const uint8_t *model,
                                                size_t model_len,
                                                const uint8_t *body,
                                                size_t body_len,
                                                const uint8_t *strategy,
                                                size_t strategy_len,
                                                const char *const *endpoint_subset,
                                                size_t endpoint_subset_len,
                                                uint64_t now_ms,
                                                struct kvroute_decision *decision_out);

/**
 * `kvroute_router_route_json_subset()` with the request's session id (its `x-session-id`
 * header, which is not part of the body), with the session id's rules as in
 * `kvroute_router_route_session()`.
 */
kvroute_status kvroute_router_route_json_session(struct kvroute_router *router,
                                                 const uint8_t *model,
                                                 size_t model_len,
                                                 const uint8_t *body,
                                                 size_t body_len,
                                                 const uint8_t *strategy,
                                                 size_t strategy_len,
                                                 const char *const *endpoint_subset,
                                                 size_t endpoint_subset_len,
                                                 const uint8_t *session_id,
                                                 size_t session_id_len,
                                                 uint64_t now_ms,
                                                 struct kvroute_decision *decision_out);

/**
 * Routes one request whose prompt is given as token ids: the prompt tokenized with the
 * model's tokenizer and chat template exactly as the engine (vLLM) tokenizes it, for proxies
 * that tokenize requests themselves. The ids are cut into blocks of `block_tokens` tokens and
 * keyed with the router's hash seed, outside the router's lock (`kvroute_token_block_keys()`
 * computes the same keys), so that a block of the prefix index is a block of the engine's KV
 * cache; `least-ttft` then counts the prompt exactly, as `tokens_len` tokens, where the byte
 * calls estimate tokens from bytes.
 *
 * - `(model, model_len)`: the model name, UTF-8, required.
 * - `(tokens, tokens_len)`: the prompt's token ids, at most `UINT32_MAX`; `(NULL, 0)` is an
 *   empty prompt. A trailing partial block is not keyed (the engine caches full blocks only)
 *   but counts in the prompt's length.
 * - `block_tokens`: the engine's KV-cache block size in tokens (vLLM's `--block-size`;
 *   `KVROUTE_DEFAULT_BLOCK_TOKENS` is vLLM's default), 1 to `KVROUTE_MAX_BLOCK_TOKENS`, else
 *   `KVROUTE_STATUS_INVALID_PARAMETER`. Keys of different block sizes never match: route a
 *   model's requests with one size.
 * - `(lora, lora_len)`: the name of the LoRA adapter the request runs with, part of every
 *   block's key; `(NULL, 0)` or empty for none. UTF-8.
 * - `(cache_salt, cache_salt_len)`: the request's `cache_salt`, part of the first block's key
 *   (and so, through the chain, of every block's); `(NULL, 0)` or empty for none (vLLM
 *   ignores an empty salt too). UTF-8.
 * - `(strategy, strategy_len)`: as in `kvroute_router_route()`.
 * - `max_output_tokens`: the request's output-token limit (`max_completion_tokens`, else
 *   `max_tokens`), which caps the decode `least-ttft` predicts for it; 0 for none (vLLM
 *   rejects a limit of 0, so 0 never names a real one).
 * - `now_ms`: as in `kvroute_router_route()`.
 *
 * Every input is borrowed for the call only. On success `*decision_out` holds the chosen pod
 * and a ticket, as in `kvroute_router_route()`; `total_blocks` counts token blocks. On any
 * error nothing changed and `*decision_out` is untouched: the statuses of
 * `kvroute_router_route()` (`KVROUTE_STATUS_INVALID_UTF8` also for `lora` and `cache_salt`),
 * and `KVROUTE_STATUS_INVALID_PARAMETER` for a `block_tokens` out of range or more than
 * `UINT32_MAX` tokens.
 */
kvroute_status kvroute_router_route_tokens(struct kvroute_router *router,
                                           const uint8_t *model,
                                           size_t model_len,
                                           const uint32_t *tokens,
                                           size_t tokens_len,
                                           uint32_t block_tokens,
                                           const uint8_t *lora,
                                           size_t lora_len,
                                           const uint8_t *cache_salt,
                                           size_t cache_salt_len,
                                           const uint8_t *strategy,
                                           size_t strategy_len,
                                           uint32_t max_output_tokens,
                                           uint64_t now_ms,
                                           struct kvroute_decision *decision_out);

/**
 * `kvroute_router_route_tokens()` restricted to an endpoint subset, with the subset's rules and
 * statuses as in `kvroute_router_route_subset()`.
 */
kvroute_status kvroute_router_route_tokens_subset(struct kvroute_router *router,
                                                  const uint8_t *model,
                                                  size_t model_len,
                                                  const uint32_t *tokens,
                                                  size_t tokens_len,
                                                  uint32_t block_tokens,
                                                  const uint8_t *lora,
                                                  size_t lora_len,
                                                  const uint8_t *cache_salt,
                                                  size_t cache_salt_len,
                                                  const uint8_t *strategy,
                                                  size_t strategy_len,
                                                  uint32_t max_output_tokens,
                                                  const char *const *endpoint_subset,
                                                  size_t endpoint_subset_len,
                                                  uint64_t now_ms,
                                                  struct kvroute_decision *decision_out);

/**
 * `kvroute_router_route_tokens_subset()` with the request's session id, with the session id's
 * rules as in `kvroute_router_route_session()`.
 */
kvroute_status kvroute_router_route_tokens_session(struct kvroute_router *router,
                                                   const uint8_t *model,
                                                   size_t model_len,
                                                   const uint32_t *tokens,
                                                   size_t tokens_len,
                                                   uint32_t block_tokens,
                                                   const uint8_t *lora,
                                                   size_t lora_len,
                                                   const uint8_t *cache_salt,
                                                   size_t cache_salt_len,
                                                   const uint8_t *strategy,
                                                   size_t strategy_len,
                                                   uint32_t max_output_tokens,
                                                   const char *const *endpoint_subset,
                                                   size_t endpoint_subset_len,
                                                   const uint8_t *session_id,
                                                   size_t session_id_len,
                                                   uint64_t now_ms,
                                                   struct kvroute_decision *decision_out);

/**
 * Routes one request on token-block keys the caller already holds: computed with
 * `kvroute_token_block_keys()` (to route a request again, on a retry, without keying it
 * again, or to use the keys elsewhere too), or by the caller's own implementation of the
 * scheme. `kvroute_router_route_tokens_subset()` is this call after keying.
 *
 * - `(keys, keys_len)`: the keys of the prompt's complete blocks, in order; `(NULL, 0)` for a
 *   prompt without one. They match what other requests of the model were routed with only
 *   when computed the same way: to share the index with `kvroute_router_route_tokens()`, key
 *   with the router's hash seed (fix it with `kvroute_config_builder_set_hash_seed()`, else it
 *   derives from the seed) and the same `block_tokens`.
 * - `prompt_tokens`: the prompt's length in tokens, its partial last block included;
 *   `block_tokens`: the size the keys were cut at, 1 to `KVROUTE_MAX_BLOCK_TOKENS`. Both
 *   feed `least-ttft`. `keys_len * block_tokens` above `prompt_tokens` (more blocks than the
 *   prompt has) or a `block_tokens` out of range is `KVROUTE_STATUS_INVALID_PARAMETER`.
 * - `(endpoint_subset, endpoint_subset_len)`: the endpoint subset as in
 *   `kvroute_router_route_subset()`; `(NULL, 0)` for none.
 *
 * The other inputs, the output and the statuses are as in
 * `kvroute_router_route_tokens_subset()`.
 */
kvroute_status kvroute_router_route_keys(struct kvroute_router *router,
                                         const uint8_t *model,
                                         size_t model_len,
                                         const uint64_t *keys,
                                         size_t keys_len,
                                         uint32_t prompt_tokens,
                                         uint32_t block_tokens,
                                         const uint8_t *strategy,
                                         size_t strategy_len,
                                         uint32_t max_output_tokens,
                                         const char *const *endpoint_subset,
                                         size_t endpoint_subset_len,
                                         uint64_t now_ms,
                                         struct kvroute_decision *decision_out);

/**
 * `kvroute_router_route_keys()` with the request's session id, with the session id's rules as
 * in `kvroute_router_route_session()`.
 */
kvroute_status kvroute_router_route_keys_session(struct kvroute_router *router,
                                                 const uint8_t *model,
                                                 size_t model_len,
                                                 const uint64_t *keys,
                                                 size_t keys_len,
                                                 uint32_t prompt_tokens,
                                                 uint32_t block_tokens,
                                                 const uint8_t *strategy,
                                                 size_t strategy_len,
                                                 uint32_t max_output_tokens,
                                                 const char *const *endpoint_subset,
                                                 size_t endpoint_subset_len,
                                                 const uint8_t *session_id,
                                                 size_t session_id_len,
                                                 uint64_t now_ms,
                                                 struct kvroute_decision *decision_out);

/**
 * Builds a router with a copy of `config` (the caller may free the config right away). On
 * success `*router_out` is a new router the caller owns and frees with `kvroute_router_free()`.
 *
 * Returns `KVROUTE_STATUS_NULL_PARAMETER` if either pointer is NULL.
 */
kvroute_status kvroute_router_new(const struct kvroute_config *config,
                                  struct kvroute_router **router_out);

/**
 * Frees a router and everything it holds; open tickets are dropped. NULL is a no-op. No other
 * call on this router may be running or made afterwards.
 */
void kvroute_router_free(struct kvroute_router *router);

/**
 * Releases a ticket's in-flight slot: call it exactly once per successful route, when the
 * response ends, with how it ended (a `kvroute_outcome` as a `uint32_t`:
 * `KVROUTE_OUTCOME_SUCCESS`, `_CANCELLED`, `_FAILED`, `_CONNECT_FAILED`, `_RESET` or
 * `_TIMEOUT`) and the caller's clock. The outcome feeds the pod's health (see
 * `kvroute_outcome`): a cancel never counts against the pod, failures in a row eject it as the
 * health settings say. `kvroute_router_complete_with_event()` also says what changed.
 *
 * Returns `KVROUTE_STATUS_UNKNOWN_TICKET` for a ticket this router never issued,
 * `KVROUTE_STATUS_TICKET_NOT_OPEN` for one already completed or expired (nothing changes in
 * either case), `KVROUTE_STATUS_INVALID_PARAMETER` for an unknown outcome number. Completing a
 * ticket whose pod was removed meanwhile succeeds (and changes no pod's health).
 */
kvroute_status kvroute_router_complete(struct kvroute_router *router,
                                       kvroute_ticket ticket,
                                       uint32_t outcome,
                                       uint64_t now_ms);

/**
 * Does the time-driven work due at `now_ms`: drops prefix-index entries past their TTL,
 * expires tickets older than the ticket TTL (releasing their in-flight slots; an expired probe
 * lets the next request probe), and moves pods whose ejection is over to probing. Call it when
 * `kvroute_router_next_deadline()` says, or periodically; calling it early is harmless. (A pod
 * whose ejection is over takes its probe request even before the tick.)
 */
kvroute_status kvroute_router_tick(struct kvroute_router *router, uint64_t now_ms);

/**
 * When `kvroute_router_tick()` next has work (an index or ticket expiry, or the end of a pod's
 * ejection). On success `*has_deadline_out` says whether there is any, and `*deadline_ms_out`
 * is that time on the caller's clock (0 when there is none). Re-read it after every route,
 * complete, tick or pod removal: routing can move it earlier (and a completion can eject a
 * pod).
 */
kvroute_status kvroute_router_next_deadline(const struct kvroute_router *router,
                                            bool *has_deadline_out,
                                            uint64_t *deadline_ms_out);

/**
 * The name of a status code, e.g. `"KVROUTE_STATUS_UNKNOWN_TICKET"`.
 *
 * Returns a static NUL-terminated string that the caller must not free; an unknown number
 * gives `"KVROUTE_STATUS_UNKNOWN"`. Never NULL.
 */
const char *kvroute_status_str(uint32_t status);

/**
 * The label of a reason code (`kvroute_decision.reason`), e.g. `"prefix_match"`, as AIBrix
 * names its prefix-cache selections.
 *
 * Returns a static NUL-terminated string that the caller must not free; an unknown number
 * gives `"unknown"`. Never NULL.
 */
const char *kvroute_reason_str(uint32_t reason);

/**
 * The label of a health event (`kvroute_health_event`), e.g. `"ejected"`.
 *
 * Returns a static NUL-terminated string that the caller must not free; an unknown number
 * gives `"unknown"`. Never NULL.
 */
const char *kvroute_health_event_str(uint32_t event);

/**
 * The version of the library actually linked, `"major.minor.patch"` (compare with the
 * header's `KVROUTE_VERSION`).
 *
 * Returns a static NUL-terminated string that the caller must not free. Never NULL.
 */
const char *kvroute_version(void);

/**
 * The version of the library actually linked as one number,
 * `(major << 16) | (minor << 8) | patch` (compare with the header's `KVROUTE_VERSION_NUMBER`).
 */
uint32_t kvroute_version_number(void);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* KVROUTE_H */
