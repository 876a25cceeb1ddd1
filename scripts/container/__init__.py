"""The serving image (Dockerfile, docs/container.md): its config.properties, entry point and health check,
and `make image-test`, which builds the image with podman from a local base and checks it end to end."""
