#!/usr/bin/env bash
# make demo: two kvroute-sim replicas behind a real Envoy that asks kvroute-ext-proc where to
# send each request; kvroute-sim replay sends the study's hot50 scenario with the strategies
# prefix-cache, least-request and kvroute's least-ttft and prints where every request went and
# why (the reason is read from the x-kvroute-decision response header). least-ttft is told the
# engines' facts only (block size, sequences) and, since the replicas run SPEEDUP times faster
# than the engine they model, its tie band scaled to match (300 ms of engine time); its rates are
# learned from the replicas' /metrics, scraped every 500 ms. Everything stops on exit.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${KVROUTE_BIN_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}/release}
ENVOY=${ENVOY_BIN:-$ROOT/.venv/bin/envoy}
SPEEDUP=${SPEEDUP:-2}
REQUESTS=${REQUESTS:-96}
for b in "$BIN/kvroute-ext-proc" "$BIN/kvroute-sim" "$ENVOY"; do
    [ -x "$b" ] || { echo "missing $b (run: make demo)" >&2; exit 1; }
done
source "$ROOT/scripts/stack.sh"

start_sim replica-a "$SPEEDUP"; A=$SIM_ADDR
start_sim replica-b "$SPEEDUP"; B=$SIM_ADDR
cat > "$WORK/kvroute.toml" <<TOML
[listen]
grpc = "127.0.0.1:0"
admin = "127.0.0.1:0"
[routing]
default_strategy = "prefix-cache"
[ttft]
engine_block_tokens = 1568
max_seqs = 8
tie_ms = $(awk -v s="$SPEEDUP" 'BEGIN { print 300 / s }')
[engine_metrics]
scrape_interval_ms = 500
[models.study]
pods = [{ name = "replica-a", address = "$A" }, { name = "replica-b", address = "$B" }]
TOML
start_ext_proc "$WORK/kvroute.toml" --log warn
"$BIN/kvroute-ext-proc" --config "$WORK/kvroute.toml" --grpc-listen "$EXT_GRPC" \
    envoy-config --listen 127.0.0.1:0 --admin 127.0.0.1:0 > "$WORK/envoy.yaml"
start_envoy "$WORK/envoy.yaml" envoy

echo "replicas: replica-a=$A replica-b=$B (speed-up $SPEEDUP)"
echo "kvroute-ext-proc: grpc=$EXT_GRPC admin=http://$EXT_ADMIN/metrics"
echo "envoy: http://$ENVOY_LISTEN (admin $ENVOY_ADMIN)"
echo
# In the background and waited for, so that a SIGTERM to this script stops everything at once
# (bash runs its trap only between foreground commands); the cleanup stops it too (a background
# job of a script ignores Ctrl-C's SIGINT).
"$BIN/kvroute-sim" replay --url "http://$ENVOY_LISTEN" --scenario hot50 \
    --strategy prefix-cache --strategy least-request --strategy least-ttft --requests "$REQUESTS" --speedup "$SPEEDUP" \
    --direct "http://$A" "http://$B" &
PIDS+=($!)
wait $!
echo
echo "kvroute-ext-proc counters after the run:"
curl -s "http://$EXT_ADMIN/metrics" | grep -E '^(kvroute_pod_in_flight|kvroute_pod_routed_total|kvroute_tickets_completed_total|aibrix_prefix_cache_routing_selection_total|aibrix_prefix_cache_load_imbalance_total|kvroute_ttft_)'
