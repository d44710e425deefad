# kvroute-sim: the simulator's fidelity and least-ttft tests (the study's facts) are ignored in
# plain debug `cargo test` runs; here they run in the dev profile, which optimises the simulator
# and the core (root Cargo.toml), so no release build of every dependency is needed. Only the
# ignored ones: the others ran in `make test-rust`.
.PHONY: test-sim study-sim
TEST_TARGETS += test-sim

test-sim:
	$(CARGO_TEST) --test fidelity --test least_ttft -- --ignored

# Prints the simulated study table for both rounds and writes plots and records to target/sim-study.
study-sim:
	$(CARGO) run --release -q -p kvroute-sim -- study --out target/sim-study
