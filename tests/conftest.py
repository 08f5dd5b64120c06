"""The suite's hooks and shared fixtures (docs/guide/architecture.md, "Tests").

The helpers the tests import are in tests/helpers/ (``from tests.helpers.compute import compute``). Nothing here
imports ggmlpy when pytest loads it: the fixtures import it when a test asks for them, so that the pure tests
(tests/project/) run where ggml cannot load.
"""
from __future__ import annotations

import numpy as np
import pytest

# the hooks of GGMLPY_REQUIRE_DEVICES and GGMLPY_VK_VALIDATION
from tests.helpers.device_runs import pytest_runtest_makereport, pytest_sessionfinish  # noqa: F401

# the markers gpu, vulkan, cuda and pure
from tests.helpers.markers import GPU_DEVICES, pytest_collection_modifyitems  # noqa: F401

# why the skipped tests did not run, by reason, at the end of a run
from tests.helpers.skips import pytest_terminal_summary  # noqa: F401


@pytest.fixture(scope="session")
def backend():
    """One CPU backend for the whole session, one thread: the graphs are tiny, and on a shared
    2-core machine two spinning threads made ggml's loops many times slower."""
    import ggmlpy as G
    b = G.ggml_backend_cpu_init()
    G.ggml_backend_cpu_set_n_threads(b, 1)
    yield b
    b.free()


@pytest.fixture
def sched(backend):
    import ggmlpy as G
    s = G.ggml_backend_sched_new([backend], parallel=False, graph_size=512)
    yield s
    s.free()


@pytest.fixture
def ctx():
    """A no_alloc context for tensors and graphs (allocate with a backend or a scheduler)."""
    import ggmlpy as G
    from tests.helpers.compute import ctx_size
    c = G.ggml_init(ctx_size(512, 512, True), no_alloc=True)
    yield c
    c.free()


@pytest.fixture
def host_ctx():
    """A context with its own memory (no_alloc=False): tensors are usable right away."""
    import ggmlpy as G
    c = G.ggml_init(4 * 1024 * 1024, no_alloc=False)
    yield c
    c.free()


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture(scope="module", params=["CPU", *sorted(GPU_DEVICES)])
def any_backend(request):
    """The CPU and each GPU backend (Vulkan on Mesa's lavapipe in CI; CUDA where built and present): for kernels and
    rules every backend must follow (``tests.helpers.devices.assert_ran_on`` checks that an op ran on the device)."""
    import ggmlpy as G
    from tests.helpers.devices import require_gpu
    if request.param != "CPU":
        require_gpu(request.param)
    b = G.ggml_backend_init_by_name(request.param)
    yield b
    b.free()
