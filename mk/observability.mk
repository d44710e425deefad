# Observability: the Grafana dashboard and Prometheus rules in deploy/observability.
#   make test-observability   promtool check + unit tests of the rules, then a real Prometheus
#                             scraping a live stack (ext-proc/tests/observability.rs): every
#                             dashboard query must return data, every rule must evaluate
#
# promtool and prometheus come from Debian's prometheus package (2.42 on bookworm), installed if
# missing, as test-go installs Go.

OBS_DIR := $(ROOT)/deploy/observability
PROMETHEUS_BIN ?= $(shell command -v prometheus 2>/dev/null || echo /usr/bin/prometheus)

.PHONY: prometheus test-observability
TEST_TARGETS += test-observability

prometheus:
	(command -v promtool && command -v prometheus) >/dev/null || (apt-get update && apt-get install -y prometheus)

test-observability: $(ENVOY_BIN) prometheus
	promtool --version 2>&1 | head -n 1
	promtool check rules $(OBS_DIR)/kvroute-rules.yaml
	cd $(OBS_DIR) && promtool test rules kvroute-rules.test.yaml
	promtool check config $(OBS_DIR)/prometheus.example.yml
	python3 -m json.tool $(OBS_DIR)/kvroute-dashboard.json >/dev/null
	$(CARGO) build -q -p kvroute-ext-proc -p kvroute-sim
	# A real Prometheus against kvroute-ext-proc, two kvroute-sim replicas and Envoy (about 20 s).
	ENVOY_BIN=$(ENVOY_BIN) PROMETHEUS_BIN=$(PROMETHEUS_BIN) $(CARGO_TEST) --test observability -- --ignored --nocapture
