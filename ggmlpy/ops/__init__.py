"""The op builders, grouped by what they compute. Each checks its operands (``base``) before ggml is called."""
