# Shared by scripts/demo-envoy.sh: start kvroute-sim replicas, kvroute-ext-proc and Envoy on
# 127.0.0.1 with ports chosen at run time, and stop them all on exit. Source it; needs
# ROOT, BIN (directory with kvroute-ext-proc and kvroute-sim) and ENVOY.

WORK=$(mktemp -d "${TMPDIR:-/tmp}/kvroute-stack.XXXXXX")
PIDS=()

stack_cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do
        for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap stack_cleanup EXIT
trap 'exit 130' INT TERM

# wait_line FILE PATTERN: waits (30 s at most) for PATTERN in FILE, prints the matching line.
wait_line() {
    local i
    for i in $(seq 1 300); do
        if grep -q "$2" "$1" 2>/dev/null; then grep -m1 "$2" "$1"; return 0; fi
        sleep 0.1
    done
    echo "timed out waiting for '$2' in $1" >&2
    cat "${1%.out}.err" >&2 2>/dev/null || true
    return 1
}

# start_sim NAME SPEEDUP: sets SIM_ADDR.
start_sim() {
    "$BIN/kvroute-sim" serve --host 127.0.0.1 --port 0 --name "$1" --model study --speedup "$2" \
        > "$WORK/$1.out" 2> "$WORK/$1.err" < /dev/null &
    PIDS+=($!)
    SIM_ADDR=$(wait_line "$WORK/$1.out" "listening on" | sed 's/^listening on //')
}

# start_ext_proc CONFIG [FLAGS...]: sets EXT_GRPC and EXT_ADMIN.
start_ext_proc() {
    local config=$1; shift
    "$BIN/kvroute-ext-proc" --config "$config" "$@" > "$WORK/ext-proc.out" 2> "$WORK/ext-proc.err" < /dev/null &
    PIDS+=($!)
    local line
    line=$(wait_line "$WORK/ext-proc.out" "listening grpc=")
    EXT_GRPC=$(sed 's/.*grpc=\([^ ]*\).*/\1/' <<< "$line")
    EXT_ADMIN=$(sed 's/.*admin=\([^ ]*\).*/\1/' <<< "$line")
}

# start_envoy YAML NAME: sets ENVOY_LISTEN and ENVOY_ADMIN.
start_envoy() {
    local yaml=$1 name=$2
    "$ENVOY" -c "$yaml" --admin-address-path "$WORK/$name.admin" --base-id $(( ($$ % 5000) * 4 + ${#PIDS[@]} )) \
        --concurrency 1 -l warning > "$WORK/$name.out" 2> "$WORK/$name.err" < /dev/null &
    PIDS+=($!)
    local i
    for i in $(seq 1 300); do [ -s "$WORK/$name.admin" ] && break; sleep 0.1; done
    ENVOY_ADMIN=$(cat "$WORK/$name.admin")
    for i in $(seq 1 300); do curl -sf "http://$ENVOY_ADMIN/ready" > /dev/null && break; sleep 0.1; done
    ENVOY_LISTEN=127.0.0.1:$(curl -s "http://$ENVOY_ADMIN/listeners?format=json" | python3 -c \
        'import json,sys; print(json.load(sys.stdin)["listener_statuses"][0]["local_address"]["socket_address"]["port_value"])')
}
