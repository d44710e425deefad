/* Helpers shared by the C tests. */
#ifndef KVROUTE_TEST_COMMON_H
#define KVROUTE_TEST_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvroute.h"

#define SENTENCE \
  "The service tracks request latency, token throughput, cache utilization, and healthy replicas.\n"

/* Fails the test with the location and the status name. */
#define CHECK_STATUS(expr, expected)                                                             \
  do {                                                                                           \
    kvroute_status got_ = (expr);                                                                \
    if (got_ != (uint32_t)(expected)) {                                                          \
      fprintf(stderr, "%s:%d: %s returned %s, expected %s\n", __FILE__, __LINE__, #expr,         \
              kvroute_status_str(got_), kvroute_status_str(expected));                           \
      exit(1);                                                                                   \
    }                                                                                            \
  } while (0)

#define CHECK(cond)                                                                              \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);                   \
      exit(1);                                                                                   \
    }                                                                                            \
  } while (0)

/* Builds the configuration (consuming `b`) and a router from it. */
static inline kvroute_router *build_router(kvroute_config_builder *b) {
  const kvroute_config *config = NULL;
  CHECK_STATUS(kvroute_config_builder_build(b, &config), KVROUTE_STATUS_OK);
  kvroute_router *r = NULL;
  CHECK_STATUS(kvroute_router_new(config, &r), KVROUTE_STATUS_OK);
  kvroute_config_free(config); /* the router keeps its own reference */
  return r;
}

/* 256 hex digits derived from the family number (the same generator as
 * ffi/examples/scenario.rs). `out` holds at least 257 bytes. */
static inline void study_salt(uint64_t family, char *out) {
  uint64_t x = family * 0x9E3779B97F4A7C15ull + 1;
  for (int i = 0; i < 256; i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    out[i] = "0123456789abcdef"[x >> 60];
  }
  out[256] = 0;
}

/* The study prompt: salt line, `Document N`, the sentence 300 times, then `sep` and the
 * question. Returns a malloc'd NUL-terminated string. When `json_escape` is set, newlines are
 * written as `\n` escapes (for a JSON string). */
static inline char *study_text(uint64_t family, int json_escape) {
  char salt[257];
  study_salt(family, salt);
  const char *nl = json_escape ? "\\n" : "\n";
  size_t cap = 256 + 64 + 300 * (sizeof(SENTENCE) + 1);
  char *s = malloc(cap);
  CHECK(s != NULL);
  size_t n = (size_t)snprintf(s, cap, "%s%sDocument %llu%s", salt, nl, (unsigned long long)family, nl);
  for (int i = 0; i < 300; i++) {
    size_t len = sizeof(SENTENCE) - 2; /* without the newline and the NUL */
    memcpy(s + n, SENTENCE, len);
    n += len;
    n += (size_t)snprintf(s + n, cap - n, "%s", nl);
  }
  s[n] = 0;
  return s;
}

static inline void question_text(uint64_t q, char *out, size_t cap) {
  snprintf(out, cap, "Question %06llu: Explain the operational tradeoffs in detail.", (unsigned long long)q);
}

#endif
