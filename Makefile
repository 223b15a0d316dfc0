.PHONY: run test bench lint

# Install and run the broker on 127.0.0.1:9092 (pass flags with ARGS="--port 9093 ...").
run:
	scripts/run $(ARGS)

# Install everything (real clients included) and run the whole test suite.
test:
	scripts/test $(ARGS)

lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy protocol coordinator/groups

# The long frame-fuzzing run (docs/reliability.md, "Fuzzing"): FUZZ_FRAMES mutated frames
# (default 1,000,000) against a broker, a Stable group and a probe; the JSON report goes to
# build/fuzz-report.json and triaged findings to build/fuzz-findings/.  More: ARGS="--help".
.PHONY: fuzz
fuzz:
	scripts/setup --test
	mkdir -p build
	nice .venv/bin/python -m tests.fuzz.engine --frames $${FUZZ_FRAMES:-1000000} \
		--report build/fuzz-report.json --save-dir build/fuzz-findings $(ARGS)
