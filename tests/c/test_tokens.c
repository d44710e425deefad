/* The C API's token-id calls, from C: kvroute_token_block_keys (against golden values from an
 * independent implementation, tests/c/token_keys_golden.py), kvroute_router_route_tokens(_subset)
 * and kvroute_router_route_keys: routing and every status path; their _session variants; and
 * least-ttft's settings by name (kvroute_config_builder_set_ttft), which token routing needs
 * (the engine's block size in tokens).
 *
 * Usage: test_tokens */
#include <inttypes.h>

#include "common.h"

#define S(str) (const uint8_t *)(str), strlen(str)

static kvroute_pod_id add_pod(kvroute_router *r, const char *model, const char *name, const char *addr) {
  kvroute_pod_id id = 0;
  CHECK_STATUS(kvroute_router_add_pod(r, S(model), S(name), S(addr), true, &id), KVROUTE_STATUS_OK);
  return id;
}

/* A router with this seed and strategy, its hash seed fixed at 1234 (to key outside). */
static kvroute_router *new_router(uint64_t seed, const char *strategy) {
  kvroute_config_builder *cb = kvroute_config_builder_new();
  CHECK_STATUS(kvroute_config_builder_set_seed(cb, seed), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_config_builder_set_hash_seed(cb, 1234), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_config_builder_set_strategy(cb, S(strategy)), KVROUTE_STATUS_OK);
  return build_router(cb);
}

/* ---- token ids: kvroute_token_block_keys, kvroute_router_route_tokens(_subset), _route_keys ---- */

/* (ptr, len) of an optional string: (NULL, 0) for none. */
#define OPT(str) (const uint8_t *)(str), ((str) ? strlen(str) : 0)

/* Keys from an independent implementation of the scheme (pure-Python XXH64:
 * tests/c/token_keys_golden.py); count query, too small a buffer, then the call. */
static void test_token_block_keys(void) {
  const uint32_t ids[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const struct {
    const char *lora, *salt;
    uint64_t keys[2];
  } golden[] = {
      {NULL, NULL, {0xd2828303c82b3344ull, 0x8879faddb1d9721bull}},
      {"sql", NULL, {0x46385cd41f318aa3ull, 0x39f297036e1dda2bull}},
      {NULL, "tenant-1", {0x80225f633e8330d8ull, 0x2baf9d2edb9a58bbull}},
      {"sql", "tenant-1", {0x61b74bbd12967618ull, 0x30b8481bf599aaa2ull}},
  };
  for (size_t i = 0; i < sizeof golden / sizeof golden[0]; i++) {
    uint64_t keys[3] = {7, 7, 7};
    size_t n = 12345;
    CHECK_STATUS(kvroute_token_block_keys(4, 42, ids, 9, OPT(golden[i].lora), OPT(golden[i].salt), NULL, 0, &n),
                 KVROUTE_STATUS_INSUFFICIENT_SIZE);
    CHECK(n == 2);
    CHECK_STATUS(kvroute_token_block_keys(4, 42, ids, 9, OPT(golden[i].lora), OPT(golden[i].salt), keys, 1, &n),
                 KVROUTE_STATUS_INSUFFICIENT_SIZE);
    CHECK(n == 2 && keys[0] == 7);
    CHECK_STATUS(kvroute_token_block_keys(4, 42, ids, 9, OPT(golden[i].lora), OPT(golden[i].salt), keys, 3, &n),
                 KVROUTE_STATUS_OK);
    CHECK(n == 2 && keys[0] == golden[i].keys[0] && keys[1] == golden[i].keys[1] && keys[2] == 7);
  }
  uint32_t long_ids[40];
  for (uint32_t i = 0; i < 40; i++) {
    long_ids[i] = 1000 + i;
  }
  uint64_t keys[2];
  size_t n = 0;
  CHECK_STATUS(kvroute_token_block_keys(KVROUTE_DEFAULT_BLOCK_TOKENS, 0, long_ids, 40, NULL, 0, NULL, 0, keys, 2, &n),
               KVROUTE_STATUS_OK);
  CHECK(n == 2 && keys[0] == 0x7f98bc3aa313799full && keys[1] == 0xb4bb9f4d4833b4eaull);
  /* An empty LoRA name or salt is none; fewer ids than a block, or none, have no keys. */
  uint64_t again[2];
  CHECK_STATUS(kvroute_token_block_keys(16, 0, long_ids, 40, S(""), S(""), again, 2, &n), KVROUTE_STATUS_OK);
  CHECK(n == 2 && again[0] == keys[0] && again[1] == keys[1]);
  CHECK_STATUS(kvroute_token_block_keys(16, 0, long_ids, 15, NULL, 0, NULL, 0, NULL, 0, &n), KVROUTE_STATUS_OK);
  CHECK(n == 0);
  CHECK_STATUS(kvroute_token_block_keys(16, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, &n), KVROUTE_STATUS_OK);
  CHECK(n == 0);
  /* Errors: nothing written. */
  n = 77;
  keys[0] = 7;
  CHECK_STATUS(kvroute_token_block_keys(0, 0, long_ids, 40, NULL, 0, NULL, 0, keys, 2, &n), KVROUTE_STATUS_INVALID_PARAMETER);
  CHECK_STATUS(kvroute_token_block_keys(KVROUTE_MAX_BLOCK_TOKENS + 1, 0, long_ids, 40, NULL, 0, NULL, 0, keys, 2, &n),
               KVROUTE_STATUS_INVALID_PARAMETER);
  CHECK_STATUS(kvroute_token_block_keys(16, 0, NULL, 40, NULL, 0, NULL, 0, keys, 2, &n), KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_token_block_keys(16, 0, long_ids, 40, NULL, 3, NULL, 0, keys, 2, &n), KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_token_block_keys(16, 0, long_ids, 40, NULL, 0, NULL, 0, NULL, 2, &n), KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_token_block_keys(16, 0, long_ids, 40, (const uint8_t *)"a\xff", 2, NULL, 0, keys, 2, &n),
               KVROUTE_STATUS_INVALID_UTF8);
  CHECK_STATUS(kvroute_token_block_keys(16, 0, long_ids, 40, NULL, 0, (const uint8_t *)"\xc3", 1, keys, 2, &n),
               KVROUTE_STATUS_INVALID_UTF8);
  CHECK(n == 77 && keys[0] == 7);
  CHECK_STATUS(kvroute_token_block_keys(16, 0, long_ids, 40, NULL, 0, NULL, 0, keys, 2, NULL), KVROUTE_STATUS_NULL_PARAMETER);
}

/* `n` token ids of `family` (the same family: the same ids), from a small LCG. */
static void token_ids(uint64_t family, uint32_t *out, size_t n) {
  uint64_t x = family * 0x9E3779B97F4A7C15ull | 1;
  for (size_t i = 0; i < n; i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    out[i] = (uint32_t)(x >> 40) % 128000;
  }
}

/* The prompt's token count in the decision line: N of `pred_cached_tokens=C/N`. */
static unsigned long explained_prompt_tokens(kvroute_router *r, kvroute_ticket t) {
  char line[512];
  size_t n = 0;
  CHECK_STATUS(kvroute_router_explain(r, t, (uint8_t *)line, sizeof line, &n), KVROUTE_STATUS_OK);
  const char *p = strstr(line, " pred_cached_tokens=");
  CHECK(p != NULL);
  p = strchr(p, '/');
  CHECK(p != NULL);
  return strtoul(p + 1, NULL, 10);
}

/* Chats sharing a 1,000-token system prompt, tokenized by the proxy: the second goes to the
 * first's pod and matches its 62 blocks of 16; least-ttft counts the prompt in tokens exactly.
 * The same prompt keyed by the caller and routed with _route_keys matches too; another LoRA
 * adapter or cache salt matches nothing. Then every status path. */
static void test_route_tokens(void) {
  kvroute_router *r = new_router(21, "least-ttft");
  kvroute_pod_id a = add_pod(r, "llama", "vllm-a", "10.0.0.1:8000");
  kvroute_pod_id b = add_pod(r, "llama", "vllm-b", "10.0.0.2:8000");

  enum { SYSTEM = 1000, FIRST = SYSTEM + 5, SECOND = SYSTEM + 13 };
  uint32_t first_ids[FIRST], second_ids[SECOND];
  token_ids(1, first_ids, SYSTEM);
  memcpy(second_ids, first_ids, sizeof(uint32_t) * SYSTEM);
  token_ids(2, first_ids + SYSTEM, FIRST - SYSTEM);
  token_ids(3, second_ids + SYSTEM, SECOND - SYSTEM);

  kvroute_decision first, second;
  CHECK_STATUS(kvroute_router_route_tokens(r, S("llama"), first_ids, FIRST, KVROUTE_DEFAULT_BLOCK_TOKENS, NULL, 0, NULL,
                                           0, NULL, 0, 0, 10, &first),
               KVROUTE_STATUS_OK);
  CHECK(first.matched_blocks == 0 && first.total_blocks == FIRST / 16);
  CHECK(explained_prompt_tokens(r, first.ticket) == FIRST);
  CHECK_STATUS(kvroute_router_route_tokens(r, S("llama"), second_ids, SECOND, 16, NULL, 0, NULL, 0, NULL, 0, 256, 11,
                                           &second),
               KVROUTE_STATUS_OK);
  CHECK(second.pod == first.pod && second.reason == KVROUTE_REASON_LEAST_TTFT);
  CHECK(second.matched_blocks == SYSTEM / 16 && second.total_blocks == SECOND / 16);
  CHECK(explained_prompt_tokens(r, second.ticket) == SECOND);

  /* The caller keys the prompt (with the router's hash seed) and routes on the keys. */
  uint64_t keys[SECOND / 16];
  size_t n = 0;
  CHECK_STATUS(kvroute_token_block_keys(16, 1234, second_ids, SECOND, NULL, 0, NULL, 0, keys, SECOND / 16, &n),
               KVROUTE_STATUS_OK);
  CHECK(n == SECOND / 16);
  kvroute_decision keyed;
  CHECK_STATUS(kvroute_router_route_keys(r, S("llama"), keys, n, SECOND, 16, NULL, 0, 0, NULL, 0, 12, &keyed),
               KVROUTE_STATUS_OK);
  CHECK(keyed.pod == first.pod && keyed.matched_blocks == n && keyed.total_blocks == n);
  CHECK(explained_prompt_tokens(r, keyed.ticket) == SECOND);

  /* Another adapter or salt: no match. The subset call keeps to its subset. */
  kvroute_decision lora, salted, subset;
  CHECK_STATUS(kvroute_router_route_tokens(r, S("llama"), first_ids, FIRST, 16, S("sql-adapter"), NULL, 0, NULL, 0, 0,
                                           13, &lora),
               KVROUTE_STATUS_OK);
  CHECK(lora.matched_blocks == 0);
  CHECK_STATUS(kvroute_router_route_tokens(r, S("llama"), first_ids, FIRST, 16, NULL, 0, S("tenant-2"), NULL, 0, 0, 14,
                                           &salted),
               KVROUTE_STATUS_OK);
  CHECK(salted.matched_blocks == 0);
  const char *other[] = {first.pod == a ? "10.0.0.2:8000" : "10.0.0.1:8000"};
  CHECK_STATUS(kvroute_router_route_tokens_subset(r, S("llama"), first_ids, FIRST, 16, NULL, 0, NULL, 0, NULL, 0, 0, other,
                                                  1, 15, &subset),
               KVROUTE_STATUS_OK);
  CHECK(subset.pod == (first.pod == a ? b : a) && subset.pod != first.pod);

  /* Status paths: nothing written. */
  kvroute_decision d, untouched;
  memset(&untouched, 0x5A, sizeof untouched);
  d = untouched;
  CHECK_STATUS(kvroute_router_route_tokens(NULL, S("llama"), first_ids, FIRST, 16, NULL, 0, NULL, 0, NULL, 0, 0, 20, &d),
               KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_router_route_tokens(r, S("llama"), first_ids, FIRST, 16, NULL, 0, NULL, 0, NULL, 0, 0, 20, NULL),
               KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_router_route_tokens(r, S("llama"), NULL, FIRST, 16, NULL, 0, NULL, 0, NULL, 0, 0, 20, &d),
               KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_router_route_tokens(r, S("llama"), first_ids, FIRST, 16, NULL, 2, NULL, 0, NULL, 0, 0, 20, &d),
               KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_router_route_tokens(r, (const uint8_t *)"ll\xc3", 3, first_ids, FIRST, 16, NULL, 0, NULL, 0, NULL,
                                           0, 0, 20, &d),
               KVROUTE_STATUS_INVALID_UTF8);
  CHECK_STATUS(kvroute_router_route_tokens(r, S("llama"), first_ids, FIRST, 16, (const uint8_t *)"\xff", 1, NULL, 0, NULL,
                                           0, 0, 20, &d),
               KVROUTE_STATUS_INVALID_UTF8);
  CHECK_STATUS(kvroute_router_route_tokens(r, S("llama"), first_ids, FIRST, 16, NULL, 0, (const uint8_t *)"s\xfe", 2, NULL,
                                           0, 0, 20, &d),
               KVROUTE_STATUS_INVALID_UTF8);
  CHECK_STATUS(kvroute_router_route_tokens(r, S("llama"), first_ids, FIRST, 0, NULL, 0, NULL, 0, NULL, 0, 0, 20, &d),
               KVROUTE_STATUS_INVALID_PARAMETER);
  CHECK_STATUS(kvroute_router_route_tokens(r, S("llama"), first_ids, FIRST, KVROUTE_MAX_BLOCK_TOKENS + 1, NULL, 0, NULL,
                                           0, NULL, 0, 0, 20, &d),
               KVROUTE_STATUS_INVALID_PARAMETER);
  CHECK_STATUS(kvroute_router_route_tokens(r, S("llama"), first_ids, FIRST, 16, NULL, 0, NULL, 0, S("fastest"), 0, 20, &d),
               KVROUTE_STATUS_INVALID_STRATEGY);
  CHECK_STATUS(kvroute_router_route_tokens(r, S("mistral"), first_ids, FIRST, 16, NULL, 0, NULL, 0, NULL, 0, 0, 20, &d),
               KVROUTE_STATUS_UNKNOWN_MODEL);
  const char *unknown[] = {"10.9.9.9:8000"};
  const char *with_null[] = {NULL};
  CHECK_STATUS(kvroute_router_route_tokens_subset(r, S("llama"), first_ids, FIRST, 16, NULL, 0, NULL, 0, NULL, 0, 0,
                                                  unknown, 1, 20, &d),
               KVROUTE_STATUS_NO_POD_IN_SUBSET);
  CHECK_STATUS(kvroute_router_route_tokens_subset(r, S("llama"), first_ids, FIRST, 16, NULL, 0, NULL, 0, NULL, 0, 0,
                                                  with_null, 1, 20, &d),
               KVROUTE_STATUS_NULL_PARAMETER);
  /* _route_keys: more blocks than the prompt has, a bad block size, NULL keys. */
  CHECK_STATUS(kvroute_router_route_keys(r, S("llama"), keys, n, SECOND / 16 * 16 - 1, 16, NULL, 0, 0, NULL, 0, 20, &d),
               KVROUTE_STATUS_INVALID_PARAMETER);
  CHECK_STATUS(kvroute_router_route_keys(r, S("llama"), keys, n, SECOND, 0, NULL, 0, 0, NULL, 0, 20, &d),
               KVROUTE_STATUS_INVALID_PARAMETER);
  CHECK_STATUS(kvroute_router_route_keys(r, S("llama"), NULL, n, SECOND, 16, NULL, 0, 0, NULL, 0, 20, &d),
               KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_router_route_keys(r, S("llama"), keys, n, SECOND, 16, NULL, 0, 0, unknown, 1, 20, &d),
               KVROUTE_STATUS_NO_POD_IN_SUBSET);
  CHECK_STATUS(kvroute_router_route_keys(NULL, S("llama"), keys, n, SECOND, 16, NULL, 0, 0, NULL, 0, 20, &d),
               KVROUTE_STATUS_NULL_PARAMETER);
  CHECK(memcmp(&d, &untouched, sizeof d) == 0);
  /* An empty prompt is fine. */
  CHECK_STATUS(kvroute_router_route_tokens(r, S("llama"), NULL, 0, 16, NULL, 0, NULL, 0, NULL, 0, 0, 21, &d),
               KVROUTE_STATUS_OK);
  CHECK(d.total_blocks == 0 && explained_prompt_tokens(r, d.ticket) == 0);

  const kvroute_ticket tickets[] = {first.ticket, second.ticket, keyed.ticket, lora.ticket, salted.ticket, subset.ticket,
                                    d.ticket};
  for (size_t i = 0; i < sizeof tickets / sizeof tickets[0]; i++) {
    CHECK_STATUS(kvroute_router_complete(r, tickets[i], KVROUTE_OUTCOME_SUCCESS, 30), KVROUTE_STATUS_OK);
  }
  kvroute_router_free(r);
}

/* The _session variants of the token calls: a request without a session id gets its pod's
 * back, and requests with it, keyed or not, go to that pod; (NULL, n > 0) is NULL_PARAMETER. */
static void test_route_tokens_session(void) {
  kvroute_router *r = new_router(5, "session-affinity");
  const kvroute_pod_id a = add_pod(r, "llama", "vllm-a", "10.0.0.1:8000");
  add_pod(r, "llama", "vllm-b", "10.0.0.2:8000");
  const uint32_t ids[20] = {1, 2, 3};
  const uint64_t key = 7;
  kvroute_decision first, d;
  CHECK_STATUS(kvroute_router_route_tokens_session(r, S("llama"), ids, 20, 16, NULL, 0, NULL, 0, NULL, 0, 0, NULL, 0,
                                                   NULL, 0, 1, &first),
               KVROUTE_STATUS_OK);
  char id[96];
  size_t n = 0;
  CHECK_STATUS(kvroute_router_session_id(r, first.ticket, (uint8_t *)id, sizeof id, &n), KVROUTE_STATUS_OK);
  CHECK(strcmp(id, first.pod == a ? "MTAuMC4wLjE6ODAwMA==" : "MTAuMC4wLjI6ODAwMA==") == 0);
  for (int i = 0; i < 4; i++) {
    CHECK_STATUS(kvroute_router_route_tokens_session(r, S("llama"), ids, 20, 16, NULL, 0, NULL, 0, NULL, 0, 0, NULL, 0,
                                                     S(id), 2, &d),
                 KVROUTE_STATUS_OK);
    CHECK(d.pod == first.pod && d.reason == KVROUTE_REASON_SESSION_AFFINITY);
    CHECK_STATUS(kvroute_router_route_keys_session(r, S("llama"), &key, 1, 20, 16, NULL, 0, 0, NULL, 0, S(id), 2, &d),
                 KVROUTE_STATUS_OK);
    CHECK(d.pod == first.pod && d.reason == KVROUTE_REASON_SESSION_AFFINITY);
  }
  CHECK_STATUS(kvroute_router_route_tokens_session(r, S("llama"), ids, 20, 16, NULL, 0, NULL, 0, NULL, 0, 0, NULL, 0,
                                                   NULL, 4, 3, &d),
               KVROUTE_STATUS_NULL_PARAMETER);
  CHECK_STATUS(kvroute_router_route_keys_session(r, S("llama"), &key, 1, 20, 16, NULL, 0, 0, NULL, 0, NULL, 4, 3, &d),
               KVROUTE_STATUS_NULL_PARAMETER);
  kvroute_router_free(r);
}

/* The predicted TTFT in the decision's explanation. */
static unsigned long predicted_ttft_ms(kvroute_router *r, kvroute_ticket ticket) {
  char line[1024];
  size_t n = 0;
  CHECK_STATUS(kvroute_router_explain(r, ticket, (uint8_t *)line, sizeof line, &n), KVROUTE_STATUS_OK);
  const char *p = strstr(line, "pred_ttft_ms=");
  CHECK(p != NULL);
  return strtoul(p + strlen("pred_ttft_ms="), NULL, 10);
}

/* kvroute_config_builder_set_ttft: a slow prefill prior and one slot per pod show in the
 * predictions; bad keys and values are refused. */
static void test_ttft_settings(void) {
  kvroute_config_builder *cb = kvroute_config_builder_new();
  CHECK_STATUS(kvroute_config_builder_set_strategy(cb, S("least-ttft")), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_config_builder_set_ttft(cb, S("prefill_tokens_per_s"), 300.0), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_config_builder_set_ttft(cb, S("max_seqs"), 1.0), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_config_builder_set_ttft(cb, S("engine_block_tokens"), 16.0), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_config_builder_set_ttft(cb, S("prefill_tokens"), 1.0), KVROUTE_STATUS_INVALID_PARAMETER);
  CHECK_STATUS(kvroute_config_builder_set_ttft(cb, S("max_seqs"), 0.5), KVROUTE_STATUS_INVALID_PARAMETER);
  CHECK_STATUS(kvroute_config_builder_set_ttft(cb, NULL, 3, 1.0), KVROUTE_STATUS_NULL_PARAMETER);
  kvroute_router *r = build_router(cb);
  add_pod(r, "m", "a", "10.0.0.1:8000");
  const char *prompt = "a long shared prompt, repeated to make a prefill worth predicting. ";
  char text[8192] = {0};
  for (int i = 0; i < 100; i++) strcat(text, prompt);
  kvroute_decision first, second;
  CHECK_STATUS(kvroute_router_route(r, S("m"), S(text), NULL, 0, 1, &first), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_router_route(r, S("m"), S(text), NULL, 0, 1, &second), KVROUTE_STATUS_OK);
  unsigned long a = predicted_ttft_ms(r, first.ticket), b = predicted_ttft_ms(r, second.ticket);
  CHECK(a > 1000); /* ~1,700 tokens at 300 tokens/s */
  CHECK(b > a);    /* one slot: the second waits for the first */
  CHECK_STATUS(kvroute_router_complete(r, first.ticket, KVROUTE_OUTCOME_SUCCESS, 2), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_router_complete(r, second.ticket, KVROUTE_OUTCOME_SUCCESS, 3), KVROUTE_STATUS_OK);
  kvroute_router_free(r);
}

int main(void) {
  test_ttft_settings();
  test_token_block_keys();
  test_route_tokens();
  test_route_tokens_session();
  printf("test_tokens: all checks passed (kvroute %s)\n", kvroute_version());
  return 0;
}
