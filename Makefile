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

-include $(sort $(wildcard mk/*.mk))

.PHONY: test demo test-rust lint demo-core
test: lint test-rust $(TEST_TARGETS)
	@echo "make test: all test suites passed"

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

test-rust:
	$(CARGO) test --workspace

demo: $(DEMO_TARGET)

# The core alone: routes the study's prompt families through prefix-cache and least-request
# and prints where each request went and why.
demo-core:
	$(CARGO) run --release -q -p kvroute-core --example study_prompts
