/* The C API's contract, from C: lifecycle, every status path, outputs only on success, the
 * version macros against the linked library, pod health (outcomes, ejection and probing,
 * active checks), endpoint subsets, session affinity, prompt extraction and the golden hash
 * vectors (token ids: test_tokens.c).
 *
 * Usage: test_api VECTORS_JSON   (tests/vectors/prefix_hash_v1.json) */
#include <inttypes.h>
#include <math.h>

#include "common.h"

#define S(str) (const uint8_t *)(str), strlen(str)

/* Input struct layouts are frozen (no padding before `known`). */
_Static_assert(sizeof(kvroute_engine_timing) == 40 && offsetof(kvroute_engine_timing, known) == 32,
               "kvroute_engine_timing layout");
/* Output structs only grow at their end: the fields that came with pod health (0.2.0) and
 * data-parallel ranks (0.3.0) follow the old ones, whose offsets are unchanged. */
_Static_assert(offsetof(kvroute_decision, imbalance) == 52 && offsetof(kvroute_decision, excluded) == 56 &&
                   offsetof(kvroute_decision, health_probe) == 60 &&
                   offsetof(kvroute_decision, data_parallel_rank) == 64 && sizeof(kvroute_decision) == 72,
               "kvroute_decision layout");
_Static_assert(offsetof(kvroute_pod_info, ready) == 20 && offsetof(kvroute_pod_info, ejected) == 21 &&
                   offsetof(kvroute_pod_info, ejected_until_ms) == 24 &&
                   offsetof(kvroute_pod_info, ejections_gateway) == 40 && sizeof(kvroute_pod_info) == 48,
               "kvroute_pod_info layout");
_Static_assert(offsetof(kvroute_stats, decisions_by_match_bucket) == 296 &&
                   offsetof(kvroute_stats, completed_connect_failed) == 336 &&
                   offsetof(kvroute_stats, completed_timeout) == 352 && sizeof(kvroute_stats) == 360,
               "kvroute_stats layout");

static kvroute_router *new_router(uint64_t seed, const char *strategy) {
  kvroute_config_builder *b = kvroute_config_builder_new();
  CHECK(b != NULL);
  CHECK_STATUS(kvroute_config_builder_set_seed(b, seed), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_config_builder_set_strategy(b, S(strategy)), KVROUTE_STATUS_OK);
  return build_router(b);
}

static void test_version(void) {
  CHECK(strcmp(kvroute_version(), KVROUTE_VERSION) == 0);
  CHECK(kvroute_version_number() == KVROUTE_VERSION_NUMBER);
  char expected[64];
  snprintf(expected, sizeof expected, "%d.%d.%d", KVROUTE_VERSION_MAJOR, KVROUTE_VERSION_MINOR, KVROUTE_VERSION_PATCH);
  CHECK(strcmp(expected, kvroute_version()) == 0);
  CHECK(KVROUTE_VERSION_NUMBER ==
        (((uint32_t)KVROUTE_VERSION_MAJOR << 16) | ((uint32_t)KVROUTE_VERSION_MINOR << 8) | KVROUTE_VERSION_PATCH));
}

static void test_status_strings(void) {
  CHECK(strcmp(kvroute_status_str(KVROUTE_STATUS_OK), "KVROUTE_STATUS_OK") == 0);
  CHECK(strcmp(kvroute_status_str(KVROUTE_STATUS_TICKET_NOT_OPEN), "KVROUTE_STATUS_TICKET_NOT_OPEN") == 0);
  CHECK(strcmp(kvroute_status_str(KVROUTE_STATUS_POISONED), "KVROUTE_STATUS_POISONED") == 0);
  CHECK(strcmp(kvroute_status_str(77777), "KVROUTE_STATUS_UNKNOWN") == 0);
  CHECK(strcmp(kvroute_reason_str(KVROUTE_REASON_PREFIX_MATCH), "prefix_match") == 0);
  CHECK(strcmp(kvroute_reason_str(KVROUTE_REASON_LEAST_REQUEST_FALLBACK), "least_request_fallback") == 0);
  CHECK(strcmp(kvroute_reason_str(KVROUTE_REASON_LEAST_TTFT_PROBE), "least_ttft_probe") == 0);
  CHECK(strcmp(kvroute_reason_str(KVROUTE_REASON_LEAST_KV_CACHE), "least_kv_cache") == 0);
  CHECK(strcmp(kvroute_reason_str(KVROUTE_REASON_SESSION_AFFINITY), "session_affinity") == 0);
  CHECK(strcmp(kvroute_reason_str(999), "unknown") == 0);
  CHECK(strcmp(kvroute_status_str(KVROUTE_STATUS_NO_POD_IN_SUBSET), "KVROUTE_STATUS_NO_POD_IN_SUBSET") == 0);
  CHECK(strcmp(kvroute_health_event_str(KVROUTE_HEALTH_EVENT_NONE), "none") == 0);
  CHECK(strcmp(kvroute_health_event_str(KVROUTE_HEALTH_EVENT_EJECTED), "ejected") == 0);
  CHECK(strcmp(kvroute_health_event_str(KVROUTE_HEALTH_EVENT_EJECTION_SKIPPED), "ejection_skipped") == 0);
  CHECK(strcmp(kvroute_health_event_str(KVROUTE_HEALTH_EVENT_READMITTED), "readmitted") == 0);
  CHECK(strcmp(kvroute_health_event_str(KVROUTE_HEALTH_EVENT_CHECKS_FAILING), "checks_failing") == 0);
  CHECK(strcmp(kvroute_health_event_str(KVROUTE_HEALTH_EVENT_CHECKS_PASSING), "checks_passing") == 0);
  CHECK(strcmp(kvroute_health_event_str(6), "unknown") == 0);
}

static void test_config_statuses(void) {
  kvroute_config_builder *b = kvroute_config_builder_new();
  CHECK_STATUS(kvroute_config_builder_set_block_size(NULL, 64), KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_config_builder_set_block_size(b, 0), KVROUTE_STATUS_INVALID_PARAMETER);
  CHECK_STATUS(kvroute_config_builder_set_block_size(b, (size_t)2 << 20), KVROUTE_STATUS_INVALID_PARAMETER);
  CHECK_STATUS(kvroute_config_builder_set_block_size(b, 64), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_config_builder_set_index_capacity(b, 0), KVROUTE_STATUS_INVALID_PARAMETER);
  CHECK_STATUS(kvroute_config_builder_set_index_capacity(b, 1000), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_config_builder_set_index_ttl_ms(b, 0), KVROUTE_STATUS_INVALID_PARAMETER);
  CHECK_STATUS(kvroute_config_builder_set_index_ttl_ms(b, 60000), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_config_builder_set_ticket_ttl_ms(b, 0), KVROUTE_STATUS_INVALID_PARAMETER);
  CHECK_STATUS(kvroute_config_builder_set_ticket_ttl_ms(b, 60000), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_config_builder_set_imbalance_abs_count(b, 8), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_config_builder_set_stddev_factor(b, -1.0), KVROUTE_STATUS_INVALID_PARAMETER);
  CHECK_STATUS(kvroute_config_builder_set_stddev_factor(b, 1.5), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_config_builder_set_hash_seed(b, 42), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_config_builder_set_seed(b, 1), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_config_builder_set_strategy(b, S("round-robin")), KVROUTE_STATUS_INVALID_STRATEGY);
  CHECK_STATUS(kvroute_config_builder_set_strategy(b, S("random:0")), KVROUTE_STATUS_INVALID_STRATEGY);
  CHECK_STATUS(kvroute_config_builder_set_strategy(b, (const uint8_t *)"\xff", 1), KVROUTE_STATUS_INVALID_UTF8);
  CHECK_STATUS(kvroute_config_builder_set_strategy(b, NULL, 5), KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_config_builder_set_strategy(b, S(" Prefix-Cache:3, least-request ")), KVROUTE_STATUS_OK);
  const kvroute_config *config = (const kvroute_config *)0x1;
  /* NULL out-pointer: the builder is consumed anyway (valgrind/ASan would report a leak). */
  CHECK_STATUS(kvroute_config_builder_build(b, NULL), KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_config_builder_build(NULL, &config), KVROUTE_STATUS_NULL_PARAMETER);
  CHECK(config == (const kvroute_config *)0x1); /* outputs only on success */
  kvroute_config_builder_free(NULL);

  /* The health settings: 0 turns a rule off; a zero base ejection time or a percentage over
   * 100 is rejected with the builder unchanged. */
  b = kvroute_config_builder_new();
  CHECK_STATUS(kvroute_config_builder_set_consecutive_5xx(NULL, 5), KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_config_builder_set_consecutive_5xx(b, 0), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_config_builder_set_consecutive_gateway_failures(b, 0), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_config_builder_set_base_ejection_ms(b, 0), KVROUTE_STATUS_INVALID_PARAMETER);
  CHECK_STATUS(kvroute_config_builder_set_base_ejection_ms(b, 5000), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_config_builder_set_max_ejection_ms(b, 0), KVROUTE_STATUS_OK); /* taken as the base */
  CHECK_STATUS(kvroute_config_builder_set_max_ejection_percent(b, 101), KVROUTE_STATUS_INVALID_PARAMETER);
  CHECK_STATUS(kvroute_config_builder_set_max_ejection_percent(b, 256), KVROUTE_STATUS_INVALID_PARAMETER);
  CHECK_STATUS(kvroute_config_builder_set_max_ejection_percent(b, 100), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_config_builder_set_unhealthy_threshold(b, 0), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_config_builder_set_healthy_threshold(b, 0), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_config_builder_set_healthy_threshold(NULL, 2), KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_config_builder_build(b, &config), KVROUTE_STATUS_OK);
  kvroute_config_free(config);
  kvroute_config_free(NULL);

  /* A freed builder's config outlives it; two routers share one config. */
  b = kvroute_config_builder_new();
  CHECK_STATUS(kvroute_config_builder_build(b, &config), KVROUTE_STATUS_OK);
  kvroute_router *r1 = NULL, *r2 = NULL;
  CHECK_STATUS(kvroute_router_new(config, &r1), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_router_new(config, &r2), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_router_new(config, NULL), KVROUTE_STATUS_NULL_PARAMETER);
  kvroute_router *untouched = (kvroute_router *)0x1;
  CHECK_STATUS(kvroute_router_new(NULL, &untouched), KVROUTE_STATUS_NULL_PARAMETER);
  CHECK(untouched == (kvroute_router *)0x1);
  kvroute_config_free(config);
  kvroute_router_free(r1);
  kvroute_router_free(r2);
  kvroute_router_free(NULL);
}

static void test_router_statuses(void) {
  kvroute_router *r = new_router(7, "prefix-cache");
  kvroute_pod_id a = 99, b = 99, c = 99;
  CHECK_STATUS(kvroute_router_add_pod(r, S("llama"), S("vllm-a"), S("10.0.0.1:8000"), true, &a), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_router_add_pod(r, S("llama"), S("vllm-b"), S("10.0.0.2:8000"), true, &b), KVROUTE_STATUS_OK);
  CHECK(a != b);
  /* NULL handle, NULL out, bad UTF-8, empty names, bad address: status, nothing written. */
  CHECK_STATUS(kvroute_router_add_pod(NULL, S("llama"), S("x"), S("10.0.0.3:1"), true, &c), KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_router_add_pod(r, S("llama"), S("x"), S("10.0.0.3:1"), true, NULL), KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_router_add_pod(r, (const uint8_t *)"ll\xc3", 3, S("x"), S("10.0.0.3:1"), true, &c),
               KVROUTE_STATUS_INVALID_UTF8);
  CHECK_STATUS(kvroute_router_add_pod(r, S(""), S("x"), S("10.0.0.3:1"), true, &c), KVROUTE_STATUS_EMPTY_NAME);
  CHECK_STATUS(kvroute_router_add_pod(r, S("llama"), S(""), S("10.0.0.3:1"), true, &c), KVROUTE_STATUS_EMPTY_NAME);
  CHECK_STATUS(kvroute_router_add_pod(r, S("llama"), S("x"), S("pod-x:8000"), true, &c), KVROUTE_STATUS_INVALID_ADDRESS);
  CHECK(c == 99);

  /* Pod lookups and out-buffers. */
  kvroute_pod_id found = 99;
  CHECK_STATUS(kvroute_router_pod_id(r, S("vllm-b"), &found), KVROUTE_STATUS_OK);
  CHECK(found == b);
  CHECK_STATUS(kvroute_router_pod_id(r, S("nope"), &found), KVROUTE_STATUS_UNKNOWN_POD);
  char name[16];
  size_t n = 0;
  memset(name, 'Z', sizeof name);
  CHECK_STATUS(kvroute_router_pod_name(r, a, (uint8_t *)name, 6, &n), KVROUTE_STATUS_INSUFFICIENT_SIZE);
  CHECK(n == 7 && name[0] == 'Z'); /* the size needed, buffer untouched */
  CHECK_STATUS(kvroute_router_pod_name(r, a, NULL, 0, &n), KVROUTE_STATUS_INSUFFICIENT_SIZE);
  CHECK(n == 7);
  CHECK_STATUS(kvroute_router_pod_name(r, a, NULL, 7, &n), KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_router_pod_name(r, a, (uint8_t *)name, 7, NULL), KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_router_pod_name(r, a, (uint8_t *)name, 7, &n), KVROUTE_STATUS_OK);
  CHECK(n == 6 && strcmp(name, "vllm-a") == 0);
  CHECK_STATUS(kvroute_router_pod_name(r, 1234, (uint8_t *)name, sizeof name, &n), KVROUTE_STATUS_UNKNOWN_POD);
  char addr[32];
  CHECK_STATUS(kvroute_router_set_pod_address(r, b, S("10.0.0.9:9000")), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_router_set_pod_address(r, b, S("nowhere")), KVROUTE_STATUS_INVALID_ADDRESS);
  CHECK_STATUS(kvroute_router_pod_address(r, b, (uint8_t *)addr, sizeof addr, &n), KVROUTE_STATUS_OK);
  CHECK(strcmp(addr, "10.0.0.9:9000") == 0 && n == strlen(addr));
  kvroute_pod_id ids[2] = {77, 77};
  CHECK_STATUS(kvroute_router_pods(r, ids, 1, &n), KVROUTE_STATUS_INSUFFICIENT_SIZE);
  CHECK(n == 2 && ids[0] == 77);
  CHECK_STATUS(kvroute_router_pods(r, ids, 2, &n), KVROUTE_STATUS_OK);
  CHECK(n == 2 && ids[0] == a && ids[1] == b);

  /* Routing statuses. */
  const char *prompt = "You are a helpful assistant. Answer briefly and cite the sources you used.";
  kvroute_decision d, untouched;
  memset(&untouched, 0x5A, sizeof untouched);
  d = untouched;
  CHECK_STATUS(kvroute_router_route(NULL, S("llama"), S(prompt), NULL, 0, 1, &d), KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_router_route(r, S("llama"), S(prompt), NULL, 0, 1, NULL), KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_router_route(r, NULL, 5, S(prompt), NULL, 0, 1, &d), KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_router_route(r, (const uint8_t *)"\xfe\xff", 2, S(prompt), NULL, 0, 1, &d),
               KVROUTE_STATUS_INVALID_UTF8);
  CHECK_STATUS(kvroute_router_route(r, S("mistral"), S(prompt), NULL, 0, 1, &d), KVROUTE_STATUS_UNKNOWN_MODEL);
  CHECK_STATUS(kvroute_router_route(r, S("llama"), S(prompt), S("fastest"), 1, &d), KVROUTE_STATUS_INVALID_STRATEGY);
  CHECK_STATUS(kvroute_router_route_json(r, NULL, 0, S("{\"messages\":[]}"), NULL, 0, 1, &d), KVROUTE_STATUS_INVALID_BODY);
  CHECK_STATUS(kvroute_router_route_json(r, S("llama"), S("{not json"), NULL, 0, 1, &d), KVROUTE_STATUS_INVALID_BODY);
  CHECK_STATUS(kvroute_router_route_json(r, S("llama"), S("{\"prompt\":[1]}"), NULL, 0, 1, &d), KVROUTE_STATUS_INVALID_BODY);
  CHECK(memcmp(&d, &untouched, sizeof d) == 0); /* outputs only on success */

  /* A prompt shorter than a block has no blocks; an empty prompt is fine too. */
  CHECK_STATUS(kvroute_router_route(r, S("llama"), NULL, 0, NULL, 0, 1, &d), KVROUTE_STATUS_OK);
  CHECK(d.total_blocks == 0 && d.match_percent == 0 && d.reason == KVROUTE_REASON_LEAST_REQUEST_FALLBACK);
  kvroute_ticket empty_ticket = d.ticket;

  /* The same long prompt twice, once raw and once as a completions body: the second matches. */
  char *text = study_text(3, 0);
  char *escaped = study_text(3, 1);
  size_t body_cap = strlen(escaped) + 64;
  char *body = malloc(body_cap);
  snprintf(body, body_cap, "{\"model\":\"llama\",\"prompt\":\"%s\"}", escaped);
  kvroute_decision first, second;
  CHECK_STATUS(kvroute_router_route(r, S("llama"), S(text), S("prefix-cache"), 10, &first), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_router_route_json(r, NULL, 0, S(body), NULL, 0, 11, &second), KVROUTE_STATUS_OK);
  CHECK(second.pod == first.pod && second.reason == KVROUTE_REASON_PREFIX_MATCH);
  CHECK(second.match_percent == 100 && second.matched_blocks == second.total_blocks);
  CHECK(second.total_blocks == strlen(text) / 128 && second.ticket != first.ticket);
  uint32_t in_flight = 0;
  CHECK_STATUS(kvroute_router_in_flight(r, first.pod, &in_flight), KVROUTE_STATUS_OK);
  CHECK(in_flight >= 2);
  kvroute_pod_info info;
  CHECK_STATUS(kvroute_router_pod_info(r, first.pod, &info), KVROUTE_STATUS_OK);
  CHECK(info.id == first.pod && info.ready && info.in_flight == in_flight && info.models == 1 && info.routed >= 2);

  /* Explanation. */
  char line[512];
  CHECK_STATUS(kvroute_router_explain(r, second.ticket, (uint8_t *)line, 10, &n), KVROUTE_STATUS_INSUFFICIENT_SIZE);
  CHECK(n > 10);
  CHECK_STATUS(kvroute_router_explain(r, second.ticket, (uint8_t *)line, sizeof line, &n), KVROUTE_STATUS_OK);
  CHECK(strncmp(line, "strategy=prefix-cache reason=prefix_match pod=vllm-", 51) == 0 && n == strlen(line));
  CHECK(strchr(line, ',') == NULL && strchr(line, '\n') == NULL);

  /* Completion statuses: unknown ticket, double completion, bad outcome. */
  CHECK_STATUS(kvroute_router_complete(r, 1u << 30, KVROUTE_OUTCOME_SUCCESS, 12), KVROUTE_STATUS_UNKNOWN_TICKET);
  CHECK_STATUS(kvroute_router_complete(r, first.ticket, 6, 12), KVROUTE_STATUS_INVALID_PARAMETER);
  CHECK_STATUS(kvroute_router_complete(NULL, first.ticket, 0, 12), KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_router_complete(r, first.ticket, KVROUTE_OUTCOME_SUCCESS, 12), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_router_complete(r, first.ticket, KVROUTE_OUTCOME_SUCCESS, 13), KVROUTE_STATUS_TICKET_NOT_OPEN);
  CHECK_STATUS(kvroute_router_complete(r, second.ticket, KVROUTE_OUTCOME_CANCELLED, 13), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_router_explain(r, second.ticket, (uint8_t *)line, sizeof line, &n), KVROUTE_STATUS_UNKNOWN_TICKET);

  /* Completion timings and engine snapshots (the least-ttft model's inputs). */
  kvroute_decision timed;
  CHECK_STATUS(kvroute_router_route(r, S("llama"), S(text), S("least-ttft"), 14, &timed), KVROUTE_STATUS_OK);
  CHECK(timed.reason == KVROUTE_REASON_LEAST_TTFT);
  kvroute_timings bad_bits = {.known = 1u << 31};
  CHECK_STATUS(kvroute_router_complete_with_timings(r, timed.ticket, KVROUTE_OUTCOME_SUCCESS, &bad_bits, 15),
               KVROUTE_STATUS_INVALID_PARAMETER);
  /* The first token of the open request, reported before its completion: the first-token time
   * is required, unknown bits are rejected, the completion-only bits are accepted, a second
   * report is ignored, and nothing is released. */
  kvroute_timings t = {.first_token_ms = 80, .prompt_tokens = 7000, .cached_tokens = 0,
                       .known = KVROUTE_TIMING_PROMPT_TOKENS | KVROUTE_TIMING_CACHED_TOKENS};
  uint32_t timed_in_flight = 0;
  CHECK_STATUS(kvroute_router_in_flight(r, timed.pod, &timed_in_flight), KVROUTE_STATUS_OK);
  CHECK(timed_in_flight >= 1);
  CHECK_STATUS(kvroute_router_first_token(r, timed.ticket, &t, 15), KVROUTE_STATUS_INVALID_PARAMETER);
  CHECK_STATUS(kvroute_router_first_token(r, timed.ticket, &bad_bits, 15), KVROUTE_STATUS_INVALID_PARAMETER);
  t.known |= KVROUTE_TIMING_FIRST_TOKEN_MS | 1u << 5;
  CHECK_STATUS(kvroute_router_first_token(r, timed.ticket, &t, 15), KVROUTE_STATUS_INVALID_PARAMETER);
  t.known &= ~(1u << 5);
  CHECK_STATUS(kvroute_router_first_token(NULL, timed.ticket, &t, 15), KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_router_first_token(r, timed.ticket, NULL, 15), KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_router_first_token(r, 1u << 30, &t, 15), KVROUTE_STATUS_UNKNOWN_TICKET);
  CHECK_STATUS(kvroute_router_first_token(r, timed.ticket, &t, 15), KVROUTE_STATUS_OK);
  t.total_ms = 900;
  t.known |= KVROUTE_TIMING_TOTAL_MS;
  CHECK_STATUS(kvroute_router_first_token(r, timed.ticket, &t, 15), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_router_in_flight(r, timed.pod, &in_flight), KVROUTE_STATUS_OK);
  CHECK(in_flight == timed_in_flight);
  CHECK_STATUS(kvroute_router_explain(r, timed.ticket, (uint8_t *)line, sizeof line, &n), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_router_complete_with_timings(r, timed.ticket, KVROUTE_OUTCOME_SUCCESS, &t, 15), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_router_complete_with_timings(r, timed.ticket, KVROUTE_OUTCOME_SUCCESS, NULL, 15),
               KVROUTE_STATUS_TICKET_NOT_OPEN);
  CHECK_STATUS(kvroute_router_first_token(r, timed.ticket, &t, 16), KVROUTE_STATUS_TICKET_NOT_OPEN);
  kvroute_engine_snapshot e = {.running = 3, .waiting = 1, .kv_usage = 0.5, .known = KVROUTE_ENGINE_KV_USAGE};
  CHECK_STATUS(kvroute_router_observe_engine(r, a, &e, 15), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_router_observe_engine(r, a, NULL, 15), KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_router_observe_engine(r, 4321, &e, 15), KVROUTE_STATUS_UNKNOWN_POD);
  e.kv_usage = 1.5;
  CHECK_STATUS(kvroute_router_observe_engine(r, a, &e, 15), KVROUTE_STATUS_INVALID_PARAMETER);
  /* The engine's timing counters beside the snapshot: NULL is the plain call; unknown bits and
   * negative or non-finite seconds are rejected only when their pair is flagged. */
  e.kv_usage = 0.5;
  CHECK_STATUS(kvroute_router_observe_engine_timed(r, a, &e, NULL, 16), KVROUTE_STATUS_OK);
  kvroute_engine_timing et = {.prefill_seconds = 2.5,
                              .prefills = 8,
                              .inter_token_seconds = 3.2,
                              .inter_tokens = 320,
                              .known = KVROUTE_ENGINE_TIMING_PREFILL | KVROUTE_ENGINE_TIMING_INTER_TOKEN};
  CHECK_STATUS(kvroute_router_observe_engine_timed(r, a, &e, &et, 16), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_router_observe_engine_timed(NULL, a, &e, &et, 16), KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_router_observe_engine_timed(r, a, NULL, &et, 16), KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_router_observe_engine_timed(r, 4321, &e, &et, 16), KVROUTE_STATUS_UNKNOWN_POD);
  et.known = 1u << 2;
  CHECK_STATUS(kvroute_router_observe_engine_timed(r, a, &e, &et, 16), KVROUTE_STATUS_INVALID_PARAMETER);
  et.known = KVROUTE_ENGINE_TIMING_PREFILL;
  et.prefill_seconds = -1.0;
  CHECK_STATUS(kvroute_router_observe_engine_timed(r, a, &e, &et, 16), KVROUTE_STATUS_INVALID_PARAMETER);
  et.known = KVROUTE_ENGINE_TIMING_INTER_TOKEN; /* the negative prefill_seconds is not read */
  CHECK_STATUS(kvroute_router_observe_engine_timed(r, a, &e, &et, 16), KVROUTE_STATUS_OK);
  et.inter_token_seconds = INFINITY;
  CHECK_STATUS(kvroute_router_observe_engine_timed(r, a, &e, &et, 16), KVROUTE_STATUS_INVALID_PARAMETER);
  et.known = 0;
  e.known = 1u << 7; /* the snapshot is validated as by kvroute_router_observe_engine() */
  CHECK_STATUS(kvroute_router_observe_engine_timed(r, a, &e, &et, 16), KVROUTE_STATUS_INVALID_PARAMETER);
  CHECK_STATUS(kvroute_router_set_pod_capacity(r, a, 32), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_router_set_pod_capacity(r, 4321, 32), KVROUTE_STATUS_UNKNOWN_POD);

  /* Readiness and removal. */
  CHECK_STATUS(kvroute_router_set_pod_ready(r, a, false), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_router_set_pod_ready(r, b, false), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_router_route(r, S("llama"), S(prompt), NULL, 0, 20, &d), KVROUTE_STATUS_NO_READY_POD);
  CHECK_STATUS(kvroute_router_set_pod_ready(r, b, true), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_router_detach_pod(r, S("llama"), b), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_router_detach_pod(r, S("nosuch"), b), KVROUTE_STATUS_UNKNOWN_MODEL);
  CHECK_STATUS(kvroute_router_route(r, S("llama"), S(prompt), NULL, 0, 21, &d), KVROUTE_STATUS_NO_READY_POD);
  kvroute_pod_id again = 99;
  CHECK_STATUS(kvroute_router_upsert_pod(r, S("vllm-a"), S("10.0.0.1:8001"), true, &again), KVROUTE_STATUS_OK);
  CHECK(again == a);
  CHECK_STATUS(kvroute_router_route(r, S("llama"), S(prompt), NULL, 0, 22, &d), KVROUTE_STATUS_OK);
  CHECK(d.pod == a);
  CHECK_STATUS(kvroute_router_remove_pod(r, a), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_router_remove_pod(r, a), KVROUTE_STATUS_UNKNOWN_POD);
  CHECK_STATUS(kvroute_router_set_pod_ready(r, a, true), KVROUTE_STATUS_UNKNOWN_POD);
  CHECK_STATUS(kvroute_router_in_flight(r, a, &in_flight), KVROUTE_STATUS_UNKNOWN_POD);
  /* Completing a ticket of a removed pod succeeds (an orphan). */
  CHECK_STATUS(kvroute_router_complete(r, d.ticket, KVROUTE_OUTCOME_FAILED, 23), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_router_complete(r, empty_ticket, KVROUTE_OUTCOME_SUCCESS, 23), KVROUTE_STATUS_OK);
  /* Removing the model: from "no ready pod" (503) to "unknown model" (400). */
  CHECK_STATUS(kvroute_router_remove_model(r, S("llama")), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_router_route(r, S("llama"), S(prompt), NULL, 0, 23, &d), KVROUTE_STATUS_UNKNOWN_MODEL);
  CHECK_STATUS(kvroute_router_remove_model(r, S("llama")), KVROUTE_STATUS_UNKNOWN_MODEL);
  CHECK_STATUS(kvroute_router_remove_model(r, NULL, 5), KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_router_remove_model(NULL, S("llama")), KVROUTE_STATUS_NULL_PARAMETER);

  /* Timers and stats. */
  bool has = true;
  uint64_t at = 5;
  CHECK_STATUS(kvroute_router_tick(r, 24), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_router_next_deadline(r, NULL, &at), KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_router_next_deadline(r, &has, &at), KVROUTE_STATUS_OK);
  kvroute_stats st;
  CHECK_STATUS(kvroute_router_stats(r, &st), KVROUTE_STATUS_OK);
  CHECK(st.pods == 1 && st.tickets_issued == 5 && st.tickets_open == 0 && st.in_flight == 0);
  CHECK(st.completed_success == 3 && st.completed_cancelled == 1 && st.completed_failed == 1);
  /* Rejected: 3 completions and 2 first-token reports (unknown ticket, completed ticket). */
  CHECK(st.tickets_rejected == 5 && st.tickets_orphaned >= 1 && st.unknown_model == 2 && st.no_ready_pod == 2);
  CHECK(st.routed_by_reason[KVROUTE_REASON_PREFIX_MATCH] == 1);
  CHECK_STATUS(kvroute_router_stats(NULL, &st), KVROUTE_STATUS_NULL_PARAMETER);

  free(body);
  free(escaped);
  free(text);
  kvroute_router_free(r);
}

/* ---- pod health ---- */

static kvroute_router *new_health_router(uint64_t seed, const char *strategy, uint64_t base_ejection_ms) {
  kvroute_config_builder *b = kvroute_config_builder_new();
  CHECK(b != NULL);
  CHECK_STATUS(kvroute_config_builder_set_seed(b, seed), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_config_builder_set_strategy(b, S(strategy)), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_config_builder_set_base_ejection_ms(b, base_ejection_ms), KVROUTE_STATUS_OK);
  return build_router(b);
}

static kvroute_pod_id add_pod(kvroute_router *r, const char *model, const char *name, const char *addr) {
  kvroute_pod_id id = 0;
  CHECK_STATUS(kvroute_router_add_pod(r, S(model), S(name), S(addr), true, &id), KVROUTE_STATUS_OK);
  return id;
}

/* Routes a short prompt (no complete block: no prefix index entry, no index deadline). */
static kvroute_decision route_short(kvroute_router *r, const char *model, const char *strategy, uint64_t now) {
  kvroute_decision d;
  const uint8_t *sp = NULL;
  size_t sn = 0;
  if (strategy) {
    sp = (const uint8_t *)strategy;
    sn = strlen(strategy);
  }
  CHECK_STATUS(kvroute_router_route(r, S(model), S("hi"), sp, sn, now, &d), KVROUTE_STATUS_OK);
  return d;
}

static uint32_t complete_event(kvroute_router *r, kvroute_ticket t, uint32_t outcome, uint64_t now) {
  uint32_t event = 77;
  CHECK_STATUS(kvroute_router_complete_with_event(r, t, outcome, NULL, now, &event), KVROUTE_STATUS_OK);
  return event;
}

static kvroute_pod_info pod_info(kvroute_router *r, kvroute_pod_id pod) {
  kvroute_pod_info info;
  CHECK_STATUS(kvroute_router_pod_info(r, pod, &info), KVROUTE_STATUS_OK);
  return info;
}

/* The outcome codes 3..5 are accepted, counted and named in the stats; 6 is still rejected.
 * A model of one pod never loses it: three gateway failures meet the rule, but the ejection is
 * skipped. */
static void test_outcomes(void) {
  kvroute_router *r = new_health_router(3, "least-request", 30000);
  kvroute_pod_id solo = add_pod(r, "solo", "solo-a", "10.0.1.1:8000");
  const uint32_t outcomes[] = {KVROUTE_OUTCOME_CONNECT_FAILED, KVROUTE_OUTCOME_RESET, KVROUTE_OUTCOME_TIMEOUT};
  CHECK(KVROUTE_OUTCOME_CONNECT_FAILED == 3 && KVROUTE_OUTCOME_RESET == 4 && KVROUTE_OUTCOME_TIMEOUT == 5);
  for (int i = 0; i < 3; i++) {
    kvroute_decision d = route_short(r, "solo", NULL, 10 + (uint64_t)i);
    CHECK(d.pod == solo && d.excluded == 0 && !d.health_probe);
    uint32_t event = complete_event(r, d.ticket, outcomes[i], 10 + (uint64_t)i);
    CHECK(event == (i < 2 ? KVROUTE_HEALTH_EVENT_NONE : KVROUTE_HEALTH_EVENT_EJECTION_SKIPPED));
  }
  kvroute_pod_info info = pod_info(r, solo);
  CHECK(!info.ejected && !info.probing && info.ejected_until_ms == 0 && info.ejections_gateway == 0);

  /* An unknown outcome: INVALID_PARAMETER, nothing written or counted, the ticket still open.
   * A cancel counts for nothing, a plain failure is an upstream error. */
  kvroute_decision d = route_short(r, "solo", NULL, 20);
  uint32_t event = 77;
  CHECK_STATUS(kvroute_router_complete_with_event(r, d.ticket, 6, NULL, 20, &event), KVROUTE_STATUS_INVALID_PARAMETER);
  CHECK_STATUS(kvroute_router_complete_with_event(NULL, d.ticket, 0, NULL, 20, &event), KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_router_complete_with_event(r, 1u << 30, 0, NULL, 20, &event), KVROUTE_STATUS_UNKNOWN_TICKET);
  kvroute_timings bad_bits = {.known = 1u << 31};
  CHECK_STATUS(kvroute_router_complete_with_event(r, d.ticket, 0, &bad_bits, 20, &event),
               KVROUTE_STATUS_INVALID_PARAMETER);
  CHECK(event == 77);
  /* A success (with timings) resets the counts; then a cancel counts for nothing and a failure
   * and a timeout are two errors in a row, below both thresholds. */
  kvroute_timings t = {.first_token_ms = 5, .total_ms = 9, .known = KVROUTE_TIMING_FIRST_TOKEN_MS | KVROUTE_TIMING_TOTAL_MS};
  CHECK_STATUS(kvroute_router_complete_with_event(r, d.ticket, KVROUTE_OUTCOME_SUCCESS, &t, 21, &event),
               KVROUTE_STATUS_OK);
  CHECK(event == KVROUTE_HEALTH_EVENT_NONE);
  event = 77;
  CHECK_STATUS(kvroute_router_complete_with_event(r, d.ticket, KVROUTE_OUTCOME_SUCCESS, NULL, 21, &event),
               KVROUTE_STATUS_TICKET_NOT_OPEN);
  CHECK(event == 77);
  d = route_short(r, "solo", NULL, 22);
  CHECK_STATUS(kvroute_router_complete_with_event(r, d.ticket, KVROUTE_OUTCOME_CANCELLED, NULL, 22, NULL),
               KVROUTE_STATUS_OK);
  d = route_short(r, "solo", NULL, 23);
  CHECK_STATUS(kvroute_router_complete(r, d.ticket, KVROUTE_OUTCOME_FAILED, 23), KVROUTE_STATUS_OK);
  d = route_short(r, "solo", NULL, 24);
  CHECK(complete_event(r, d.ticket, KVROUTE_OUTCOME_TIMEOUT, 24) == KVROUTE_HEALTH_EVENT_NONE);

  kvroute_stats st;
  CHECK_STATUS(kvroute_router_stats(r, &st), KVROUTE_STATUS_OK);
  CHECK(st.completed_connect_failed == 1 && st.completed_reset == 1 && st.completed_timeout == 2);
  CHECK(st.completed_success == 1 && st.completed_cancelled == 1 && st.completed_failed == 1);
  CHECK(st.tickets_issued == 7 && st.tickets_open == 0 && st.tickets_rejected == 2); /* unknown, not open */
  kvroute_router_free(r);
}

/* Three connect failures eject one pod of two: routes never pick it and say excluded=1; after
 * the ejection time one probe goes there, and its success readmits the pod. */
static void test_ejection_and_probe(void) {
  kvroute_router *r = new_health_router(5, "least-request", 1000);
  kvroute_pod_id a = add_pod(r, "llama", "vllm-a", "10.0.0.1:8000");
  kvroute_pod_id b = add_pod(r, "llama", "vllm-b", "10.0.0.2:8000");
  /* Three requests to a (b not ready while they are routed). */
  CHECK_STATUS(kvroute_router_set_pod_ready(r, b, false), KVROUTE_STATUS_OK);
  kvroute_decision to_a[3];
  for (int i = 0; i < 3; i++) {
    to_a[i] = route_short(r, "llama", NULL, 100);
    CHECK(to_a[i].pod == a && to_a[i].excluded == 0);
  }
  CHECK_STATUS(kvroute_router_set_pod_ready(r, b, true), KVROUTE_STATUS_OK);
  CHECK(complete_event(r, to_a[0].ticket, KVROUTE_OUTCOME_CONNECT_FAILED, 200) == KVROUTE_HEALTH_EVENT_NONE);
  CHECK(complete_event(r, to_a[1].ticket, KVROUTE_OUTCOME_CONNECT_FAILED, 200) == KVROUTE_HEALTH_EVENT_NONE);
  CHECK(complete_event(r, to_a[2].ticket, KVROUTE_OUTCOME_CONNECT_FAILED, 200) == KVROUTE_HEALTH_EVENT_EJECTED);
  kvroute_pod_info info = pod_info(r, a);
  CHECK(info.ejected && !info.probing && !info.checks_failing && info.ready);
  CHECK(info.ejected_until_ms == 1200 && info.ejections_gateway == 1 && info.ejections_5xx == 0);
  bool has = false;
  uint64_t at = 0;
  CHECK_STATUS(kvroute_router_next_deadline(r, &has, &at), KVROUTE_STATUS_OK);
  CHECK(has && at == 1200); /* the end of the ejection */

  /* While ejected: never picked, whatever the strategy. */
  const char *strategies[] = {"least-request", "random", "prefix-cache", "least-ttft"};
  for (int i = 0; i < 40; i++) {
    kvroute_decision d = route_short(r, "llama", strategies[i % 4], 300 + (uint64_t)i);
    CHECK(d.pod == b && d.excluded == 1 && !d.health_probe);
    CHECK_STATUS(kvroute_router_complete(r, d.ticket, KVROUTE_OUTCOME_SUCCESS, 300 + (uint64_t)i), KVROUTE_STATUS_OK);
  }
  kvroute_decision busy = route_short(r, "llama", NULL, 400); /* b keeps one request open */
  CHECK(busy.pod == b);
  char line[512];
  size_t n = 0;
  CHECK_STATUS(kvroute_router_explain(r, busy.ticket, (uint8_t *)line, sizeof line, &n), KVROUTE_STATUS_OK);
  CHECK(strstr(line, " excluded=1") != NULL);

  /* The ejection is over: the tick moves a to probing, and the next request is its probe. */
  CHECK_STATUS(kvroute_router_tick(r, 1200), KVROUTE_STATUS_OK);
  info = pod_info(r, a);
  CHECK(info.ejected && info.probing && info.ejected_until_ms == 0);
  kvroute_decision probe = route_short(r, "llama", NULL, 1201);
  CHECK(probe.pod == a && probe.health_probe && probe.excluded == 0);
  CHECK_STATUS(kvroute_router_explain(r, probe.ticket, (uint8_t *)line, sizeof line, &n), KVROUTE_STATUS_OK);
  CHECK(strstr(line, " health_probe=1") != NULL);
  /* One probe at a time: a takes nothing else meanwhile. */
  kvroute_decision other = route_short(r, "llama", NULL, 1202);
  CHECK(other.pod == b && other.excluded == 1 && !other.health_probe);
  CHECK(complete_event(r, other.ticket, KVROUTE_OUTCOME_SUCCESS, 1203) == KVROUTE_HEALTH_EVENT_NONE);
  CHECK(complete_event(r, probe.ticket, KVROUTE_OUTCOME_SUCCESS, 1300) == KVROUTE_HEALTH_EVENT_READMITTED);
  info = pod_info(r, a);
  CHECK(!info.ejected && !info.probing && info.ejected_until_ms == 0 && info.ejections_gateway == 1);
  kvroute_decision back = route_short(r, "llama", NULL, 1301);
  CHECK(back.pod == a && back.excluded == 0 && !back.health_probe); /* a has 0 in flight, b 1 */
  CHECK_STATUS(kvroute_router_complete(r, back.ticket, KVROUTE_OUTCOME_SUCCESS, 1302), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_router_complete(r, busy.ticket, KVROUTE_OUTCOME_SUCCESS, 1302), KVROUTE_STATUS_OK);

  kvroute_stats st;
  CHECK_STATUS(kvroute_router_stats(r, &st), KVROUTE_STATUS_OK);
  CHECK(st.completed_connect_failed == 3 && st.tickets_open == 0 && st.in_flight == 0);
  kvroute_router_free(r);
}

/* Three failed active checks take a pod out of service, a passed one brings it back; with
 * every pod's checks failing the model has no ready pod. */
static void test_health_checks(void) {
  kvroute_router *r = new_health_router(9, "least-request", 30000);
  kvroute_pod_id a = add_pod(r, "llama", "vllm-a", "10.0.0.1:8000");
  kvroute_pod_id b = add_pod(r, "llama", "vllm-b", "10.0.0.2:8000");
  uint32_t event = 77;
  CHECK_STATUS(kvroute_router_report_health_check(r, a, false, 10, &event), KVROUTE_STATUS_OK);
  CHECK(event == KVROUTE_HEALTH_EVENT_NONE);
  CHECK_STATUS(kvroute_router_report_health_check(r, a, false, 20, NULL), KVROUTE_STATUS_OK);
  CHECK(!pod_info(r, a).checks_failing);
  CHECK_STATUS(kvroute_router_report_health_check(r, a, false, 30, &event), KVROUTE_STATUS_OK);
  CHECK(event == KVROUTE_HEALTH_EVENT_CHECKS_FAILING);
  kvroute_pod_info info = pod_info(r, a);
  CHECK(info.checks_failing && !info.ejected && info.ready);
  CHECK_STATUS(kvroute_router_report_health_check(r, a, false, 35, &event), KVROUTE_STATUS_OK);
  CHECK(event == KVROUTE_HEALTH_EVENT_NONE); /* already failing */
  for (int i = 0; i < 20; i++) {
    kvroute_decision d = route_short(r, "llama", i % 2 ? "random" : "least-request", 40 + (uint64_t)i);
    CHECK(d.pod == b && d.excluded == 1);
    CHECK_STATUS(kvroute_router_complete(r, d.ticket, KVROUTE_OUTCOME_SUCCESS, 40 + (uint64_t)i), KVROUTE_STATUS_OK);
  }
  /* Errors: nothing written. */
  event = 77;
  CHECK_STATUS(kvroute_router_report_health_check(NULL, a, true, 60, &event), KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_router_report_health_check(r, 4321, true, 60, &event), KVROUTE_STATUS_UNKNOWN_POD);
  CHECK(event == 77);

  CHECK_STATUS(kvroute_router_report_health_check(r, a, true, 70, &event), KVROUTE_STATUS_OK);
  CHECK(event == KVROUTE_HEALTH_EVENT_CHECKS_PASSING);
  CHECK(!pod_info(r, a).checks_failing);
  kvroute_decision open_b = route_short(r, "llama", NULL, 71);
  kvroute_decision d = route_short(r, "llama", NULL, 72);
  CHECK(open_b.pod != d.pod && d.excluded == 0); /* both pods take requests again */

  /* Every pod failing its checks: no ready pod (active checks have no per-model floor). */
  for (int i = 0; i < 3; i++) {
    CHECK_STATUS(kvroute_router_report_health_check(r, a, false, 80, NULL), KVROUTE_STATUS_OK);
    CHECK_STATUS(kvroute_router_report_health_check(r, b, false, 80, NULL), KVROUTE_STATUS_OK);
  }
  kvroute_decision untouched;
  memset(&untouched, 0x5A, sizeof untouched);
  kvroute_decision none = untouched;
  CHECK_STATUS(kvroute_router_route(r, S("llama"), S("hi"), NULL, 0, 90, &none), KVROUTE_STATUS_NO_READY_POD);
  CHECK(memcmp(&none, &untouched, sizeof none) == 0);
  CHECK_STATUS(kvroute_router_report_health_check(r, b, true, 100, &event), KVROUTE_STATUS_OK);
  CHECK(event == KVROUTE_HEALTH_EVENT_CHECKS_PASSING);
  CHECK(route_short(r, "llama", NULL, 101).pod == b);
  kvroute_router_free(r);
}

/* The endpoint subset restricts the candidates to the pods at the listed addresses; an empty
 * subset or one of unknown addresses is NO_POD_IN_SUBSET. */
static void test_endpoint_subset(void) {
  kvroute_router *r = new_health_router(13, "least-request", 30000);
  kvroute_pod_id a = add_pod(r, "llama", "vllm-a", "10.0.0.1:8000");
  kvroute_pod_id b = add_pod(r, "llama", "vllm-b", "10.0.0.2:8000");
  kvroute_pod_id c = add_pod(r, "llama", "vllm-c", "10.0.0.3:8000");
  add_pod(r, "other", "vllm-d", "10.0.0.4:8000");
  const char *only_b[] = {"10.0.0.2:8000"};
  const char *a_or_c[] = {"10.0.0.1:8000", "10.0.0.9:1", "10.0.0.3:8000"};
  const char *unknown[] = {"10.9.9.9:8000"};
  const char *other_model[] = {"10.0.0.4:8000"};
  const char *with_null[] = {"10.0.0.2:8000", NULL};
  const char *bad_utf8[] = {"10.0.0.2:8000\xff"};
  const char *random = "random";
  kvroute_decision d;
  for (int i = 0; i < 10; i++) {
    CHECK_STATUS(kvroute_router_route_subset(r, S("llama"), S("hi"), S(random), only_b, 1, 10, &d), KVROUTE_STATUS_OK);
    CHECK(d.pod == b && d.excluded == 0);
  }
  /* Kept open, so least-request spreads over both pods of the subset and never picks b. */
  int picked_a = 0, picked_c = 0;
  for (int i = 0; i < 10; i++) {
    CHECK_STATUS(kvroute_router_route_subset(r, S("llama"), S("hi"), NULL, 0, a_or_c, 3, 20, &d), KVROUTE_STATUS_OK);
    CHECK(d.pod == a || d.pod == c);
    picked_a += d.pod == a;
    picked_c += d.pod == c;
  }
  CHECK(picked_a == 5 && picked_c == 5);
  /* The JSON variant, with the model from the body. */
  const char *body = "{\"model\":\"llama\",\"prompt\":\"hello\"}";
  CHECK_STATUS(kvroute_router_route_json_subset(r, NULL, 0, S(body), NULL, 0, only_b, 1, 30, &d), KVROUTE_STATUS_OK);
  CHECK(d.pod == b);
  /* (NULL, 0): no subset, any pod (b has the most in flight, so not b). */
  CHECK_STATUS(kvroute_router_route_subset(r, S("llama"), S("hi"), NULL, 0, NULL, 0, 31, &d), KVROUTE_STATUS_OK);
  CHECK(d.pod == a || d.pod == c);

  /* No pod of the model in the subset: the new status, nothing written. */
  kvroute_decision untouched;
  memset(&untouched, 0x5A, sizeof untouched);
  d = untouched;
  const char *empty[1] = {NULL}; /* a non-NULL array of length 0 */
  CHECK_STATUS(kvroute_router_route_subset(r, S("llama"), S("hi"), NULL, 0, empty, 0, 40, &d),
               KVROUTE_STATUS_NO_POD_IN_SUBSET);
  CHECK_STATUS(kvroute_router_route_subset(r, S("llama"), S("hi"), NULL, 0, unknown, 1, 40, &d),
               KVROUTE_STATUS_NO_POD_IN_SUBSET);
  CHECK_STATUS(kvroute_router_route_subset(r, S("llama"), S("hi"), NULL, 0, other_model, 1, 40, &d),
               KVROUTE_STATUS_NO_POD_IN_SUBSET);
  CHECK_STATUS(kvroute_router_route_json_subset(r, NULL, 0, S(body), NULL, 0, empty, 0, 40, &d),
               KVROUTE_STATUS_NO_POD_IN_SUBSET);
  CHECK_STATUS(kvroute_router_set_pod_ready(r, b, false), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_router_route_subset(r, S("llama"), S("hi"), NULL, 0, only_b, 1, 40, &d),
               KVROUTE_STATUS_NO_POD_IN_SUBSET);
  CHECK_STATUS(kvroute_router_set_pod_ready(r, b, true), KVROUTE_STATUS_OK);
  /* An unknown model is still UNKNOWN_MODEL; bad arrays are NULL_PARAMETER / INVALID_UTF8. */
  CHECK_STATUS(kvroute_router_route_subset(r, S("mistral"), S("hi"), NULL, 0, only_b, 1, 40, &d),
               KVROUTE_STATUS_UNKNOWN_MODEL);
  CHECK_STATUS(kvroute_router_route_subset(r, S("llama"), S("hi"), NULL, 0, NULL, 2, 40, &d),
               KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_router_route_subset(r, S("llama"), S("hi"), NULL, 0, with_null, 2, 40, &d),
               KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_router_route_subset(r, S("llama"), S("hi"), NULL, 0, bad_utf8, 1, 40, &d),
               KVROUTE_STATUS_INVALID_UTF8);
  CHECK_STATUS(kvroute_router_route_subset(NULL, S("llama"), S("hi"), NULL, 0, only_b, 1, 40, &d),
               KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_router_route_subset(r, S("llama"), S("hi"), NULL, 0, only_b, 1, 40, NULL),
               KVROUTE_STATUS_NULL_PARAMETER);
  CHECK(memcmp(&d, &untouched, sizeof d) == 0);

  /* A subset pod that is ejected or failing its checks is left out like any other. */
  for (int i = 0; i < 3; i++) {
    CHECK_STATUS(kvroute_router_report_health_check(r, b, false, 50, NULL), KVROUTE_STATUS_OK);
  }
  CHECK_STATUS(kvroute_router_route_subset(r, S("llama"), S("hi"), NULL, 0, only_b, 1, 51, &d),
               KVROUTE_STATUS_NO_POD_IN_SUBSET);
  kvroute_stats st;
  CHECK_STATUS(kvroute_router_stats(r, &st), KVROUTE_STATUS_OK);
  CHECK(st.no_ready_pod == 6 && st.unknown_model == 1);
  kvroute_router_free(r);
}

/* ---- session affinity ---- */

/* The session id of an open ticket's decision into out[96] ("" when it carries none). */
static void session_of(kvroute_router *r, kvroute_ticket t, char *out) {
  size_t n = 0;
  CHECK_STATUS(kvroute_router_session_id(r, t, (uint8_t *)out, 96, &n), KVROUTE_STATUS_OK);
  CHECK(strlen(out) == n);
}

/* A request without a session id gets its pod's back (base64 of its ip:port, AIBrix's
 * encoding); requests with it go to that pod; once the pod is gone, the id falls back to a
 * random candidate; bad ids are no error, a NULL one with a length is NULL_PARAMETER. */
static void test_session_affinity(void) {
  kvroute_router *r = new_router(21, "session-affinity");
  const char *addrs[3] = {"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"};
  const char *ids[3] = {"MTAuMC4wLjE6ODAwMA==", "MTAuMC4wLjI6ODAwMA==", "MTAuMC4wLjM6ODAwMA=="};
  kvroute_pod_id pods[3];
  for (int i = 0; i < 3; i++) {
    pods[i] = add_pod(r, "llama", addrs[i], addrs[i]);
  }
#define POD_INDEX(pod) ((pod) == pods[0] ? 0 : (pod) == pods[1] ? 1 : 2)
  const char *body = "{\"model\":\"llama\",\"prompt\":\"hello\"}";
  kvroute_decision d;
  char id[96], got[96];
  CHECK_STATUS(kvroute_router_route_session(r, S("llama"), S("hi"), NULL, 0, NULL, 0, NULL, 0, 1, &d), KVROUTE_STATUS_OK);
  CHECK(d.reason == KVROUTE_REASON_RANDOM);
  session_of(r, d.ticket, id);
  CHECK(strcmp(id, ids[POD_INDEX(d.pod)]) == 0);
  const kvroute_pod_id sticky = d.pod;
  /* With the id: its pod every time, though its load grows (the tickets stay open). */
  for (int i = 0; i < 6; i++) {
    if (i % 2) {
      CHECK_STATUS(kvroute_router_route_session(r, S("llama"), S("hi"), NULL, 0, NULL, 0, S(id), 2, &d), KVROUTE_STATUS_OK);
    } else {
      CHECK_STATUS(kvroute_router_route_json_session(r, NULL, 0, S(body), NULL, 0, NULL, 0, S(id), 2, &d),
                   KVROUTE_STATUS_OK);
    }
    CHECK(d.pod == sticky && d.reason == KVROUTE_REASON_SESSION_AFFINITY);
    session_of(r, d.ticket, got);
    CHECK(strcmp(got, id) == 0);
  }
  /* The pod removed: a random one of the others, whose id comes back. */
  CHECK_STATUS(kvroute_router_remove_pod(r, sticky), KVROUTE_STATUS_OK);
  for (int i = 0; i < 4; i++) {
    CHECK_STATUS(kvroute_router_route_json_session(r, NULL, 0, S(body), NULL, 0, NULL, 0, S(id), 3, &d),
                 KVROUTE_STATUS_OK);
    CHECK(d.pod != sticky && d.reason == KVROUTE_REASON_RANDOM);
    session_of(r, d.ticket, got);
    CHECK(strcmp(got, ids[POD_INDEX(d.pod)]) == 0);
  }
#undef POD_INDEX
  /* Not UTF-8, not base64: no error. A spec without session-affinity: no id out. */
  CHECK_STATUS(kvroute_router_route_session(r, S("llama"), S("hi"), NULL, 0, NULL, 0, S("\xff?"), 4, &d), KVROUTE_STATUS_OK);
  CHECK(d.reason == KVROUTE_REASON_RANDOM);
  CHECK_STATUS(kvroute_router_route_session(r, S("llama"), S("hi"), S("least-request"), NULL, 0, S(id), 5, &d),
               KVROUTE_STATUS_OK);
  session_of(r, d.ticket, got);
  CHECK(got[0] == 0);

  kvroute_decision untouched;
  memset(&untouched, 0x5A, sizeof untouched);
  d = untouched;
  CHECK_STATUS(kvroute_router_route_session(r, S("llama"), S("hi"), NULL, 0, NULL, 0, NULL, 4, 6, &d),
               KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_router_route_json_session(r, NULL, 0, S(body), NULL, 0, NULL, 0, NULL, 4, 6, &d),
               KVROUTE_STATUS_NULL_PARAMETER);
  CHECK(memcmp(&d, &untouched, sizeof d) == 0);
  /* The getter: a size query, too small a buffer (untouched), NULL pointers, a closed ticket. */
  CHECK_STATUS(kvroute_router_route_session(r, S("llama"), S("hi"), NULL, 0, NULL, 0, NULL, 0, 7, &d), KVROUTE_STATUS_OK);
  size_t n = 0;
  char small[8] = "xxxxxxx";
  CHECK_STATUS(kvroute_router_session_id(r, d.ticket, NULL, 0, &n), KVROUTE_STATUS_INSUFFICIENT_SIZE);
  CHECK(n == strlen(ids[0]) + 1);
  CHECK_STATUS(kvroute_router_session_id(r, d.ticket, (uint8_t *)small, sizeof small, &n),
               KVROUTE_STATUS_INSUFFICIENT_SIZE);
  CHECK(strcmp(small, "xxxxxxx") == 0);
  CHECK_STATUS(kvroute_router_session_id(r, d.ticket, NULL, 8, &n), KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_router_session_id(r, d.ticket, (uint8_t *)got, sizeof got, NULL), KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_router_session_id(NULL, d.ticket, (uint8_t *)got, sizeof got, &n), KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_router_complete(r, d.ticket, KVROUTE_OUTCOME_SUCCESS, 8), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_router_session_id(r, d.ticket, (uint8_t *)got, sizeof got, &n), KVROUTE_STATUS_UNKNOWN_TICKET);
  kvroute_router_free(r);
}

static void test_extract_prompt(void) {
  const char *body =
      "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"Be \\\"brief\\\".\\n\"},"
      "{\"role\":\"user\",\"content\":[ {\"type\":\"text\", \"text\":\"hi\"} ]}]}";
  char out[128];
  size_t n = 0;
  CHECK_STATUS(kvroute_extract_prompt(S(body), (uint8_t *)out, sizeof out, &n), KVROUTE_STATUS_OK);
  const char *expected = "Be \"brief\".\n [ {\"type\":\"text\", \"text\":\"hi\"} ]";
  CHECK(strcmp(out, expected) == 0 && n == strlen(expected));
  CHECK_STATUS(kvroute_extract_prompt(S(body), (uint8_t *)out, n, &n), KVROUTE_STATUS_INSUFFICIENT_SIZE);
  CHECK(n == strlen(expected) + 1);
  CHECK_STATUS(kvroute_extract_prompt(S("[]"), (uint8_t *)out, sizeof out, &n), KVROUTE_STATUS_INVALID_BODY);
}

/* ---- golden vectors: a minimal reader for tests/vectors/prefix_hash_v1.json ---- */

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    perror(path);
    exit(1);
  }
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)len + 1);
  CHECK(buf != NULL && fread(buf, 1, (size_t)len, f) == (size_t)len);
  buf[len] = 0;
  fclose(f);
  return buf;
}

/* The position just after `"key":` (and spaces), searching from `p`, or NULL. */
static const char *after_key(const char *p, const char *key) {
  char pattern[64];
  snprintf(pattern, sizeof pattern, "\"%s\"", key);
  p = strstr(p, pattern);
  if (!p) {
    return NULL;
  }
  p += strlen(pattern);
  while (*p == ' ' || *p == ':' || *p == '\n') {
    p++;
  }
  return p;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  CHECK(!"lowercase hex digit");
  return 0;
}

static void test_golden_vectors(const char *path) {
  char *json = read_file(path);
  const char *scheme = after_key(json, "scheme");
  CHECK(scheme && strncmp(scheme, "\"v1\"", 4) == 0);
  const char *p = after_key(json, "cases");
  int cases = 0;
  while ((p = after_key(p, "block_size")) != NULL) {
    char *end;
    size_t block = strtoull(p, &end, 10);
    p = after_key(end, "seed");
    CHECK(p);
    uint64_t seed = strtoull(p, &end, 10);
    p = after_key(end, "prompt_hex");
    CHECK(p && *p == '"');
    p++;
    const char *hex_end = strchr(p, '"');
    size_t len = (size_t)(hex_end - p) / 2;
    uint8_t *prompt = malloc(len + 1);
    for (size_t i = 0; i < len; i++) {
      prompt[i] = (uint8_t)(hexval(p[2 * i]) << 4 | hexval(p[2 * i + 1]));
    }
    p = after_key(hex_end, "hashes");
    CHECK(p && *p == '[');
    size_t expected_n = 0;
    uint64_t *expected = malloc(sizeof(uint64_t) * (len / block + 1));
    for (p++; *p != ']'; p++) {
      if (*p == '"') {
        CHECK(p[1] == '0' && p[2] == 'x' && p[19] == '"');
        CHECK(expected_n < len / block + 1);
        expected[expected_n++] = strtoull(p + 3, &end, 16);
        CHECK(end == p + 19);
        p = end;
      }
    }
    /* Count query, too-small buffer, then the real call. */
    size_t n = 12345;
    CHECK_STATUS(kvroute_prefix_hashes(block, seed, prompt, len, NULL, 0, &n),
                 expected_n ? KVROUTE_STATUS_INSUFFICIENT_SIZE : KVROUTE_STATUS_OK);
    CHECK(n == expected_n);
    uint64_t *got = malloc(sizeof(uint64_t) * (expected_n + 1));
    CHECK_STATUS(kvroute_prefix_hashes(block, seed, prompt, len, got, expected_n, &n), KVROUTE_STATUS_OK);
    CHECK(n == expected_n);
    for (size_t i = 0; i < n; i++) {
      if (got[i] != expected[i]) {
        fprintf(stderr, "case %d (block %zu, seed %" PRIu64 "): hash %zu is 0x%016" PRIx64 ", expected 0x%016" PRIx64 "\n",
                cases, block, seed, i, got[i], expected[i]);
        exit(1);
      }
    }
    free(got);
    free(expected);
    free(prompt);
    cases++;
  }
  CHECK(cases >= 5);
  CHECK_STATUS(kvroute_prefix_hashes(0, 0, NULL, 0, NULL, 0, &(size_t){0}), KVROUTE_STATUS_INVALID_PARAMETER);
  printf("golden vectors: %d cases match\n", cases);
  free(json);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s VECTORS_JSON\n", argv[0]);
    return 2;
  }
  test_version();
  test_status_strings();
  test_config_statuses();
  test_router_statuses();
  test_outcomes();
  test_ejection_and_probe();
  test_health_checks();
  test_endpoint_subset();
  test_session_affinity();
  test_extract_prompt();
  test_golden_vectors(argv[1]);
  printf("test_api: all checks passed (kvroute %s)\n", kvroute_version());
  return 0;
}
