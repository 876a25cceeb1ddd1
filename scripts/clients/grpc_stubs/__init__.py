"""TorchServe's gRPC stubs, generated from its model-server.jar by `make grpc-stubs` (not committed)."""
