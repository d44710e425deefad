#!/usr/bin/env bash
# Builds the kvroute-ext-proc image without Docker and without pulling a base image: the same
# image as ./Dockerfile (FROM scratch: a static binary, the CA bundle, user 65532), assembled
# with umoci from a local build. Linux, x86_64 verified (any host cargo can build statically for
# should do).
#
#   deploy/build-image.sh [--tag NAME:TAG] [--smoke]
#
# Needs: cargo (static glibc: Debian's libc6-dev has it), umoci (Debian: apt-get install umoci);
# optional: skopeo (also writes a docker-archive, for `docker load`, and checks both archives),
# runc + python3 + curl + root (for --smoke).
#
# Writes, under target/image/:
#   oci/                       the OCI image layout (tag = the image tag's TAG part)
#   kvroute-ext-proc-oci.tar   the same as an OCI archive (`skopeo copy
#                              oci-archive:target/image/kvroute-ext-proc-oci.tar:TAG docker://...`
#                              pushes it to a registry)
#   kvroute-ext-proc-docker.tar (with skopeo) a docker-archive tagged NAME:TAG: `docker load -i`,
#                              `podman load -i`, `kind load image-archive`
# --smoke then runs the image with runc as the Deployment does (user 65532, read-only root, no
# capabilities, the configuration mounted at /etc/kvroute) and checks /healthz, /readyz,
# /metrics and a clean stop on SIGTERM.
set -euo pipefail

tag="kvroute-ext-proc:dev"
smoke=0
while [ $# -gt 0 ]; do
    case "$1" in
        --tag) tag="$2"; shift 2 ;;
        --smoke) smoke=1; shift ;;
        -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
        *) echo "build-image.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
case "$tag" in
    *:*) ;;
    *) echo "build-image.sh: --tag wants NAME:TAG" >&2; exit 2 ;;
esac
ref="${tag##*:}"

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
command -v umoci > /dev/null || {
    echo "build-image.sh: umoci not found (Debian/Ubuntu: apt-get install umoci)" >&2
    exit 1
}
target_dir="${CARGO_TARGET_DIR:-$root/target}"
out="$target_dir/image"

# 1. The static binary (the Dockerfile's build stage).
triple="$(rustc -vV | sed -n 's/^host: //p')"
RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --release --locked -p kvroute-ext-proc --target "$triple"
bin="$target_dir/$triple/release/kvroute-ext-proc"
if command -v file > /dev/null && ! file "$bin" | grep -q 'static'; then
    echo "build-image.sh: $bin is not statically linked: $(file -b "$bin")" >&2
    exit 1
fi

# 2. The image's root file system: the binary (debug info stripped) and the CA bundle.
rm -rf "$out"
mkdir -p "$out/rootfs/etc/ssl/certs"
objcopy --strip-debug "$bin" "$out/rootfs/kvroute-ext-proc"
chmod 0755 "$out/rootfs/kvroute-ext-proc"
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    cp /etc/ssl/certs/ca-certificates.crt "$out/rootfs/etc/ssl/certs/ca-certificates.crt"
else
    echo "build-image.sh: no /etc/ssl/certs/ca-certificates.crt here; image without a CA bundle" >&2
fi
chmod -R go-w,a+rX "$out/rootfs"
"$out/rootfs/kvroute-ext-proc" --help > /dev/null

# 3. The OCI image: one layer, the Dockerfile's USER, ENV, EXPOSE, LABEL and ENTRYPOINT.
case "$(uname -m)" in
    x86_64) arch=amd64 ;;
    aarch64) arch=arm64 ;;
    *) arch="$(uname -m)" ;;
esac
umoci init --layout "$out/oci"
umoci new --image "$out/oci:$ref"
umoci insert --image "$out/oci:$ref" "$out/rootfs" /
umoci config --image "$out/oci:$ref" \
    --os linux --architecture "$arch" \
    --config.user 65532:65532 \
    --config.env KVROUTE_CONFIG=/etc/kvroute/kvroute.toml \
    --config.exposedports 50052/tcp --config.exposedports 9464/tcp \
    --config.label org.opencontainers.image.title=kvroute-ext-proc \
    --config.label org.opencontainers.image.licenses=Apache-2.0 \
    --config.entrypoint /kvroute-ext-proc
umoci gc --layout "$out/oci"
# An OCI archive is the layout, tarred.
tar -C "$out/oci" -cf "$out/kvroute-ext-proc-oci.tar" .
if command -v skopeo > /dev/null; then
    skopeo --insecure-policy copy -q "oci:$out/oci:$ref" "docker-archive:$out/kvroute-ext-proc-docker.tar:$tag"
    # Both archives read back as images with our configuration.
    for a in "oci-archive:$out/kvroute-ext-proc-oci.tar:$ref" "docker-archive:$out/kvroute-ext-proc-docker.tar"; do
        skopeo inspect --config "$a" | grep -q '"User": "65532:65532"' \
            || { echo "build-image.sh: $a does not read back as the image" >&2; exit 1; }
    done
fi
echo "image $tag:"
ls -l "$out"/*.tar

[ "$smoke" = 1 ] || exit 0

# 4. --smoke: run the image as the Deployment runs it.
for t in runc python3 curl; do
    command -v "$t" > /dev/null || { echo "build-image.sh --smoke: $t not found" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "build-image.sh --smoke: runs runc, needs root" >&2; exit 1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
grpc_port="$(free_port)"
admin_port="$(free_port)"
bundle="$out/smoke/bundle"
rm -rf "$out/smoke"
mkdir -p "$out/smoke/config"
umoci unpack --image "$out/oci:$ref" "$bundle" > /dev/null
# A static configuration (no cluster here): one pod that is never reached.
cat > "$out/smoke/config/kvroute.toml" <<EOF
[listen]
grpc = "127.0.0.1:$grpc_port"
admin = "127.0.0.1:$admin_port"
[engine_metrics]
scrape_interval_ms = 0
[health]
check_interval_ms = 0
[models.smoke]
pods = [{ name = "smoke-0", address = "127.0.0.1:9" }]
EOF
chmod -R a+rX "$out/smoke/config"
python3 - "$bundle/config.json" "$out/smoke/config" <<'EOF'
import json, sys
path, config = sys.argv[1:]
c = json.load(open(path))
p = c["process"]
p["terminal"] = False
p["args"] = ["/kvroute-ext-proc", "--config", "/etc/kvroute/kvroute.toml"]
p["capabilities"] = {k: [] for k in ("bounding", "effective", "inheritable", "permitted", "ambient")}
p["noNewPrivileges"] = True
c["root"]["readonly"] = True
c["mounts"].append({"destination": "/etc/kvroute", "type": "bind", "source": config,
                    "options": ["rbind", "ro"]})
# The host's network namespace, so that the probes below reach it.
c["linux"]["namespaces"] = [n for n in c["linux"]["namespaces"] if n["type"] != "network"]
json.dump(c, open(path, "w"))
EOF
user="$(python3 -c 'import json,sys; u=json.load(open(sys.argv[1]))["process"]["user"]; print(u["uid"], u["gid"])' "$bundle/config.json")"
[ "$user" = "65532 65532" ] || { echo "smoke: image user is $user, want 65532 65532" >&2; exit 1; }
id="kvroute-smoke-$$"
runc run --bundle "$bundle" "$id" > "$out/smoke/log" 2>&1 &
runc_pid=$!
cleanup() { runc kill "$id" KILL 2> /dev/null || true; wait "$runc_pid" 2> /dev/null || true; runc delete -f "$id" 2> /dev/null || true; }
trap cleanup EXIT
ok=0
for _ in $(seq 1 50); do
    if curl -fsS "http://127.0.0.1:$admin_port/readyz" > /dev/null 2>&1; then ok=1; break; fi
    sleep 0.1
done
[ "$ok" = 1 ] || { echo "smoke: /readyz never answered 200"; cat "$out/smoke/log"; exit 1; }
curl -fsS "http://127.0.0.1:$admin_port/healthz" > /dev/null
curl -fsS "http://127.0.0.1:$admin_port/metrics" | grep -q '^kvroute_' \
    || { echo "smoke: /metrics has no kvroute_ series"; exit 1; }
runc kill "$id" TERM
wait "$runc_pid" || true
grep -q 'stopped' "$out/smoke/log" || { echo "smoke: no clean stop after SIGTERM"; cat "$out/smoke/log"; exit 1; }
trap - EXIT
runc delete -f "$id" 2> /dev/null || true
echo "smoke: the image ran as 65532 with a read-only root and no capabilities; /healthz, /readyz and /metrics answered; SIGTERM stopped it"
