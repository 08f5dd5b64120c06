"""Backend events (``Event``) and graph plans (``GraphPlan``)."""
from __future__ import annotations

import functools
import weakref

from .._ffi import CData, ffi, lib
from ..backend.backend import Backend, finish_backend
from ..backend.device import as_device, Device, device_caps
from ..core.handle import computing, free_handle, Handle, raise_type, unwrap, using
from ..errors import GgmlStateError, GgmlValueError
from ..graph.objects import Graph
from .checks import check_graph_ready
from .run import check_status
from .sched import check_sched_indices, graph_ptr
from .transfer import backend_arg


def _free_event(state: dict[str, Backend | None], ptr: CData) -> None:
    if state.get("recorded_on") is not None:
        lib.ggml_backend_event_synchronize(ptr)  # its queued signal must not outlive it
    lib.ggml_backend_event_free(ptr)


class Event(Handle):
    kind = "backend event"

    def __init__(self, ptr: CData, device: Device) -> None:
        state: dict[str, Backend | None] = {"recorded_on": None}
        super().__init__(ptr, functools.partial(_free_event, state))
        self._state = state  # recorded_on: the Backend it was last recorded on, until synchronized
        self.device = device
        self._waiters: weakref.WeakSet = weakref.WeakSet()  # backends told to wait for it

    @property
    def recorded_on(self) -> Backend | None:
        """The Backend this event was last recorded on, until that backend is synchronized (else None)."""
        return self._state["recorded_on"]

    @recorded_on.setter
    def recorded_on(self, backend: Backend | None) -> None:
        self._state["recorded_on"] = backend

    def _before_free(self) -> None:
        for b in list(self._waiters):  # their queued wait points at it: finish it first
            if b.alive:
                finish_backend(b)

    def _describe(self) -> str:
        return f" {self.device.name}"


def _event(event: object, fn: str) -> CData:
    return unwrap(event, Event, f"{fn}(event)")


def ggml_backend_event_new(device: Device) -> Event:
    """Create an event on a device: a marker recorded into a backend's queue that others can wait for.

    Only devices whose ``ggml_backend_dev_get_props(device)["caps"]["events"]`` is True have events (Vulkan,
    CUDA; not the CPU, BLAS or RPC).

    Arguments:
        device: a Device, a device name such as ``"Vulkan0"``, or a Backend (its device).

    Value: an Event handle (freed with ``ggml_backend_event_free``, or when collected). Raises GgmlStateError
    on a device without events (ggmlR returns NULL there).

    Example:
        >>> ev = ggml_backend_event_new("Vulkan0")
    """
    fn = "ggml_backend_event_new"
    if isinstance(device, Backend):
        unwrap(device, Backend, f"{fn}(device)")
        device = device.device
    dev = as_device(device)
    if not device_caps(dev).get("events"):
        raise GgmlStateError(f"{fn}: device {dev.name} does not support events (its caps say events=False; "
                             f"ggml_backend_dev_get_props('{dev.name}')['caps']); use a device that does (Vulkan, "
                             "CUDA), or ggml_backend_synchronize to wait for a backend")
    ptr = lib.ggml_backend_event_new(dev.ptr)
    if ptr == ffi.NULL:
        raise GgmlStateError(f"{fn}: ggml could not create an event on {dev.name}")
    return Event(ptr, dev)


def ggml_backend_event_free(event: Event) -> None:
    """Free an event. Idempotent.

    Work still queued that records or waits for it is finished first (the backends told to wait are
    synchronized).

    Arguments:
        event: an Event.

    Value: None.

    Example:
        >>> ggml_backend_event_free(ev)
    """
    free_handle(event, Event, "ggml_backend_event_free(event)")


def _same_device(fn: str, event: Event, backend: Backend) -> None:
    if backend.device.ptr != event.device.ptr:
        raise GgmlValueError(f"{fn}: the event belongs to device {event.device.name}, the backend runs on "
                             f"{backend.device.name}; ggml's events work within one device: create the event on "
                             f"the backend's device (ggml_backend_event_new(ggml_backend_get_device(backend)))")


def ggml_backend_event_record(event: Event, backend: Backend) -> None:
    """Record an event into a backend's queue: it completes when the work queued before it has finished.

    Arguments:
        event: an Event of the backend's device (another device raises GgmlValueError).
        backend: a Backend.

    Value: None.

    Example:
        >>> ggml_backend_graph_compute_async(gpu, gf)
        >>> ggml_backend_event_record(ev, gpu)
        >>> ggml_backend_event_synchronize(ev)        # waits for that compute only
    """
    fn = "ggml_backend_event_record"
    e = _event(event, fn)
    b = backend_arg(backend, fn)
    _same_device(fn, event, backend)
    with using([event, backend], fn):
        with computing([backend]):
            lib.ggml_backend_event_record(e, b)
        event._state["recorded_on"] = backend
        backend.__dict__.setdefault("_recorded_events", weakref.WeakSet()).add(event)


def ggml_backend_event_synchronize(event: Event) -> None:
    """Wait until the work queued before the event's last record has finished.

    An event never recorded completes at once.

    Arguments:
        event: an Event.

    Value: None.

    Example:
        >>> ggml_backend_event_synchronize(ev)
    """
    fn = "ggml_backend_event_synchronize"
    e = _event(event, fn)
    with using([event], fn):
        recorded_on = event._state["recorded_on"]
        with computing([recorded_on] if recorded_on is not None and recorded_on.alive else []):
            lib.ggml_backend_event_synchronize(e)
            event._state["recorded_on"] = None


def ggml_backend_event_wait(backend: Backend, event: Event) -> None:
    """Make a backend's later work wait until the event completes (the host does not wait).

    Arguments:
        backend: a Backend of the event's device (another device raises GgmlValueError).
        event: an Event.

    Value: None.

    Example:
        >>> ggml_backend_event_wait(gpu, ev)
    """
    fn = "ggml_backend_event_wait"
    b = backend_arg(backend, fn)
    e = _event(event, fn)
    _same_device(fn, event, backend)
    with using([event, backend], fn):
        with computing([backend]):
            lib.ggml_backend_event_wait(b, e)
        event._waiters.add(backend)


# ---------------------------------------------------------------- graph plans

def _free_plan(backend_ptr: CData, ptr: CData) -> None:
    lib.ggml_backend_graph_plan_free(backend_ptr, ptr)


class GraphPlan(Handle):
    kind = "graph plan"

    def __init__(self, ptr: CData, backend: Backend, graph: Graph) -> None:
        # a child of the backend: freeing the backend frees the plan first, while the backend still exists
        super().__init__(ptr, functools.partial(_free_plan, backend.ptr), parents=[backend])
        self.backend = backend
        self.graph = graph
        self.n_nodes = graph.n_nodes()

    def _describe(self) -> str:
        return f" {self.n_nodes} nodes on {self.backend.device.name}"


def _plans_supported(backend: Backend) -> bool:
    # Of ggml's backends only the CPU's implements graph plans; ggml aborts on the others.
    return backend.is_cpu and backend.device.backend_name == "CPU"


def ggml_backend_graph_plan_create(backend: Backend, graph: Graph) -> GraphPlan:
    """Prepare a graph for repeated computation on a backend (work buffer and thread plan made once).

    Only the CPU backend supports plans. The plan computes the nodes the graph has now; nodes added to
    the graph later are not part of it. Every tensor of the graph must have memory on the backend, as for
    ``ggml_backend_graph_compute``.

    Arguments:
        backend: a CPU Backend (another kind raises GgmlStateError: ggml would abort).
        graph: a Graph whose tensors have memory the CPU can use.

    Value: a GraphPlan handle, freed with ``ggml_backend_graph_plan_free``, with its backend, or when
    collected. ggmlR returns NULL when ggml cannot make one; ggmlpy raises GgmlStateError.

    Example:
        >>> plan = ggml_backend_graph_plan_create(cpu, gf)
        >>> ggml_backend_graph_plan_compute(cpu, plan)
    """
    fn = "ggml_backend_graph_plan_create"
    b = backend_arg(backend, fn)
    g = graph_ptr(graph, fn)
    if not _plans_supported(backend):
        raise GgmlStateError(f"{fn}: backend {backend.name} does not implement graph plans (only ggml's CPU backend "
                             "does; ggml would abort); use ggml_backend_graph_compute on it")
    check_graph_ready(graph, [backend], fn, "backend")
    with using([backend, *graph.keepers], fn):
        ptr = lib.ggml_backend_graph_plan_create(b, g)
    if ptr == ffi.NULL:
        raise GgmlStateError(f"{fn}: ggml could not create the plan (out of memory for its work buffer?)")
    return GraphPlan(ptr, backend, graph)


def _plan(backend: Backend, plan: object, fn: str) -> tuple[CData, GraphPlan]:
    b = backend_arg(backend, fn)
    if not isinstance(plan, GraphPlan):
        raise_type(f"{fn}(plan)", "GraphPlan (ggml_backend_graph_plan_create)", plan)
    if plan.backend is not backend and plan.backend.ptr != b:
        raise GgmlValueError(f"{fn}: the plan was made for backend {plan.backend.name}, not for {backend.name}; pass "
                             "the backend it was created with")
    return b, plan


def ggml_backend_graph_plan_free(backend: Backend, plan: GraphPlan) -> None:
    """Free a graph plan. Idempotent.

    Arguments:
        backend: the Backend the plan was made for (another raises GgmlValueError). A plan whose backend
            was freed was freed with it: freeing it again does nothing.
        plan: a GraphPlan.

    Value: None.

    Example:
        >>> ggml_backend_graph_plan_free(cpu, plan)
    """
    fn = "ggml_backend_graph_plan_free"
    if not isinstance(plan, GraphPlan):
        raise_type(f"{fn}(plan)", "GraphPlan (ggml_backend_graph_plan_create)", plan)
    if not isinstance(backend, Backend):
        raise_type(f"{fn}(backend)", "Backend", backend)
    if not plan.alive:
        return
    _plan(backend, plan, fn)
    free_handle(plan, GraphPlan, f"{fn}(plan)")


def ggml_backend_graph_plan_compute(backend: Backend, plan: GraphPlan) -> int:
    """Compute the graph of a plan on its backend and wait for the result.

    The graph's tensors are checked first, as by ``ggml_backend_graph_compute`` (memory still there, row
    indices in range); the graph and its contexts must still be alive.

    Arguments:
        backend: the Backend the plan was made for (another raises GgmlValueError).
        plan: a GraphPlan (a freed one raises GgmlStateError).

    Value: the status, an int: 0 (``GGML_STATUS_SUCCESS``), as in ggmlR; a failed computation raises
    GgmlStateError.

    Example:
        >>> ggml_backend_graph_plan_compute(cpu, plan)
        0
    """
    fn = "ggml_backend_graph_plan_compute"
    b, plan = _plan(backend, plan, fn)
    p = plan.ptr
    graph = plan.graph
    g = graph_ptr(graph, fn)
    if graph.n_nodes() != plan.n_nodes:  # ggml's plan holds the node list and work size of its creation
        raise GgmlStateError(f"{fn}: the graph has {graph.n_nodes()} nodes now, {plan.n_nodes} when the plan was "
                             "made: the plan would compute the old graph (and size its work buffer for it); free it "
                             "and create a new one with ggml_backend_graph_plan_create")
    check_graph_ready(graph, [backend], fn, "backend")
    with using([backend, plan, *graph.keepers], fn):
        check_sched_indices(g)
        with computing([backend]):
            status = lib.ggml_backend_graph_plan_compute(b, p)
    check_status(status, fn)
    return int(status)
