# kvroute: the README's two commands.
#   make demo   build everything and run the main job locally
#   make test   install what is missing and run every test
#
# Each part of the project adds its own targets in mk/*.mk:
#   TEST_TARGETS += test-xyz    (run by `make test`, after the Rust tests)
#   DEMO_TARGET  := demo-xyz    (the most complete demo available; later files win)

SHELL := /bin/bash
CARGO ?= cargo
ROOT := $(abspath .)
VENV := $(ROOT)/.venv
TEST_TARGETS :=
DEMO_TARGET := demo-core
# What the test targets after `test-rust` run the tests of kvroute-ext-proc and kvroute-sim with
# (adding `--test NAME`; kvroute-envoy's are run with `-p kvroute-envoy -p kvroute-sim`). These
# two packages selected together resolve every dependency with the features `cargo test
# --workspace` does (sim/Cargo.toml, "Feature unification"), so the commands reuse its build;
# either alone resolves tokio, axum, hyper, ... with fewer features and rebuilds them and
# everything above them (minutes of `make test` on 2 cores).
CARGO_TEST := $(CARGO) test -p kvroute-ext-proc -p kvroute-sim

-include $(sort $(wildcard mk/*.mk))

.PHONY: test demo test-rust fmt-check lint lint-core doc-core demo-core image
test: fmt-check lint-core doc-core test-rust $(TEST_TARGETS)
	@echo "make test: all test suites passed"

fmt-check:
	$(CARGO) fmt --all -- --check

# Clippy with -D warnings (and router-core's no-IO lists). Run before every commit; the whole
# workspace is not part of `make test`, whose 15-minute budget on 2 cores it would break.
lint: fmt-check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# router-core's no-IO contract (router-core/clippy.toml: no clocks, threads, files, sockets,
# env, OS randomness), checked by `make test` too: the core and its few dependencies only.
lint-core:
	cd router-core && $(CARGO) clippy -p kvroute-core --lib -- -D warnings

# The core's API docs, as the README sends Rust users to them (`cargo doc -p kvroute-core
# --open`): broken intra-doc links and other rustdoc warnings fail the test.
doc-core:
	RUSTDOCFLAGS=-Dwarnings $(CARGO) doc -q -p kvroute-core --no-deps

test-rust:
	$(CARGO) test --workspace

demo: $(DEMO_TARGET)

# The core alone: routes the study's prompt families through prefix-cache and least-request
# and prints where each request went and why.
demo-core:
	$(CARGO) run --release -q -p kvroute-core --example study_prompts

# The kvroute-ext-proc container image (OCI and docker-archive tarballs under target/image/),
# assembled from a static binary with Debian's umoci and skopeo: no base image is pulled.
# Not part of `make test` (minutes, and it needs root for runc's smoke run). See deploy/README.md.
image:
	bash deploy/build-image.sh --smoke
