# The serving image (docs/container.md): TorchServe 0.12 on Java 17, the serving layer of the pinned requirements
# (requirements-serving.txt: no tools, no tests), both models' archives as `make archive` built and the tests checked
# them outside the image (copied in with their recorded sha256, checked again at every start), a non-root user,
# TorchServe in the foreground under tini. Build it after `make archive`.
#   docker build -t unified-serve .
#   docker run --gpus all -p 127.0.0.1:8080:8080 -v unified-serve-keys:/keys unified-serve
# BASE must bring python3.11 (with venv) and apt. PyPI's torch==2.13.0 for Linux x86_64 is the CUDA build
# and brings the CUDA runtime as nvidia-* wheels, so the default slim Python base serves on a GPU (the host
# needs the NVIDIA driver and container toolkit). `make image-test` builds from a local Debian base instead,
# with the CPU wheel.
ARG BASE=python:3.11-slim-bookworm

# Java 17 for TorchServe's frontend as a runtime of only the modules it uses (jlink: 51 MB against the Debian
# JRE's 184 MB plus its dependencies). The modules: `jdeps --print-module-deps` over model-server.jar's classes
# (docs/container.md says how), plus jdk.crypto.ec (TLS), jdk.management (the JVM's metrics) and jdk.jfr with
# jdk.jcmd (Flight Recorder: `jcmd <pid> JFR.start`, docs/benchmarks.md). Pinned to the release series: Debian's
# archive keeps only the newest point release, so an exact version would stop building.
FROM ${BASE} AS java
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jdk-headless=17.* binutils=2.* \
    && jlink --output /opt/java --strip-debug --no-man-pages --no-header-files --compress=2 --add-modules \
       java.base,java.compiler,java.desktop,java.management.rmi,java.naming,java.prefs,java.scripting,java.sql,jdk.sctp,jdk.unsupported,jdk.crypto.ec,jdk.management,jdk.jfr,jdk.jcmd

FROM ${BASE}
# tini as PID 1, make for the venv's recipe, wrk for the warm-up before readiness (the frontend's JIT wants some
# 50,000 requests, which only a load generator sends in seconds: docs/container.md, "Warm-up"; with LuaJIT ~0.7 MB),
# nginx for the front door clients meet (docs/front-door.md) (their release series pinned, as above); Java from the
# stage above.
# (policy-rc.d: a package's scripts start no service during the build.)
RUN printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d \
    && apt-get update \
    && apt-get install -y --no-install-recommends tini=0.19.* make=4.* wrk=4.1.* nginx=1.22.* \
    && rm /usr/sbin/policy-rc.d \
    && rm -rf /var/lib/apt/lists/* /usr/share/man/*
COPY --from=java /opt/java /opt/java
ENV JAVA_HOME=/opt/java

# The server runs as this user; /srv (code, venv, archives) stays root's and read-only to it. It may write
# only the key volume (key_file.json) and its logs.
RUN useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin torchserve \
    && mkdir -p /keys /var/log/torchserve \
    && chown torchserve:torchserve /keys /var/log/torchserve

WORKDIR /srv
ENV PIP_NO_CACHE_DIR=1
# The serving layer from its hash-checked lock (locks/, `make lock`), installed by the Makefile's own recipe (a
# layer of its own: kept while the lock is unchanged). SERVING_LOCK: PyPI's CUDA build of torch by default;
# `make image-test` takes the CPU lock. torch's C++ tests, headers and test binaries (test/, include/, bin/ but
# torch_shm_manager, which `import torch` checks for: ~195 MB) serve nothing: AOTInductor archives are compiled
# where they are built. Nor do pip, setuptools and wheel once the venv is made (22 MB; TorchServe installs no
# per-model packages: install_py_dep_per_model=false). pip's bytecode goes too (169 MB): scripts.container.precompile
# writes back only what serving imports, below.
ARG SERVING_LOCK=locks/serving-cuda.txt
COPY Makefile ./
COPY locks/pip.txt locks/serving-cuda.txt locks/serving-cpu.txt locks/serving-nodeps.txt locks/
RUN make venv-serving PYTHON=python3.11 SERVING_LOCK=${SERVING_LOCK} \
    && rm -rf .venv/lib/python3.11/site-packages/torch/test .venv/lib/python3.11/site-packages/torch/include \
    && find .venv/lib/python3.11/site-packages/torch/bin -type f ! -name torch_shm_manager -delete \
    && .venv/bin/python -m pip uninstall --yes --quiet setuptools wheel pip \
    && find .venv -name __pycache__ -type d -prune -exec rm -rf {} +

# Only what serving needs (tests/unit/test_layers.py checks it): the handler, the archive reader, the server's
# config, process and warm-up (with its wrk driver), the container's commands, TorchServe's config files. No model build code, no tools
# (clients, jobs, swap, deploy, verify, bench, hardening, image_check, gpu).
COPY config.properties ./
COPY monitoring/metrics.yaml monitoring/log4j2.xml monitoring/
COPY handlers/ handlers/
COPY scripts/__init__.py scripts/errors.py scripts/layout.py scripts/cli.py scripts/
COPY scripts/wrk/ scripts/wrk/
COPY scripts/archive/ scripts/archive/
COPY scripts/server/ scripts/server/
COPY scripts/container/ scripts/container/
# The models' folders as far as serving reads them (.dockerignore keeps their build code out): the registry, each
# model's model.yaml, model-config.yaml and samples.json (the warm-up and the health check send its samples).
COPY models/ models/
# Every model's tested default archive and its recorded sha256 (.dockerignore keeps versions and variants out; the
# entry point checks them before TorchServe starts; a model store mounted over /srv/model_store is checked the same
# way). No training or export here.
COPY model_store/ model_store/
# The container's config.properties, rendered from the repository's; then the bytecode of what serving imports.
RUN .venv/bin/python -m scripts.container.config && .venv/bin/python -m scripts.container.precompile

ENV PATH=/srv/.venv/bin:/opt/java/bin:$PATH \
    LOG_LOCATION=/var/log/torchserve \
    METRICS_LOCATION=/var/log/torchserve
VOLUME ["/keys"]
USER 10001:10001
# The front door's inference, management, metrics, gRPC inference, gRPC management (config.properties; the
# FRONT_DOOR_*_ADDRESS variables move them, TS_* TorchServe's own on loopback behind it)
EXPOSE 8080 8081 8082 7070 7071
# /ping, every lane with a READY worker and warmed by the entry point; renews a key that has expired
# (docs/container.md, "Health").
HEALTHCHECK --interval=15s --timeout=10s --start-period=180s --retries=3 \
    CMD ["/srv/.venv/bin/python", "-m", "scripts.container.healthcheck", "--ready"]
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["/srv/.venv/bin/python", "-m", "scripts.container.entrypoint", \
     "--ts-config", "/srv/config.container.properties", "--key-dir", "/keys"]
