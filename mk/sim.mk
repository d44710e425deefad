# kvroute-sim: the simulator's fidelity tests (the study's facts) run in release mode, where
# the whole two-round study takes a few seconds; debug-mode `cargo test` skips them.
.PHONY: test-sim study-sim
TEST_TARGETS += test-sim

test-sim:
	$(CARGO) test --release -p kvroute-sim -- --include-ignored

# Prints the simulated study table for both rounds and writes plots and records to target/sim-study.
study-sim:
	$(CARGO) run --release -q -p kvroute-sim -- study --out target/sim-study
