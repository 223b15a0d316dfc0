.PHONY: run setup check test bench readme lint

# Install and run the broker on 127.0.0.1:9092 (pass flags with ARGS="--port 9093 ...").
run:
	scripts/run $(ARGS)

# Install everything the tests use (real clients included) into .venv; cheap when done already.
setup:
	scripts/setup --test

# The fast inner loop, under a minute: ruff, format check, mypy (strict), and the unit and
# raw-wire tests in two parallel workers (the marker expression is in scripts/check; override
# with CHECK_MARKERS=..., CHECK_WORKERS=N); ARGS go to pytest.
check:
	scripts/check $(ARGS)

# Install everything and run the whole test suite (what CI runs: .ci/run); ARGS go to pytest.
test:
	scripts/test $(ARGS)

# Run every benchmark and rewrite docs/BENCHMARKS.md (ARGS="--quick", ARGS="--only startup ...").
bench: setup
	.venv/bin/python -m bench $(ARGS)

# Regenerate the README's config table from the settings table (coordinator/config.py).
readme:
	scripts/update-readme

lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && scripts/typecheck

# Suites with their own targets (fuzzing, crash safety, ...) mark their tests with a marker
# of their own (registered in pyproject.toml) and stay out of make check's marker expression.

# Crash safety, long run: >= 50 SIGKILLs during a commit storm of real clients (docs/reliability.md,
# "Crash safety"). CRASH_KILLS=N sets the count, RALLYPOINT_CRASH_SEED=S replays a run; the figures
# are written to build/crash.json.
CRASH_KILLS ?= 60
crash:
	mkdir -p build
	RALLYPOINT_CRASH_KILLS=$(CRASH_KILLS) RALLYPOINT_CRASH_JSON=build/crash.json \
		.venv/bin/python -m pytest -q -s -p no:cacheprovider -o timeout=3600 tests/crash/test_kill9.py::test_kill9_commit_storm
.PHONY: crash

# The long frame-fuzzing run (docs/reliability.md, "Fuzzing"): FUZZ_FRAMES mutated frames
# (default 1,000,000) against a broker, a Stable group and a probe; the JSON report goes to
# build/fuzz-report.json and triaged findings to build/fuzz-findings/.  More: ARGS="--help".
.PHONY: fuzz
fuzz: setup
	mkdir -p build
	nice .venv/bin/python -m tests.fuzz.engine --frames $${FUZZ_FRAMES:-1000000} \
		--report build/fuzz-report.json --save-dir build/fuzz-findings $(ARGS)
