"""ggml-opt.h: optimizer parameters, opt contexts, losses, results, datasets and ggml's own fit loops."""
