"""Ownership of C objects: one pattern for every handle.

A ``Handle`` owns one C pointer and the function that frees it. It keeps its parents
alive (Python references), frees its children before itself (C's order), frees
exactly once (``free()`` is idempotent, a finalizer catches what the user forgot),
and turns use after free into a RuntimeError instead of a crash.

Two more rules make "after free" hold for every path to the memory, not only the handle:

* In use: a running call (a compute, a fit, an epoch of ggml-opt) marks the handles it needs with
  ``using(...)``; ``free()`` of a marked handle, or of one whose children are marked, raises
  ``GgmlInUseError`` instead of freeing memory under ggml (from a callback, another thread, a
  prefetch generator). Marks and frees take one lock, so the check cannot race.
* Memory given back: an allocator (a scheduler, a graph allocator) records the tensors it gave memory
  (``Allocations``); when that memory goes (free, reset, a re-allocation that may move it) their
  ``data``/``buffer`` are cleared, so a later read, write or compute sees a tensor without memory and
  raises, instead of following a dangling pointer. ``memory_epoch()`` counts those events, so checks
  of a graph can be cached until the next one.
"""
from __future__ import annotations

import atexit
import contextlib
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from types import FrameType
from typing import NoReturn, Protocol, TYPE_CHECKING, TypeVar

from .._ffi import CData, ffi, lib
from ..errors import BackendUnavailableError, GgmlInUseError, GgmlStateError, GgmlTypeError


if TYPE_CHECKING:
    from typing_extensions import Self

    # a Python-level signal handler, as signal.getsignal returns one
    SignalHandler = Callable[[int, FrameType | None], object]

# One lock for every in-use mark and every free: a free sees every mark set before it, and a call that
# marks a handle sees every free done before it (re-entrant: a free frees its children under it).
HANDLE_LOCK = threading.RLock()
_epoch = [0]


def memory_epoch() -> int:
    """A counter bumped whenever tensors may have lost their memory (a buffer, an allocator or its
    allocation went). A check of a graph made at epoch ``e`` still holds while ``memory_epoch() == e``."""
    return _epoch[0]


def bump_memory_epoch() -> None:
    _epoch[0] += 1


# ---------------------------------------------------------------- interpreter exit
# At exit, weakref.finalize frees every C object still alive, also one a daemon thread is computing with or
# about to read (a crash). The exit hook runs before those finalizers (it is registered after the first one)
# and refuses new calls. With no other thread alive the finalizers then free everything as always; with one
# (a daemon thread: the others were joined before exit), it waits up to EXIT_WAIT_S for the running calls
# to return and leaves every C object to the operating system, which takes it back with the process.
EXIT_WAIT_S = 5.0
_live_handles: weakref.WeakSet[Handle] = weakref.WeakSet()
_exiting = [False]
_computing_now = [0]
_exit_hook = [False]
EXITING_MESSAGE = ("the interpreter is exiting and ggml's objects are being released; a thread (a daemon "
                   "thread?) started a call after exit began. Join such threads before the program ends")


_public_calls = [0]  # ggmlpy's public functions under way, in every thread (the guard counts them)


def interpreter_exiting() -> bool:
    """Whether exit has begun (the exit hook ran, or Python is finalizing): finalizers then leave C objects
    to the operating system."""
    return _exiting[0] or sys.is_finalizing()


def _check_not_exiting() -> None:
    if _exiting[0]:
        raise GgmlStateError(EXITING_MESSAGE)


@contextlib.contextmanager
def public_call() -> Iterator[None]:
    """Count one public call for the length of the block (refused once the interpreter is exiting), so the
    exit hook can wait for every call under way, graph building and data writes included."""
    with HANDLE_LOCK:
        _check_not_exiting()
        _public_calls[0] += 1
    try:
        yield
    finally:
        with HANDLE_LOCK:
            _public_calls[0] -= 1


def _at_exit() -> None:
    with HANDLE_LOCK:
        _exiting[0] = True
    main = threading.main_thread()
    if not any(t is not main and t.is_alive() for t in threading.enumerate()):
        return
    deadline = time.monotonic() + EXIT_WAIT_S
    while time.monotonic() < deadline:
        with HANDLE_LOCK:
            if _public_calls[0] == 0 and _computing_now[0] == 0 and not any(h.users for h in list(_live_handles)):
                break
        time.sleep(0.005)
    with HANDLE_LOCK:
        for h in list(_live_handles):
            if h._finalizer is not None:
                h._finalizer.atexit = False


class Lifetime(Protocol):
    """What a tensor's header or data depends on: a ``Handle``, or a shorter lifetime inside one (one step of a
    dynamic opt context); ``kind`` names it in messages."""
    kind: str

    @property
    def alive(self) -> bool: ...


class Handle:
    kind = "handle"

    def __init__(self, ptr: CData, free_fn: Callable[[CData], None] | None = None,
                 parents: Iterable[Handle | None] = ()) -> None:
        if ptr is None or ptr == ffi.NULL:
            raise GgmlStateError(f"ggml returned NULL while creating a {self.kind}")
        self._ptr: CData | None = ptr
        self._addr = int(ffi.cast("uintptr_t", ptr))
        self.parents = tuple(p for p in parents if p is not None)
        self._children: weakref.WeakSet[Handle] = weakref.WeakSet()
        self.users: list[str] = []  # the running calls that use this handle (see ``using``)
        for parent in self.parents:
            parent._children.add(self)
        self._finalizer = weakref.finalize(self, free_fn, ptr) if free_fn else None
        _live_handles.add(self)
        if not _exit_hook[0]:  # after the first finalize exists, so that this hook runs before finalizers
            _exit_hook[0] = True
            atexit.register(_at_exit)

    @property
    def ptr(self) -> CData:
        """The live C pointer; raises if this handle or one it depends on was freed."""
        ptr = self._ptr
        if ptr is None or self._collected():
            raise GgmlStateError(f"this {self.kind} has been freed")
        for parent in self.parents:
            if parent._ptr is None or parent._collected():
                raise GgmlStateError(f"this {self.kind} depends on a {parent.kind} that has been freed")
        return ptr

    def _collected(self) -> bool:
        # In a reference cycle the garbage collector runs the finalizers (which free the C objects) before
        # any __del__ of the cycle's objects, which then still hold this handle with its old pointer.
        return self._finalizer is not None and not self._finalizer.alive

    @property
    def alive(self) -> bool:
        # freeing a handle frees its children first, and a parent cannot be collected before its children:
        # a handle whose parent is gone has been freed itself
        return self._ptr is not None and not self._collected()

    def free(self) -> None:
        """Free the C object (children first). Safe to call more than once.

        Raises GgmlInUseError, freeing nothing, while a running call uses this handle or one of its
        children (see ``using``)."""
        with HANDLE_LOCK:
            if self._ptr is None:
                return
            busy = self.busy_in_tree()
            if busy is not None:
                handle, what = busy
                which = "it" if handle is self else f"a {handle.kind} that depends on it"
                raise GgmlInUseError(
                    f"cannot free this {self.kind}: {which} is in use by {what}, running in this thread (a "
                    "callback or a generator of that call?) or another one; freeing it now would pull its "
                    "memory out from under ggml. Free it after that call has returned (or stop the call "
                    "first, e.g. with state.stop = True in a callback)")
            for child in list(self._children):
                child.free()
            self._before_free()
            if self._finalizer is not None:
                self._finalizer()
            self._ptr = None

    def busy_in_tree(self) -> tuple[Handle, str] | None:
        """(handle, call) of a running call that uses this handle or one of its descendants, or None."""
        if self.users:
            return self, self.users[-1]
        for child in list(self._children):
            found = child.busy_in_tree()
            if found is not None:
                return found
        return None

    @property
    def in_use(self) -> bool:
        """Whether a running call uses this handle (it cannot be freed now)."""
        return bool(self.users)

    def _before_free(self) -> None:
        """Hook for subclasses that must tidy C state before the free call."""

    close = free

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    def __repr__(self) -> str:
        state = "" if self._ptr is not None else " (freed)"
        return f"<{type(self).__name__}{self._describe()}{state}>"

    def _describe(self) -> str:
        return ""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Handle) and type(other) is type(self) and other._addr == self._addr

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._addr))


def unique_handles(handles: Iterable[object]) -> list[Handle]:
    """The distinct handles (by identity: two handles may compare equal by address) among ``handles``."""
    seen: dict[int, Handle] = {}
    for h in handles:
        if isinstance(h, Handle):
            seen.setdefault(id(h), h)
    return list(seen.values())


@contextlib.contextmanager
def using(handles: Iterable[object], what: str, exclusive: Iterable[object] = (),
          busy: Callable[[str], str] | None = None, check: Callable[[], None] | None = None) -> Iterator[None]:
    """Mark ``handles`` in use by the call ``what`` for the length of the block: freeing any of them (or
    a parent of one) raises GgmlInUseError meanwhile. Raises GgmlStateError first when one of them has
    already been freed. Marks nest (a fit computes, a compute inside a callback, ...). ``exclusive``
    handles must not be in use by another call already (checked and marked in one step, so two threads
    cannot both pass): else GgmlInUseError with ``busy(the other call)`` as its message. ``check`` runs
    under the same lock, before anything is marked (a condition no other thread can change meanwhile)."""
    hs = unique_handles([*handles, *exclusive])
    with HANDLE_LOCK:
        _check_not_exiting()
        for h in hs:
            if h._ptr is None:
                _ = h.ptr  # raises, saying what was freed
        if check is not None:
            check()
        for h in unique_handles(exclusive):
            if h.users:
                raise GgmlInUseError(busy(h.users[-1]) if busy else
                                     f"{what}: this {h.kind} is in use by {h.users[-1]}; call it afterwards")
        for h in hs:
            h.users.append(what)
    try:
        yield
    finally:
        with HANDLE_LOCK:
            for h in hs:
                h.users.remove(what)


def compute_locks(backends: Iterable[object]) -> tuple[threading.RLock, ...]:
    """The compute locks of ``backends``, in the one order every caller takes them (no deadlock)."""
    locks = []
    for b in sorted(unique_handles(backends), key=id):
        lock = b.__dict__.get("_compute_lock")
        if lock is None:
            with HANDLE_LOCK:
                lock = b.__dict__.setdefault("_compute_lock", threading.RLock())
        locks.append(lock)
    return tuple(locks)


class computing:
    """``with computing(backends):`` hold the compute lock of each backend for one C computation. ggml's
    backends are not safe for two computations at once (the CPU backend shares one work buffer between
    them, which the second may free and replace under the first), so computations on a backend from
    several threads (a prediction while a fit runs, two predictions) take turns. Re-entrant. Pass
    ``locks=`` (from ``compute_locks``) to skip looking them up."""

    __slots__ = ("locks", "rpc")

    def __init__(self, backends: Iterable[object] = (), locks: tuple[threading.RLock, ...] | None = None,
                 rpc: bool | None = None) -> None:
        backends = tuple(backends)
        self.locks = compute_locks(backends) if locks is None else locks
        self.rpc = any(getattr(b, "is_rpc", False) for b in backends) if rpc is None else rpc

    def __enter__(self) -> None:
        with HANDLE_LOCK:
            _check_not_exiting()
            _computing_now[0] += 1
        try:
            for lock in self.locks:
                lock.acquire()
        except BaseException:
            with HANDLE_LOCK:
                _computing_now[0] -= 1
            raise

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        for lock in reversed(self.locks):
            lock.release()
        with HANDLE_LOCK:
            _computing_now[0] -= 1
        if self.rpc and exc_type is None:
            check_rpc_connections()


def rpc_connection_lost() -> bool:
    """Whether any RPC server has stopped answering in this process (``check_rpc_connections`` raises then)."""
    return bool(lib.ggmlpy_rpc_lost_connections())


def check_rpc_connections() -> None:
    """Raise once any RPC server has stopped answering in this process (patches/0020: ggml's client then
    answers every command on that connection with zeros instead of aborting, so no later result of a
    computation or a transfer on an RPC device can be trusted)."""
    if rpc_connection_lost():
        raise BackendUnavailableError(RPC_LOST_MESSAGE)


RPC_LOST_MESSAGE = ("an RPC server stopped answering (the connection was lost: the server process ended, or its "
                    "machine or the network went away); results computed on its devices since then are not valid. "
                    "ggml's RPC client cannot reconnect within this process: restart the server and this process "
                    "(a fit's completed epochs are in this error's .history; save the model from a local copy)")


def install_sigint(handler: SignalHandler) -> SignalHandler | None:
    """Put ``handler`` in place for SIGINT and return the handler it replaces, or None where nothing was
    installed: off the main thread (Python delivers signals there only), over a C-level handler, or in a
    sub-interpreter."""
    if threading.current_thread() is not threading.main_thread():
        return None
    old = signal.getsignal(signal.SIGINT)
    if not callable(old):
        return None
    try:
        signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main interpreter
        return None
    return old


class InterruptGuard:
    """Ctrl-C (SIGINT) that lands inside one protocol step which must not be cut in two (an
    ``ggml_opt_alloc`` whose ``ggml_opt_eval`` has not run leaves the opt context unusable) is held back
    until the step is done, then raised; outside a step (a generator, a callback) it is raised at once, and
    a second Ctrl-C during a step too. Installed once per loop (``with InterruptGuard() as guard:``), each
    step ``with guard.step:``; only in the main thread (the only one Python delivers signals to), and only
    over a Python-level handler (elsewhere both are no-ops)."""

    def __init__(self) -> None:
        self.in_step = False
        self.pending: tuple[int, FrameType | None] | None = None
        self.old: SignalHandler | None = None
        self.step = _GuardStep(self)

    def __enter__(self) -> InterruptGuard:
        self.old = install_sigint(self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.old is not None:
            signal.signal(signal.SIGINT, self.old)
            self.old = None

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self.in_step and self.pending is None:
            self.pending = (signum, frame)
            return
        if self.old is not None:  # installed only over a Python-level handler
            self.old(signum, frame)


class InterruptKeeper:
    """Ctrl-C that Python swallows is raised again at the next ``check()``. A KeyboardInterrupt raised while
    the main thread runs a finalizer (a ``__del__`` or weak-reference callback that the garbage collector
    calls between two batches) is printed as "Exception ignored" and lost; in a long inference loop that
    happens now and then. The keeper's handler notes every Ctrl-C before raising it as the old handler
    does; a noted one that never left the block is raised at the next check (each batch, and at the end).
    Main thread only, over a Python-level handler (elsewhere a no-op)."""

    def __init__(self) -> None:
        self.old: SignalHandler | None = None
        self.noted = False

    def __enter__(self) -> InterruptKeeper:
        self.old = install_sigint(self._handler)
        return self

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.noted = True
        if self.old is not None:  # installed only over a Python-level handler
            self.old(signum, frame)

    def check(self) -> None:
        if self.noted:
            self.noted = False
            raise KeyboardInterrupt

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if self.old is not None:
            signal.signal(signal.SIGINT, self.old)
            self.old = None
        if exc_type is None:
            self.check()


class _GuardStep:
    __slots__ = ("guard",)

    def __init__(self, guard: InterruptGuard) -> None:
        self.guard = guard

    def __enter__(self) -> None:
        self.guard.in_step = True

    def __exit__(self, *exc: object) -> None:
        g = self.guard
        g.in_step = False
        if g.pending is not None and g.old is not None:
            pending, g.pending = g.pending, None
            g.old(*pending)


class Allocations:
    """The tensors one allocator (a scheduler, a graph allocator) gave memory, to take it back.

    ``record`` after an allocation: for each tensor, the handles that keep its header alive and the
    buffer it was placed in. ``release`` when that memory goes (the allocator is freed or reset, or a
    new allocation may move its buffer): every recorded tensor whose header is still alive and still
    points into that buffer loses ``data`` and ``buffer``, so it reads as unallocated instead of
    dangling. Cheap when nothing was recorded."""

    __slots__ = ("_records",)

    def __init__(self) -> None:
        self._records: list[tuple[tuple[Lifetime, ...], list[tuple[CData, CData]]]] = []

    def __bool__(self) -> bool:
        return bool(self._records)

    def record(self, keepers: Iterable[Lifetime], tensors: list[tuple[CData, CData]]) -> None:
        """``tensors``: (tensor pointer, buffer pointer it got) pairs whose headers live while ``keepers`` do."""
        if tensors:
            self._records.append((tuple(keepers), tensors))

    def release(self) -> None:
        if not self._records:
            return
        with HANDLE_LOCK:
            for keepers, tensors in self._records:
                if all(k.alive for k in keepers):
                    for t, buf in tensors:
                        if t.buffer == buf:
                            t.data = ffi.NULL
                            t.buffer = ffi.NULL
            self._records.clear()
            bump_memory_epoch()


H = TypeVar("H", bound=Handle)


def live(obj: object, cls: type[H], what: str) -> H:
    """``obj`` if it is a live ``cls`` handle; GgmlTypeError (another kind) or GgmlStateError (freed) otherwise."""
    if not isinstance(obj, cls):
        raise_type(what, cls.kind, obj)
    _ = obj.ptr  # raises if freed
    return obj


def unwrap(obj: object, cls: type[Handle], what: str) -> CData:
    """The C pointer of ``obj`` if it is a live ``cls`` handle; TypeError otherwise."""
    if not isinstance(obj, cls):
        raise_type(what, cls.kind, obj)
    return obj.ptr


def raise_type(what: str, expected: str, given: object) -> NoReturn:
    raise GgmlTypeError(f"{what}: expected a {expected}, got {type(given).__name__} ({given!r:.80})")


def free_handle(obj: object, cls: type[Handle], what: str) -> None:
    """The ``*_free`` functions: type-checked, and idempotent (a freed handle is freed again silently)."""
    if not isinstance(obj, cls):
        raise_type(what, cls.kind, obj)
    obj.free()
