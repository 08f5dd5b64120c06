"""ggml-backend.h's objects: registries, devices, backends, buffers, data transfer, RPC."""
