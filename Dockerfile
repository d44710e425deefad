# kvroute-ext-proc as a container image: a static binary on an empty base, run as a non-root
# user. See deploy/README.md ("The image"); deploy/build-image.sh assembles the same image
# without Docker (and without pulling a base image) from a local build.
#
#   docker build -t kvroute-ext-proc:dev .
#
# Stage 1: build. glibc's static libraries come with the Debian image, so the binary needs no
# shared library at run time (crt-static; no musl toolchain needed). The build is for the
# builder's own architecture.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
ENV RUSTFLAGS="-C target-feature=+crt-static" \
    CARGO_TERM_COLOR=never
RUN target="$(rustc -vV | sed -n 's/^host: //p')" \
 && cargo build --release --locked -p kvroute-ext-proc --target "$target" \
 && objcopy --strip-debug "target/$target/release/kvroute-ext-proc" /kvroute-ext-proc \
 && /kvroute-ext-proc --help > /dev/null

# Stage 2: run. Nothing but the binary and the CA bundle: in a cluster, the API server's CA
# comes from the service account mount, so the bundle only matters for an api_server whose
# certificate a public CA signed. No shell: probes are HTTP, preStop is the kubelet's sleep.
FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /kvroute-ext-proc /kvroute-ext-proc
# distroless's "nonroot" user; numeric, so that runAsNonRoot can check it.
USER 65532:65532
ENV KVROUTE_CONFIG=/etc/kvroute/kvroute.toml
# 50052: ext_proc + gRPC health. 9464: admin HTTP (/metrics, /healthz, /readyz).
EXPOSE 50052 9464
LABEL org.opencontainers.image.title="kvroute-ext-proc" \
      org.opencontainers.image.licenses="Apache-2.0"
ENTRYPOINT ["/kvroute-ext-proc"]
