/* example.c: a complete program using kvroute from C. A router with two pods, two chat
 * requests that share a long system prompt (the second goes to the pod that holds the first's
 * KV cache), and one request for a model no pod serves. */
#define _POSIX_C_SOURCE 200809L /* for clock_gettime */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <kvroute.h>

/* The caller's monotonic clock in milliseconds: the router never reads a clock itself. */
static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* The HTTP status a gateway answers for a failed route. */
static int http_status(kvroute_status st) {
  switch (st) {
  case KVROUTE_STATUS_NO_READY_POD:
  case KVROUTE_STATUS_NO_POD_IN_SUBSET:
    return 503;
  case KVROUTE_STATUS_UNKNOWN_MODEL:
  case KVROUTE_STATUS_INVALID_BODY:
  case KVROUTE_STATUS_INVALID_STRATEGY:
  case KVROUTE_STATUS_INVALID_UTF8:
    return 400;
  default: /* PANIC, POISONED: a bug in kvroute */
    return 500;
  }
}

/* Routes one OpenAI request body as received (the model is taken from the body), prints what
 * a gateway would do with it, and completes it. */
static void handle(kvroute_router *r, const char *body) {
  uint64_t routed_ms = now_ms();
  kvroute_decision d;
  kvroute_status st = kvroute_router_route_json(r, NULL, 0, (const uint8_t *)body, strlen(body), NULL, 0,
                                                routed_ms, &d);
  if (st != KVROUTE_STATUS_OK) {
    printf("%d %s\n", http_status(st), kvroute_status_str(st));
    return;
  }
  char addr[64], why[512];
  size_t n;
  kvroute_router_pod_address(r, d.pod, (uint8_t *)addr, sizeof addr, &n); /* connect here */
  kvroute_router_explain(r, d.ticket, (uint8_t *)why, sizeof why, &n);    /* log it, or send it as a header */
  printf("200 %s %s\n", addr, why);
  /* ... proxy the request to addr, then, exactly once, say how it ended: SUCCESS, CANCELLED,
   * FAILED (a 5xx), CONNECT_FAILED, RESET or TIMEOUT (see "Pod health"). */
  kvroute_router_complete(r, d.ticket, KVROUTE_OUTCOME_SUCCESS, now_ms());
}

int main(void) {
  kvroute_config_builder *b = kvroute_config_builder_new();
  /* The seed of every random choice: fixed here so that every run prints the same; a gateway
   * passes fresh randomness from the OS (getrandom()). */
  kvroute_config_builder_set_seed(b, 42);
  kvroute_config_builder_set_strategy(b, (const uint8_t *)"prefix-cache", strlen("prefix-cache"));
  const kvroute_config *config;
  kvroute_status st = kvroute_config_builder_build(b, &config); /* consumes b, even on error */
  if (st != KVROUTE_STATUS_OK) {
    fprintf(stderr, "config: %s\n", kvroute_status_str(st));
    return 1;
  }
  kvroute_router *r;
  st = kvroute_router_new(config, &r);
  kvroute_config_free(config); /* the router keeps its own reference */
  if (st != KVROUTE_STATUS_OK) {
    fprintf(stderr, "router: %s\n", kvroute_status_str(st));
    return 1;
  }

  const char *pods[2][2] = {{"vllm-a", "10.0.0.1:8000"}, {"vllm-b", "10.0.0.2:8000"}};
  for (int i = 0; i < 2; i++) {
    kvroute_pod_id pod;
    st = kvroute_router_add_pod(r, (const uint8_t *)"llama", strlen("llama"), (const uint8_t *)pods[i][0],
                                strlen(pods[i][0]), (const uint8_t *)pods[i][1], strlen(pods[i][1]), true, &pod);
    if (st != KVROUTE_STATUS_OK) {
      fprintf(stderr, "add_pod: %s\n", kvroute_status_str(st));
      return 1;
    }
  }

  char system[1024] = "";
  for (int i = 0; i < 20; i++) {
    strcat(system, "You are a careful assistant. ");
  }
  const char *questions[2] = {"What is KV caching?", "And prefix caching?"};
  for (int i = 0; i < 2; i++) {
    char body[2048];
    snprintf(body, sizeof body,
             "{\"model\":\"llama\",\"messages\":[{\"role\":\"system\",\"content\":\"%s\"},"
             "{\"role\":\"user\",\"content\":\"%s\"}]}",
             system, questions[i]);
    handle(r, body);
  }
  handle(r, "{\"model\":\"mistral\",\"prompt\":\"Hello\"}");

  /* Timers: call tick when the next deadline is due (or every second). */
  bool has_deadline;
  uint64_t deadline_ms;
  kvroute_router_next_deadline(r, &has_deadline, &deadline_ms);
  if (has_deadline && deadline_ms <= now_ms()) {
    kvroute_router_tick(r, now_ms());
  }

  kvroute_router_free(r);
  return 0;
}
