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
FROM ${BASE}

# Java 17 for TorchServe's frontend, tini as PID 1, make for the venv's recipe. Pinned to their release series:
# Debian's archive keeps only the newest point release, so an exact version would stop building.
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless=17.* tini=0.19.* make=4.* \
    && rm -rf /var/lib/apt/lists/*

# The server runs as this user; /srv (code, venv, archives) stays root's and read-only to it. It may write
# only the key volume (key_file.json) and its logs.
RUN useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin torchserve \
    && mkdir -p /keys /var/log/torchserve \
    && chown torchserve:torchserve /keys /var/log/torchserve

WORKDIR /srv
ENV PIP_NO_CACHE_DIR=1
# The serving layer, installed by the Makefile's own recipe (a layer of its own: kept while it is unchanged).
# torch's C++ tests, headers and test binaries (test/, include/, bin/ but torch_shm_manager, which `import torch`
# checks for: ~195 MB) serve nothing: AOTInductor archives are compiled where they are built.
COPY requirements-serving.txt requirements-serving-nodeps.txt Makefile ./
RUN make venv-serving PYTHON=python3.11 \
    && rm -rf .venv/lib/python3.11/site-packages/torch/test .venv/lib/python3.11/site-packages/torch/include \
    && find .venv/lib/python3.11/site-packages/torch/bin -type f ! -name torch_shm_manager -delete

# Only what serving needs (tests/unit/test_layers.py checks it): the handler, the archive reader, the server's
# config and process, the container's commands, TorchServe's config files. No model build code, no tools
# (clients, jobs, swap, deploy, verify, bench, hardening, image_check, gpu).
COPY config.properties ./
COPY monitoring/metrics.yaml monitoring/log4j2.xml monitoring/
COPY handlers/ handlers/
COPY scripts/__init__.py scripts/errors.py scripts/layout.py scripts/cli.py scripts/
COPY scripts/archive/ scripts/archive/
COPY scripts/server/ scripts/server/
COPY scripts/container/ scripts/container/
# The tested archives and their recorded sha256 (the entry point checks them before TorchServe starts; a
# model store mounted over /srv/model_store is checked the same way). No training or export here.
COPY model_store/digits.mar model_store/digits.mar.sha256 model_store/minilm.mar model_store/minilm.mar.sha256 model_store/
# The container's config.properties, rendered from the repository's.
RUN .venv/bin/python -m scripts.container.config

ENV PATH=/srv/.venv/bin:$PATH \
    LOG_LOCATION=/var/log/torchserve \
    METRICS_LOCATION=/var/log/torchserve
VOLUME ["/keys"]
USER 10001:10001
# inference, management, metrics, gRPC inference, gRPC management (config.properties; TS_* variables move them)
EXPOSE 8080 8081 8082 7070 7071
# /ping and every lane with a READY worker; renews a key that has expired (docs/container.md, "Health").
HEALTHCHECK --interval=15s --timeout=10s --start-period=180s --retries=3 \
    CMD ["/srv/.venv/bin/python", "-m", "scripts.container.healthcheck", "--ready"]
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["/srv/.venv/bin/python", "-m", "scripts.container.entrypoint", \
     "--ts-config", "/srv/config.container.properties", "--key-dir", "/keys"]
