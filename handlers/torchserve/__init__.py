"""TorchServe's own parts, apart from the model code: the adapter TorchServe calls (torchserve_handler.py, the
archive's entry point), the worker's message reader (worker_protocol), a lane's time limit per batch (lane_timeout)
and the metric lines TorchServe's frontend parses (metrics). The core (handlers/core.py) and the tasks never import
them: they serve the same answers in process, in a batch job or on Ray."""
