"""What runs a model: compiling it, the runtime that owns its C objects, fitting, predicting, its metrics
and the optimizer's state."""
