/* The smoke test run under valgrind (and under ASan/UBSan): a whole lifecycle, with four
 * threads routing and completing on one router at once. Exits non-zero on any failure.
 *
 * Usage: smoke */
#include <pthread.h>

#include "common.h"

#define THREADS 4
#define ROUTES 50

static kvroute_router *router;

static void *worker(void *arg) {
  uint64_t id = (uint64_t)(uintptr_t)arg;
  char *text = study_text(id % 2, 0);
  size_t len = strlen(text);
  for (uint64_t i = 0; i < ROUTES; i++) {
    kvroute_decision d;
    CHECK_STATUS(kvroute_router_route(router, (const uint8_t *)"study", 5, (const uint8_t *)text, len, NULL, 0,
                                      id * 1000 + i, &d),
                 KVROUTE_STATUS_OK);
    char line[512];
    size_t n;
    CHECK_STATUS(kvroute_router_explain(router, d.ticket, (uint8_t *)line, sizeof line, &n), KVROUTE_STATUS_OK);
    CHECK_STATUS(kvroute_router_complete(router, d.ticket, KVROUTE_OUTCOME_SUCCESS, id * 1000 + i),
                 KVROUTE_STATUS_OK);
  }
  free(text);
  return NULL;
}

int main(void) {
  kvroute_config_builder *b = kvroute_config_builder_new();
  CHECK(b != NULL);
  CHECK_STATUS(kvroute_config_builder_set_seed(b, 1), KVROUTE_STATUS_OK);
  const kvroute_config *config;
  CHECK_STATUS(kvroute_config_builder_build(b, &config), KVROUTE_STATUS_OK);
  CHECK_STATUS(kvroute_router_new(config, &router), KVROUTE_STATUS_OK);
  kvroute_config_free(config);
  const char *names[] = {"vllm-a", "vllm-b", "vllm-c"};
  const char *addrs[] = {"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"};
  for (int i = 0; i < 3; i++) {
    kvroute_pod_id id;
    CHECK_STATUS(kvroute_router_add_pod(router, (const uint8_t *)"study", 5, (const uint8_t *)names[i],
                                        strlen(names[i]), (const uint8_t *)addrs[i], strlen(addrs[i]), true, &id),
                 KVROUTE_STATUS_OK);
  }
  pthread_t threads[THREADS];
  for (uintptr_t t = 0; t < THREADS; t++) {
    CHECK(pthread_create(&threads[t], NULL, worker, (void *)t) == 0);
  }
  for (int t = 0; t < THREADS; t++) {
    CHECK(pthread_join(threads[t], NULL) == 0);
  }
  kvroute_stats s;
  CHECK_STATUS(kvroute_router_stats(router, &s), KVROUTE_STATUS_OK);
  CHECK(s.tickets_issued == THREADS * ROUTES && s.completed_success == THREADS * ROUTES);
  CHECK(s.tickets_open == 0 && s.in_flight == 0 && s.index_blocks > 0);
  /* A malformed call in the middle of everything: a status, not a crash. */
  CHECK_STATUS(kvroute_router_complete(router, 0, KVROUTE_OUTCOME_SUCCESS, 0), KVROUTE_STATUS_TICKET_NOT_OPEN);
  kvroute_router_free(router);
  printf("smoke: %d routes on %d threads, ok\n", THREADS * ROUTES, THREADS);
  return 0;
}
