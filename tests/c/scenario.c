/* Runs tests/c/scenario.txt through the C API and prints one line per step, in the format of
 * ffi/examples/scenario.rs (which runs the same file through kvroute-core directly).
 * `make test-c` diffs the two outputs.
 *
 * Usage: scenario FILE */
#include "common.h"

#define MAX_ROUTES 256

static kvroute_router *router;
static kvroute_ticket tickets[MAX_ROUTES];
static int routed[MAX_ROUTES];
static size_t n_routes;

static kvroute_pod_id pod_by_name(const char *name) {
  kvroute_pod_id id = 0;
  CHECK_STATUS(kvroute_router_pod_id(router, (const uint8_t *)name, strlen(name), &id), KVROUTE_STATUS_OK);
  return id;
}

static void print_decision(size_t n, const kvroute_decision *d) {
  char explain[1024];
  size_t len = 0;
  CHECK_STATUS(kvroute_router_explain(router, d->ticket, (uint8_t *)explain, sizeof explain, &len), KVROUTE_STATUS_OK);
  CHECK(strlen(explain) == len);
  printf("route #%zu ticket=%llu pod=%u reason=%s match=%u blocks=%u/%u imbalance=%d | %s\n", n,
         (unsigned long long)d->ticket, d->pod, kvroute_reason_str(d->reason), d->match_percent, d->matched_blocks,
         d->total_blocks, d->imbalance ? 1 : 0, explain);
}

static void route(int chat, unsigned long long now, const char *model, const char *strategy, unsigned long long family,
                  unsigned long long q) {
  CHECK(n_routes < MAX_ROUTES);
  size_t n = n_routes++;
  const uint8_t *strat = NULL;
  size_t strat_len = 0;
  if (strcmp(strategy, "-") != 0) {
    strat = (const uint8_t *)strategy;
    strat_len = strlen(strategy);
  }
  char question[128];
  question_text(q, question, sizeof question);
  char *system = study_text(family, chat);
  kvroute_decision d;
  kvroute_status st;
  if (!chat) {
    size_t len = strlen(system) + strlen(question);
    char *prompt = malloc(len + 1);
    CHECK(prompt != NULL);
    strcpy(prompt, system);
    strcat(prompt, question);
    /* The prompt is borrowed for the call only: freed right after. */
    st = kvroute_router_route(router, (const uint8_t *)model, strlen(model), (const uint8_t *)prompt, len, strat,
                              strat_len, now, &d);
    free(prompt);
  } else {
    size_t cap = strlen(system) + strlen(question) + 256;
    char *body = malloc(cap);
    CHECK(body != NULL);
    int len = snprintf(body, cap,
                       "{\"model\":\"study\",\"stream\":true,\"messages\":[{\"role\":\"system\",\"content\":\"%s\"},"
                       "{\"role\":\"user\",\"content\":\"%s\"}]}",
                       system, question);
    /* Model (NULL, 0): taken from the body. */
    st = kvroute_router_route_json(router, NULL, 0, (const uint8_t *)body, (size_t)len, strat, strat_len, now, &d);
    free(body);
  }
  free(system);
  if (st == KVROUTE_STATUS_OK) {
    tickets[n] = d.ticket;
    routed[n] = 1;
    print_decision(n, &d);
  } else {
    printf("route #%zu %s\n", n, kvroute_status_str(st));
  }
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s FILE\n", argv[0]);
    return 2;
  }
  FILE *f = fopen(argv[1], "r");
  if (!f) {
    perror(argv[1]);
    return 2;
  }
  char line[512];
  int configured = 0;
  while (fgets(line, sizeof line, f)) {
    char cmd[32], a[128], b[128];
    unsigned long long x = 0, y = 0, z = 0;
    if (line[0] == '#' || sscanf(line, "%31s", cmd) != 1) {
      continue;
    }
    if (!configured) {
      unsigned long long seed;
      CHECK(sscanf(line, "config %llu %127s", &seed, a) == 2);
      kvroute_config_builder *builder = kvroute_config_builder_new();
      CHECK(builder != NULL);
      CHECK_STATUS(kvroute_config_builder_set_seed(builder, seed), KVROUTE_STATUS_OK);
      CHECK_STATUS(kvroute_config_builder_set_strategy(builder, (const uint8_t *)a, strlen(a)), KVROUTE_STATUS_OK);
      const kvroute_config *config = NULL;
      CHECK_STATUS(kvroute_config_builder_build(builder, &config), KVROUTE_STATUS_OK);
      CHECK_STATUS(kvroute_router_new(config, &router), KVROUTE_STATUS_OK);
      kvroute_config_free(config);
      configured = 1;
    } else if (strcmp(cmd, "pod") == 0) {
      char d[128];
      int ready;
      CHECK(sscanf(line, "pod %127s %127s %127s %d", a, b, d, &ready) == 4);
      kvroute_pod_id id;
      kvroute_status st = kvroute_router_add_pod(router, (const uint8_t *)a, strlen(a), (const uint8_t *)b, strlen(b),
                                                 (const uint8_t *)d, strlen(d), ready != 0, &id);
      if (st == KVROUTE_STATUS_OK) {
        printf("pod %s -> %u\n", b, id);
      } else {
        printf("pod %s %s\n", b, kvroute_status_str(st));
      }
    } else if (strcmp(cmd, "ready") == 0) {
      int ready;
      CHECK(sscanf(line, "ready %127s %d", a, &ready) == 2);
      CHECK_STATUS(kvroute_router_set_pod_ready(router, pod_by_name(a), ready != 0), KVROUTE_STATUS_OK);
      printf("ready %s %d\n", a, ready);
    } else if (strcmp(cmd, "remove") == 0) {
      CHECK(sscanf(line, "remove %127s", a) == 1);
      CHECK_STATUS(kvroute_router_remove_pod(router, pod_by_name(a)), KVROUTE_STATUS_OK);
      printf("remove %s\n", a);
    } else if (strcmp(cmd, "route") == 0) {
      CHECK(sscanf(line, "route %llu %127s %127s %llu %llu", &x, a, b, &y, &z) == 5);
      route(0, x, a, b, y, z);
    } else if (strcmp(cmd, "chat") == 0) {
      CHECK(sscanf(line, "chat %llu %127s %llu %llu", &x, b, &y, &z) == 4);
      route(1, x, "study", b, y, z);
    } else if (strcmp(cmd, "complete") == 0 || strcmp(cmd, "ticket") == 0) {
      unsigned outcome;
      CHECK(sscanf(line, "%*s %llu %llu %u", &x, &y, &outcome) == 3);
      kvroute_ticket t = y;
      if (cmd[0] == 'c') {
        CHECK(y < n_routes && routed[y]);
        t = tickets[y];
      }
      uint32_t event = KVROUTE_HEALTH_EVENT_NONE;
      kvroute_status st = kvroute_router_complete_with_event(router, t, outcome, NULL, x, &event);
      if (event != KVROUTE_HEALTH_EVENT_NONE) {
        printf("%s %llu %s health=%s\n", cmd, y, kvroute_status_str(st), kvroute_health_event_str(event));
      } else {
        printf("%s %llu %s\n", cmd, y, kvroute_status_str(st));
      }
    } else if (strcmp(cmd, "tick") == 0) {
      CHECK(sscanf(line, "tick %llu", &x) == 1);
      CHECK_STATUS(kvroute_router_tick(router, x), KVROUTE_STATUS_OK);
      bool has = true;
      uint64_t at = 1;
      CHECK_STATUS(kvroute_router_next_deadline(router, &has, &at), KVROUTE_STATUS_OK);
      if (has) {
        printf("tick %llu deadline=%llu\n", x, (unsigned long long)at);
      } else {
        CHECK(at == 0);
        printf("tick %llu deadline=none\n", x);
      }
    } else if (strcmp(cmd, "done") == 0) {
      unsigned long long first, total;
      unsigned out, cached, prompt;
      CHECK(sscanf(line, "done %llu %llu %llu %llu %u %u %u", &x, &y, &first, &total, &out, &cached, &prompt) == 7);
      CHECK(y < n_routes && routed[y]);
      kvroute_timings t = {
          .first_token_ms = first,
          .total_ms = total,
          .output_tokens = out,
          .cached_tokens = cached,
          .prompt_tokens = prompt,
          .known = KVROUTE_TIMING_FIRST_TOKEN_MS | KVROUTE_TIMING_TOTAL_MS | KVROUTE_TIMING_OUTPUT_TOKENS |
                   KVROUTE_TIMING_CACHED_TOKENS | KVROUTE_TIMING_PROMPT_TOKENS,
      };
      kvroute_status st = kvroute_router_complete_with_timings(router, tickets[y], KVROUTE_OUTCOME_SUCCESS, &t, x);
      printf("done %llu %s\n", y, kvroute_status_str(st));
    } else if (strcmp(cmd, "engine") == 0) {
      unsigned running, waiting, kv;
      CHECK(sscanf(line, "engine %llu %127s %u %u %u", &x, a, &running, &waiting, &kv) == 5);
      kvroute_engine_snapshot e = {
          .running = running, .waiting = waiting, .kv_usage = kv / 100.0, .known = KVROUTE_ENGINE_KV_USAGE};
      CHECK_STATUS(kvroute_router_observe_engine(router, pod_by_name(a), &e, x), KVROUTE_STATUS_OK);
      printf("engine %s\n", a);
    } else if (strcmp(cmd, "capacity") == 0) {
      unsigned n;
      CHECK(sscanf(line, "capacity %127s %u", a, &n) == 2);
      CHECK_STATUS(kvroute_router_set_pod_capacity(router, pod_by_name(a), n), KVROUTE_STATUS_OK);
      printf("capacity %s %u\n", a, n);
    } else if (strcmp(cmd, "check") == 0) {
      int passed;
      CHECK(sscanf(line, "check %llu %127s %d", &x, a, &passed) == 3);
      uint32_t event = 77;
      CHECK_STATUS(kvroute_router_report_health_check(router, pod_by_name(a), passed != 0, x, &event),
                   KVROUTE_STATUS_OK);
      printf("check %s %d %s\n", a, passed, kvroute_health_event_str(event));
    } else if (strcmp(cmd, "health") == 0) {
      CHECK(sscanf(line, "health %127s", a) == 1);
      kvroute_pod_info info;
      CHECK_STATUS(kvroute_router_pod_info(router, pod_by_name(a), &info), KVROUTE_STATUS_OK);
      printf("health %s ejected=%d probing=%d until=%llu checks_failing=%d ejections=%llu/%llu\n", a,
             info.ejected ? 1 : 0, info.probing ? 1 : 0, (unsigned long long)info.ejected_until_ms,
             info.checks_failing ? 1 : 0, (unsigned long long)info.ejections_5xx,
             (unsigned long long)info.ejections_gateway);
    } else {
      fprintf(stderr, "unknown command %s\n", cmd);
      return 2;
    }
  }
  fclose(f);
  CHECK(configured);
  kvroute_stats s;
  CHECK_STATUS(kvroute_router_stats(router, &s), KVROUTE_STATUS_OK);
  printf("stats pods=%llu ready=%llu models=%llu in_flight=%llu open=%llu issued=%llu ok=%llu cancelled=%llu "
         "failed=%llu connect_failed=%llu reset=%llu timeout=%llu expired=%llu orphaned=%llu rejected=%llu "
         "blocks=%llu unknown_model=%llu no_ready=%llu imbalance=%llu reasons=[",
         (unsigned long long)s.pods, (unsigned long long)s.ready_pods, (unsigned long long)s.models,
         (unsigned long long)s.in_flight, (unsigned long long)s.tickets_open, (unsigned long long)s.tickets_issued,
         (unsigned long long)s.completed_success, (unsigned long long)s.completed_cancelled,
         (unsigned long long)s.completed_failed, (unsigned long long)s.completed_connect_failed,
         (unsigned long long)s.completed_reset, (unsigned long long)s.completed_timeout,
         (unsigned long long)s.tickets_expired,
         (unsigned long long)s.tickets_orphaned, (unsigned long long)s.tickets_rejected,
         (unsigned long long)s.index_blocks, (unsigned long long)s.unknown_model, (unsigned long long)s.no_ready_pod,
         (unsigned long long)s.imbalance_events);
  /* One count per reason, KVROUTE_REASON_RANDOM .. KVROUTE_REASON_SESSION_AFFINITY. */
  for (int i = 0; i <= KVROUTE_REASON_SESSION_AFFINITY; i++) {
    printf("%s%llu", i ? ", " : "", (unsigned long long)s.routed_by_reason[i]);
  }
  printf("] buckets=[");
  for (int i = 0; i < 5; i++) {
    printf("%s%llu", i ? ", " : "", (unsigned long long)s.decisions_by_match_bucket[i]);
  }
  printf("]\n");
  kvroute_router_free(router);
  return 0;
}
