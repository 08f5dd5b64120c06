"""ggmlR's dynamic autograd engine (``ag_*``): eager PyTorch-style code recorded lazily, each step computed as one ggml
graph on the tensors' device (``docs/guide/autograd.md``).

Lowest first: ``device`` (the devices, their backends, the tensors the engine owns there), ``lazy`` (a set of lazy
values lowered to one ggml graph, cached by its structure, and run), ``tensor`` (``AgTensor`` and the tape's state),
``ops`` (the differentiable ops and losses), ``tape`` (``with_grad_tape``, ``backward``), then ``optim`` (optimizers
and clipping), ``schedulers``, ``layers``, ``data`` (the data loader, gradient checks) and ``trace``.
"""
