# CUDA serving image. PyPI's torch==2.13.0 wheel for Linux x86_64 is the CUDA build and brings the CUDA
# runtime as nvidia-* wheels, so a slim Python base is enough; the host needs the NVIDIA driver and
# container toolkit (`docker run --gpus all ...`).
#   docker build -t unified-serve .
#   docker run --gpus all -p 8080-8082:8080-8082 -p 7070-7071:7070-7071 unified-serve
FROM python:3.11-slim-bookworm

RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless make \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /srv
COPY requirements.txt Makefile ./
RUN make venv PYTHON=python3.11

COPY . .
RUN make archive \
    # Inside the container's own network namespace the ports must listen on all interfaces to be published.
    && sed 's/127\.0\.0\.1/0.0.0.0/' config.properties > config.container.properties

EXPOSE 8080 8081 8082 7070 7071
# Foreground so the container lives as long as TorchServe; key_file.json is written to /srv.
CMD [".venv/bin/torchserve", "--start", "--foreground", "--ncs", "--ts-config", "config.container.properties", "--model-store", "model_store"]
