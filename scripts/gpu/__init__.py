"""The CUDA check (`make gpu-check`): a bundle built here, a check that needs only torch where it runs (docs/gpu.md)."""
