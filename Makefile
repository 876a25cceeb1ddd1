# Entry points (README.md): make serve | stop | archive | test | lint | client | grpc-client | swap | rollback
#                           | batch-job | broker | stream | verify | bench | bench-beside | bench-sweep | fuzz | soak | gpu-check | image-test | clean
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
# Dependencies: requirements*.txt name the direct pins by layer; locks/ holds what pip installs, every package
# pinned with its sha256 (`make lock` writes them with uv; pip installs them with --require-hashes). CPU locks take
# torch's CPU wheel (here from /opt/wheels; elsewhere TORCH_CPU_WHEELS=https://download.pytorch.org/whl/cpu/torch);
# the image's default serving lock is PyPI's CUDA build (docs/architecture.md, "Layers").
TOOLS_LOCK := locks/tools-cpu.txt
SERVING_LOCK ?= locks/serving-cpu.txt
NODEPS_LOCK := locks/serving-nodeps.txt
PIP_LOCK := locks/pip.txt
# The classifier's reference loads torchvision's transforms from here, outside the venv's import path
# (requirements-reference.txt says why).
REFERENCE_LOCK := locks/reference.txt
REFERENCE_DIR := $(VENV)/reference
STAMP := $(VENV)/.installed-$(shell cat $(PIP_LOCK) $(TOOLS_LOCK) $(NODEPS_LOCK) $(REFERENCE_LOCK) 2>/dev/null | sha1sum | cut -c1-12)
SERVING_STAMP := $(VENV)/.installed-serving-$(shell cat $(PIP_LOCK) $(SERVING_LOCK) $(NODEPS_LOCK) 2>/dev/null | sha1sum | cut -c1-12)
HASHED := --quiet --require-hashes
# A venv made from an older lock keeps the deprecated pynvml shim (nvidia-ml-py provides the module): it warns on
# every `import torch`, so it goes.
DROP_STALE := $(PY) -m pip uninstall --quiet --quiet --yes pynvml
HANDLER_SOURCES := $(shell find handlers -name '*.py')
# The models: one folder each, models/<name>/model.yaml (models/registry.py, docs/models.md); nothing here names one.
MODELS := $(patsubst models/%/model.yaml,%,$(wildcard models/*/model.yaml))
model_sources = $(wildcard models/$(1)/*.py models/$(1)/*.yaml models/$(1)/*.json) models/registry.py models/export_formats.py
GRPC_STUBS := $(addprefix scripts/clients/grpc_stubs/,inference_pb2.py inference_pb2_grpc.py management_pb2.py management_pb2_grpc.py)

# Variables a user sets on the command line (examples next to each target below).
VERSION ?= 1.0
MODEL ?= $(firstword $(MODELS))
LANE ?= $(MODEL)
# empty: the lane's model's first sample (models/<name>/samples.json)
FILE ?=
MAR ?=
BATCH_MODEL ?= $(MODEL)
EXAMPLE_ROWS ?= 1000
BATCH_EXAMPLE := build/batch/$(BATCH_MODEL)-example.jsonl
BATCH_INPUT ?= $(BATCH_EXAMPLE)
BATCH_OUTPUT ?= build/batch/$(BATCH_MODEL)-example.predictions.jsonl
BATCH_ARGS ?= --overwrite
BROKERS ?= 127.0.0.1:19092
TOPIC ?= $(MODEL).requests
STREAM_ARGS ?=

.PHONY: venv venv-serving lock grpc-stubs archive serve stop lint format test test-unit test-integration client grpc-client \
	swap rollback batch-job broker stream verify bench bench-beside bench-quick bench-sweep fuzz soak gpu-bundle gpu-check-bundle gpu-serving-bundle gpu-device-prep gpu-check image-test test-slow clean

# --- environment: two layers, one command each -------------------------------------------------------
# venv: serving + tools and tests (requirements.txt, which includes requirements-serving.txt): every target here.
# venv-serving: the serving layer alone (the image: the handler, TorchServe and scripts/container's commands).
venv: $(STAMP)
$(STAMP): $(PIP_LOCK) $(TOOLS_LOCK) $(NODEPS_LOCK) $(REFERENCE_LOCK)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install $(HASHED) -r $(PIP_LOCK)
	$(PY) -m pip install $(HASHED) -r $(TOOLS_LOCK)
	$(PY) -m pip install $(HASHED) --no-deps -r $(NODEPS_LOCK)
	$(PY) -m pip install $(HASHED) --no-deps --upgrade --target $(REFERENCE_DIR) -r $(REFERENCE_LOCK)
	$(DROP_STALE)
	@rm -f $(VENV)/.installed-* && touch $@
venv-serving: $(SERVING_STAMP)
$(SERVING_STAMP): $(PIP_LOCK) $(SERVING_LOCK) $(NODEPS_LOCK)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install $(HASHED) -r $(PIP_LOCK)
	$(PY) -m pip install $(HASHED) -r $(SERVING_LOCK)
	$(PY) -m pip install $(HASHED) --no-deps -r $(NODEPS_LOCK)
	$(DROP_STALE)
	@rm -f $(VENV)/.installed-* && touch $@

# lock: after changing a requirements*.txt, rewrite locks/ (uv resolves for Linux x86_64, Python 3.11; the CUDA
# serving lock from PyPI alone). Commit the requirements and the locks together.
TORCH_CPU_WHEELS ?= /opt/wheels
LOCK_FOR := --python-version 3.11 --python-platform x86_64-manylinux_2_28 --generate-hashes --native-tls --quiet \
	--custom-compile-command "make lock"
lock: venv
	$(VENV)/bin/uv pip compile requirements.txt $(LOCK_FOR) --find-links $(TORCH_CPU_WHEELS) -o $(TOOLS_LOCK)
	$(VENV)/bin/uv pip compile requirements-serving.txt $(LOCK_FOR) --find-links $(TORCH_CPU_WHEELS) -o locks/serving-cpu.txt
	$(VENV)/bin/uv pip compile requirements-serving.txt $(LOCK_FOR) -o locks/serving-cuda.txt
	$(VENV)/bin/uv pip compile requirements-serving-nodeps.txt $(LOCK_FOR) --no-deps -o $(NODEPS_LOCK)
	$(VENV)/bin/uv pip compile requirements-reference.txt $(LOCK_FOR) --no-deps -o $(REFERENCE_LOCK)
	$(VENV)/bin/uv pip compile requirements-peer-pytriton.txt $(subst manylinux_2_28,manylinux_2_35,$(LOCK_FOR)) \
		-o locks/peer-pytriton.txt

# gRPC stubs are generated from the installed TorchServe's model-server.jar, never committed.
grpc-stubs: $(GRPC_STUBS)
$(GRPC_STUBS) &: $(STAMP) scripts/clients/stubs.py
	$(PY) -m scripts.clients.stubs

# --- archives: `make archive` builds every model's default archive (model_store/<model>.mar); VERSION=2.0 adds
# <model>-2.0.mar for each model of ARCHIVE_MODELS (default: all of them). `make archive FORMAT=onnx [PRECISION=int8]`
# builds instead model_store/<model>-onnx.mar (-int8 when PRECISION is given): FORMAT is export | torchscript | aoti | onnx.
FORMAT ?=
PRECISION ?=
ARCHIVE_MODELS ?= $(MODELS)
VERSION_SUFFIX := $(if $(filter-out 1.0,$(VERSION)),-$(VERSION))
ifeq ($(FORMAT)$(PRECISION),)
ARCHIVES := $(foreach m,$(MODELS),model_store/$(m).mar)
ifneq ($(VERSION),1.0)
ARCHIVES += $(foreach m,$(ARCHIVE_MODELS),model_store/$(m)-$(VERSION).mar)
endif
else
VARIANT := $(if $(FORMAT),-$(FORMAT))$(if $(PRECISION),-$(PRECISION))
VARIANT_ARGS := $(if $(FORMAT),--format $(FORMAT)) $(if $(PRECISION),--precision $(PRECISION))
ARCHIVES := $(foreach m,$(ARCHIVE_MODELS),model_store/$(m)$(VERSION_SUFFIX)$(VARIANT).mar)
define VARIANT_RULE
model_store/$(1)$(VERSION_SUFFIX)$(VARIANT).mar model_store/$(1)$(VERSION_SUFFIX)$(VARIANT).mar.sha256 &: $$(STAMP) $$(HANDLER_SOURCES) $(call model_sources,$(1))
	$$(PY) -m scripts.archive.build --model $(1) --version $(VERSION) $(VARIANT_ARGS)
endef
$(foreach m,$(ARCHIVE_MODELS),$(eval $(call VARIANT_RULE,$(m))))
endif
# Each archive's sha256 is recorded next to it (<archive>.sha256) by the same build; registering checks it. With the
# default archives, what follows from the folders is written again: config.properties' lanes, then the pod's config
# and gateway (which read the archives' limits); a test fails where a commit left them stale.
archive: $(ARCHIVES) $(addsuffix .sha256,$(ARCHIVES)) grpc-stubs
ifeq ($(FORMAT)$(PRECISION),)
	$(PY) -m models.registry properties --write config.properties
	$(PY) -m models.registry alerts --write monitoring/alerts.yml
	$(PY) -m scripts.deploy.memory --write
	$(PY) -m scripts.deploy.render k8s
endif

define MODEL_RULES
model_store/$(1).mar model_store/$(1).mar.sha256 &: $$(STAMP) $$(HANDLER_SOURCES) $(call model_sources,$(1))
	$$(PY) -m scripts.archive.build --model $(1) --version 1.0
model_store/$(1)-%.mar model_store/$(1)-%.mar.sha256: $$(STAMP) $$(HANDLER_SOURCES) $(call model_sources,$(1))
	$$(PY) -m scripts.archive.build --model $(1) --version $$*
endef
$(foreach m,$(MODELS),$(eval $(call MODEL_RULES,$(m))))

# --- system packages: declared once in system-packages.sh (serve | test | ci); as root on Debian it installs
# what is missing, otherwise it stops at once with the one command to run.
system-packages-%:
	./system-packages.sh $*

# --- serving: TorchServe from the repository root with config.properties -----------------------------
serve: system-packages-serve archive
	$(PY) -m scripts.server.serve start
stop: $(STAMP)
	$(PY) -m scripts.server.serve stop

# --- checks: lint, tests (the hot-swap tests swap every model 1.0 -> 2.0 -> 1.0, so they need <model>-2.0.mar) ---
SWAP_ARCHIVES := $(foreach m,$(MODELS),model_store/$(m)-2.0.mar model_store/$(m)-2.0.mar.sha256)
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
format: $(STAMP)
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

test: system-packages-test lint archive $(SWAP_ARCHIVES)
	$(PY) -m pytest
# test-slow (CI, after make test): the tests marked slow, AOTInductor compiles and bf16/int8 minilm on the CPU, and
# the per-model tests of every model but the first (swap under load, the pod's gates; tests/model_params.py).
test-slow: archive $(SWAP_ARCHIVES)
	$(PY) -m pytest -m 'slow and not gpu'
test-unit: $(STAMP) grpc-stubs
	$(PY) -m pytest tests/unit
test-integration: archive $(SWAP_ARCHIVES)
	$(PY) -m pytest tests/integration
# gpu-check, for a machine with CUDA (docs/gpu.md): stops at once, with status 2 and the reason, where CUDA is not
# available. Else: the CUDA check over the bundle (agreement with the CPU per format and precision, out-of-memory
# survived per loader, rows/s by batch size; build/gpu-check/gpu-check.{md,json}), the tests marked gpu, then the
# quick stream benchmark on CUDA in fp32 and bf16 autocast (a TorchServe lane: needs Java), for every model. About 8
# minutes for digits and minilm (unmeasured with the classifier).
# gpu-bundle: both bundles a GPU machine without Java or network needs (docs/gpu.md).
# gpu-check-bundle: what the check reads (each model's plain weights, inputs, this machine's CPU answers, as its
# folder's portable.py says), small enough to carry to a GPU machine that has only torch (build/gpu-bundle, ~40 MiB).
# gpu-serving-bundle: TorchServe's frontend on a jlinked Java runtime, its slim jar, the ts package and wrk, with
# start.sh (build/gpu-serving/torchserve, packed as torchserve.tar.xz, ~27 MiB).
gpu-bundle: gpu-check-bundle gpu-serving-bundle
gpu-check-bundle: archive
	$(PY) -m scripts.gpu.bundle
gpu-serving-bundle: $(STAMP)
	$(PY) -m scripts.gpu.serving_bundle
# gpu-device-prep: build/gpu-device, what the prepared device calls carry: common/ (the serving bundle packed, noop.mar,
# orjson's wheel, the models' pure-Python packages) and one folder per model; on the GPU machine, carrying common/
# and <model>/: sh scripts/gpu/device_call.sh <model>.
gpu-device-prep: archive
	$(PY) -m scripts.gpu.device_prep
gpu-check: $(STAMP)
	$(PY) -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "make gpu-check needs CUDA: torch.cuda.is_available() is False on this machine (torch " + torch.__version__ + "); run it where an NVIDIA GPU and a CUDA build of torch are")'
	$(MAKE) gpu-bundle
	@mkdir -p build/gpu-check
	set -o pipefail; $(PY) -m scripts.gpu.check 2>&1 | tee build/gpu-check/check.txt
	set -o pipefail; $(PY) -m pytest -m gpu -v -s 2>&1 | tee build/gpu-check/tests.txt
	set -o pipefail; $(PY) -m scripts.bench.stream --quick --no-report 2>&1 | tee build/gpu-check/stream.txt
	set -o pipefail; $(PY) -m scripts.bench.stream --quick --no-report --precision bf16 2>&1 | tee -a build/gpu-check/stream.txt

# --- clients ------------------------------------------------------------------------------------------
# make client [LANE=<model>[-bulk]] [FILE=photo.jpg | FILE=instances.json] (no FILE: the model's first sample)
client: $(STAMP)
	$(PY) -m scripts.clients.rest --model $(LANE) $(FILE)
# make grpc-client [LANE=...] [FILE=...]
grpc-client: grpc-stubs
	$(PY) -m scripts.clients.grpc_client --model $(LANE) $(FILE)

# --- hot-swap, any model: make swap MODEL=minilm MAR=model_store/minilm-2.0.mar ; make rollback MODEL=minilm ----
swap: grpc-stubs
	@test -n "$(MAR)" || { echo "usage: make swap MODEL=<$(subst $(eval) ,|,$(MODELS))> MAR=model_store/<model>-2.0.mar (build it: make archive VERSION=2.0)" >&2; exit 2; }
	$(PY) -m scripts.swap.hot_swap swap --model $(MODEL) --mar $(MAR)
rollback: grpc-stubs
	$(PY) -m scripts.swap.hot_swap rollback --model $(MODEL)

# --- batch jobs: an example job (the model's samples cycled to EXAMPLE_ROWS rows) through its bulk lane of a
# running `make serve`. make batch-job [BATCH_MODEL=...] BATCH_INPUT=rows.parquet BATCH_OUTPUT=out.parquet
# BATCH_ARGS="--in-process --resume"
$(BATCH_EXAMPLE): | $(STAMP)
	$(PY) -m scripts.jobs.example --model $(BATCH_MODEL) --rows $(EXAMPLE_ROWS) --output $@
batch-job: model_store/$(BATCH_MODEL).mar $(filter $(BATCH_EXAMPLE),$(BATCH_INPUT))
	$(PY) -m scripts.jobs.batch_job --model $(BATCH_MODEL) --input $(BATCH_INPUT) --output $(BATCH_OUTPUT) $(BATCH_ARGS)

# --- streams (docs/streams.md): a local Kafka-compatible broker, and the consumer feeding the stream lane ------
# make broker (keeps running; Ctrl-C stops it) ; make stream [MODEL=<model> TOPIC=<model>.requests STREAM_ARGS=--in-process]
broker: $(STAMP)
	$(PY) -m scripts.streams.tansu --port $(lastword $(subst :, ,$(BROKERS)))
stream: model_store/$(MODEL).mar
	$(PY) -m scripts.streams.consume --model $(MODEL) --brokers $(BROKERS) --input-topic $(TOPIC) $(STREAM_ARGS)

# --- verify and bench: each starts its own TorchServe on free ports (not `make serve`'s) ---------------
# verify: each model's samples through stream, bulk and in-process, default then deterministic mode.
verify: $(foreach m,$(MODELS),model_store/$(m).mar)
	$(PY) -m scripts.verify.agreement
# bench: the stream lanes against a no-op floor, batchSize 1 and the field (Flask, LitServe, Ray Serve, BentoML,
# PyTriton, each with the settings its sweep kept) under wrk and k6, then 1M-row batch jobs through the bulk lane
# and in-process against the pipeline ceiling, then each stream lane beside a full-speed batch job (scripts/bench/beside.py);
# writes docs/benchmarks.md and docs/bench/*.png. bench-quick: the
# same with short runs and fewer points on the first model (digits), no report. bench-sweep: each peer's candidate settings, briefly
# (PEERS="flask ray" for some; build/bench/sweep-<peer>.json and docs/benchmarks.md's "Peers' sweeps").
PEERS ?= flask litserve ray bentoml pytriton
bench: archive
	@command -v wrk >/dev/null || { echo "make bench needs wrk: apt-get install wrk" >&2; exit 2; }
	$(PY) -m scripts.bench.stream
	$(PY) -m scripts.bench.front_door
	$(PY) -m scripts.bench.batch
	$(PY) -m scripts.bench.bulk
	$(PY) -m scripts.bench.beside
# bench-beside: only the section "Live traffic beside a batch job" (docs/priority.md), short runs (BESIDE_ARGS= for full).
BESIDE_ARGS ?= --quick
bench-beside: archive
	@command -v wrk >/dev/null || { echo "make bench-beside needs wrk: apt-get install wrk" >&2; exit 2; }
	$(PY) -m scripts.bench.beside $(BESIDE_ARGS)
bench-quick: archive
	@command -v wrk >/dev/null || { echo "make bench-quick needs wrk: apt-get install wrk" >&2; exit 2; }
	$(PY) -m scripts.bench.stream --quick --models $(firstword $(MODELS)) --no-report
bench-sweep: archive
	@command -v wrk >/dev/null || { echo "make bench-sweep needs wrk: apt-get install wrk" >&2; exit 2; }
	$(PY) -m scripts.bench.sweep --peer $(PEERS)

# --- hardening (docs/hardening.md): each starts its own TorchServe on free ports, as verify and bench do ----
# fuzz: schemathesis on the four prediction lanes from TorchServe's own OpenAPI description (repaired), about
# 4 minutes; fails on a 5xx, a worker restart or a lane that answers differently after. Report: build/fuzz.json.
# soak: 10 minutes of stream traffic (wrk) on every model plus batch jobs on every bulk lane; fails when
# a worker's or the frontend's RSS or open fds grow past the stated bounds. Report: build/soak.json.
fuzz: archive
	$(PY) -m scripts.hardening.fuzz
soak: archive
	$(PY) -m scripts.hardening.soak --minutes 10

# --- the serving image (docs/container.md) ---------------------------------------------------------------
# image-test (CI, after make test): builds the Dockerfile with podman from a Debian base made here by mmdebstrap
# (cached in build/container/), runs it as its non-root user on free ports, classifies a PNG and embeds a sentence
# through it, then stops it with SIGTERM. Needs root, podman, runc and mmdebstrap (.ci/run installs them).
image-test: $(STAMP)
	$(PY) -m scripts.image_check.image_test

clean:
	rm -rf build model_store/*.mar model_store/*.mar.sha256 logs key_file.json
