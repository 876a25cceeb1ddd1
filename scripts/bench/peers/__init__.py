"""The systems the stream lane is compared with: a no-op TorchServe handler, Flask + gunicorn, LitServe."""
