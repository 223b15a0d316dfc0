.PHONY: run test bench lint

# Install and run the broker on 127.0.0.1:9092 (pass flags with ARGS="--port 9093 ...").
run:
	scripts/run $(ARGS)

# Install everything (real clients included) and run the whole test suite.
test:
	scripts/test $(ARGS)

lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy protocol coordinator/groups

# Crash safety, long run: >= 50 SIGKILLs during a commit storm of real clients (docs/reliability.md,
# "Crash safety"). CRASH_KILLS=N sets the count, RALLYPOINT_CRASH_SEED=S replays a run; the figures
# are written to build/crash.json.
CRASH_KILLS ?= 60
crash:
	mkdir -p build
	RALLYPOINT_CRASH_KILLS=$(CRASH_KILLS) RALLYPOINT_CRASH_JSON=build/crash.json \
		.venv/bin/python -m pytest -q -s -p no:cacheprovider -o timeout=3600 tests/crash/test_kill9.py::test_kill9_commit_storm
.PHONY: crash
