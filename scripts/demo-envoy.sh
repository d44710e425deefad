#!/usr/bin/env bash
# make demo: two kvroute-sim replicas behind a real Envoy that asks kvroute-ext-proc where to
# send each request; kvroute-sim replay sends the study's hot50 scenario with the strategies
# prefix-cache, least-request and kvroute's least-ttft and prints where every request went and
# why (the reason is read from the x-kvroute-decision response header). least-ttft is told the
# engines' facts only (block size, sequences) and, since the replicas run SPEEDUP times faster
# than the engine they model, its tie band scaled to match (300 ms of engine time); its rates are
# learned from the replicas' /metrics, scraped every 500 ms. Everything stops on exit.
#
# With --module (make demo DEMO_ARGS=--module), kvroute runs inside Envoy instead: the dynamic
# module libkvroute_envoy.so (envoy-module/), the same configuration, no kvroute-ext-proc
# process; kvroute's admin listener is then served from Envoy's process.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${KVROUTE_BIN_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}/release}
ENVOY=${ENVOY_BIN:-$ROOT/.venv/bin/envoy}
SPEEDUP=${SPEEDUP:-2}
REQUESTS=${REQUESTS:-96}
MODE=ext-proc
for arg in "$@"; do
    case $arg in
        --module) MODE=module ;;
        *) echo "usage: $0 [--module]" >&2; exit 2 ;;
    esac
done
NEEDED=("$BIN/kvroute-ext-proc" "$BIN/kvroute-sim" "$ENVOY")
[ "$MODE" = module ] && NEEDED+=("$BIN/libkvroute_envoy.so")
for b in "${NEEDED[@]}"; do
    [ -e "$b" ] || { echo "missing $b (run: make demo)" >&2; exit 1; }
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
if [ "$MODE" = module ]; then
    # The rendering names the TOML file by path: the module reads it (and reloads it) itself.
    "$BIN/kvroute-ext-proc" --config "$WORK/kvroute.toml" \
        envoy-module-config --listen 127.0.0.1:0 --admin 127.0.0.1:0 > "$WORK/envoy.yaml"
    export ENVOY_DYNAMIC_MODULES_SEARCH_PATH=$BIN KVROUTE_LOG=warn,kvroute_envoy=info
    start_envoy "$WORK/envoy.yaml" envoy
    EXT_ADMIN=$(wait_line "$WORK/envoy.err" "kvroute module serving" | sed 's/.*admin=\([^ ]*\).*/\1/')
    ROUTER="kvroute (module in Envoy)"
else
    start_ext_proc "$WORK/kvroute.toml" --log warn
    "$BIN/kvroute-ext-proc" --config "$WORK/kvroute.toml" --grpc-listen "$EXT_GRPC" \
        envoy-config --listen 127.0.0.1:0 --admin 127.0.0.1:0 > "$WORK/envoy.yaml"
    start_envoy "$WORK/envoy.yaml" envoy
    ROUTER=kvroute-ext-proc
fi

echo "replicas: replica-a=$A replica-b=$B (speed-up $SPEEDUP)"
if [ "$MODE" = module ]; then
    echo "kvroute inside Envoy: admin=http://$EXT_ADMIN/metrics"
else
    echo "kvroute-ext-proc: grpc=$EXT_GRPC admin=http://$EXT_ADMIN/metrics"
fi
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
echo "$ROUTER counters after the run:"
curl -s "http://$EXT_ADMIN/metrics" | grep -E '^(kvroute_pod_in_flight|kvroute_pod_routed_total|kvroute_tickets_completed_total|aibrix_prefix_cache_routing_selection_total|aibrix_prefix_cache_load_imbalance_total|kvroute_ttft_)'
