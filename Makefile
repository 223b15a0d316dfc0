.PHONY: run test bench lint

# Install and run the broker on 127.0.0.1:9092 (pass flags with ARGS="--port 9093 ...").
run:
	scripts/run $(ARGS)

# Install everything (real clients included) and run the whole test suite.
test:
	scripts/test $(ARGS)

lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy protocol coordinator/groups
