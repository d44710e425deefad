#!/usr/bin/env bash
# make overload-envoy: admission under saturation through a real Envoy. Two kvroute-sim
# replicas (SPEEDUP times faster than the engine they model), kvroute-ext-proc with least-ttft,
# and the study's cold scenario sent at LOAD times the study's rate by kvroute-sim replay: once
# without admission, once with `[admission.models.study]` (target: the study's 2 s SLO TTFT in
# engine time, requests held at most that long). Prints replay's summary of each run (within
# SLO, TTFT P95, 429s) and kvroute's admission counters, and checks in-flight is 0 at the end.
# Bounded: REQUESTS per run; everything stops on exit. Not part of `make test` (about a minute).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${KVROUTE_BIN_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}/release}
ENVOY=${ENVOY_BIN:-$ROOT/.venv/bin/envoy}
SPEEDUP=${SPEEDUP:-2}
REQUESTS=${REQUESTS:-96}
LOAD=${LOAD:-2}
for b in "$BIN/kvroute-ext-proc" "$BIN/kvroute-sim" "$ENVOY"; do
    [ -e "$b" ] || { echo "missing $b (run: make overload-envoy)" >&2; exit 1; }
done
source "$ROOT/scripts/stack.sh"

start_sim replica-a "$SPEEDUP"; A=$SIM_ADDR
start_sim replica-b "$SPEEDUP"; B=$SIM_ADDR
RATE=$(awk -v l="$LOAD" 'BEGIN { print 1.6 * l }')
# Real milliseconds of the study's 2 s.
TARGET=$(awk -v s="$SPEEDUP" 'BEGIN { printf "%d", 2000 / s }')

run() { # run NAME ADMISSION_TOML
    local name=$1 admission=$2
    cat > "$WORK/$name.toml" <<TOML
[listen]
grpc = "127.0.0.1:0"
admin = "127.0.0.1:0"
[routing]
default_strategy = "least-ttft"
[ttft]
engine_block_tokens = 1568
max_seqs = 8
tie_ms = $(awk -v s="$SPEEDUP" 'BEGIN { print 300 / s }')
[engine_metrics]
scrape_interval_ms = 250
[models.study]
pods = [{ name = "replica-a", address = "$A" }, { name = "replica-b", address = "$B" }]
$admission
TOML
    start_ext_proc "$WORK/$name.toml" --log warn
    "$BIN/kvroute-ext-proc" --config "$WORK/$name.toml" --grpc-listen "$EXT_GRPC" \
        envoy-config --listen 127.0.0.1:0 --admin 127.0.0.1:0 > "$WORK/$name.yaml"
    start_envoy "$WORK/$name.yaml" "envoy-$name"
    echo "== $name: cold at ${LOAD}x the study's rate ($RATE/s), $REQUESTS requests, least-ttft =="
    "$BIN/kvroute-sim" replay --url "http://$ENVOY_LISTEN" --scenario cold --rate "$RATE" \
        --arrivals poisson --strategy least-ttft --requests "$REQUESTS" --speedup "$SPEEDUP" \
        --direct "http://$A" "http://$B" --quiet &
    PIDS+=($!)
    wait $!
    local metrics
    metrics=$(curl -s "http://$EXT_ADMIN/metrics")
    grep -E '^kvroute_admission_requests_total' <<< "$metrics" || true
    local in_flight
    in_flight=$(grep -E '^kvroute_pod_in_flight' <<< "$metrics" | awk '{ s += $2 } END { print s + 0 }')
    echo "in flight after the run: $in_flight"
    [ "$in_flight" = 0 ] || { echo "in-flight is not 0" >&2; exit 1; }
    echo
}

run routing ""
run admission "[admission.models.study]
ttft_target_ms = $TARGET
queue_timeout_ms = $TARGET"
