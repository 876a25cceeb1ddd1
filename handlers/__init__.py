"""Code that goes into every .mar: a pure inference core, per-model tasks and a thin TorchServe adapter."""
