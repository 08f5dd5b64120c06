"""ggmlR's dynamic autograd engine (``ag_*``): eager PyTorch-style code recorded lazily, each step computed as one ggml
graph on the tensors' device (``docs/guide/autograd.md``).

Lowest first: ``device`` (the devices, their backends, the tensors the engine owns there), ``lazy`` (a set of lazy
values lowered to one ggml graph, cached by its structure, and run), ``tensor`` (``AgTensor`` and the tape's state),
``ops`` (the differentiable ops), ``losses``, ``tape`` (``with_grad_tape``, ``backward``), ``optim`` (optimizers and
clipping), ``schedulers``, ``nn`` (the layers), ``attention``, ``conv``, ``data`` (the data loader, gradient checks,
``ag_trace``) and ``persist`` (GGUF files, a model-layer model's weights).
"""
