"""Feeding one epoch of parsed batches, optionally read ahead by a background thread.

With ``prefetch=N`` a worker thread pulls up to N batches ahead from the source and
converts them, while ggml computes (cffi releases the GIL during C calls). The worker
never reads past the current epoch's limit, so epoch boundaries stay exactly where
they would be without it. An exception raised by the source is re-raised unchanged
in the training thread.

Stopping (the end of training, an error, Ctrl-C): the worker is a daemon thread, told to stop and
joined. When training stops while the worker is inside the source (a slow or blocked ``next()``), the
source is abandoned: an exception is raised in the worker thread (CPython delivers it at the source's
next Python instruction, so a polling loop stops at once), and the caller does not wait for a source
blocked inside a C call (a ``time.sleep``, a lock or socket wait without timeout): that thread ends as
soon as the call returns, never touches the source again, and never keeps the process alive.
"""
from __future__ import annotations

import ctypes
import queue
import sys
import threading
import time
import warnings
from collections.abc import Iterator, Sequence

from ..errors import GgmlpyWarning
from .adapters import Source, Writer


_END = object()
JOIN_TIMEOUT_S = 5.0  # how long close() waits for an idle worker to leave
ABANDON_TIMEOUT_S = 0.5  # how long close() waits for a worker stopped inside the source
ENDLESS_WARN_S = 60.0  # a first epoch without a step limit running this long gets one warning


class _SourceAbandoned(BaseException):
    """Raised inside the prefetch thread to take it out of a source that training no longer needs."""


def _raise_in_thread(thread: threading.Thread) -> None:
    """Ask CPython to raise _SourceAbandoned in ``thread`` at its next Python instruction."""
    if sys.implementation.name != "cpython" or thread.ident is None:
        return
    set_async = ctypes.pythonapi.PyThreadState_SetAsyncExc
    if set_async(ctypes.c_ulong(thread.ident), ctypes.py_object(_SourceAbandoned)) > 1:
        set_async(ctypes.c_ulong(thread.ident), None)  # more than one thread hit: undo (cannot happen)


class BatchFeed:
    def __init__(self, source: Source, writer: Writer, prefetch: int = 0) -> None:
        self.source, self.writer, self.prefetch = source, writer, prefetch
        self._requests: queue.Queue = queue.Queue()
        self._results: queue.Queue | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._in_source = False  # the worker is inside the source's next()
        self._epochs_done = 0
        self._warned_endless = False

    def epoch(self, limit: int | None) -> Iterator[Sequence[object]]:
        """Parsed batches of one epoch: at most ``limit``, fewer if the source ends the epoch."""
        watch = limit is None and self._epochs_done == 0 and not self._warned_endless
        started, n = time.monotonic(), 0
        for item in (self._produce(limit) if self.prefetch <= 0 else self._prefetched(limit)):
            yield item
            n += 1
            if watch and time.monotonic() - started > ENDLESS_WARN_S:
                watch, self._warned_endless = False, True
                arg = "validation_steps" if self.source.name.startswith("validation") else "steps_per_epoch"
                warnings.warn(f"the first epoch has read {n} batches from the {self.source.name} in "
                              f"{time.monotonic() - started:.0f} s and the source has not ended it. If it never "
                              f"ends, pass {arg}=<batches per epoch>; Ctrl-C stops training and keeps the history "
                              "of the completed epochs (ignore this for a long finite source)", GgmlpyWarning,
                              stacklevel=3)
        self._epochs_done += 1

    def _prefetched(self, limit: int | None) -> Iterator[Sequence[object]]:
        if self._thread is None:
            self._results = queue.Queue(maxsize=self.prefetch)
            self._thread = threading.Thread(target=self._work, name=f"ggmlpy-prefetch-{self.source.name}",
                                            daemon=True)
            self._thread.start()
        self._requests.put(limit)
        results = self._results
        assert results is not None  # made with the thread
        while True:
            item = results.get()
            if item is _END:
                return
            if isinstance(item, _Failure):
                raise item.exc
            yield item

    def _produce(self, limit: int | None) -> Iterator[Sequence[object]]:
        self.source.start_epoch()
        n = 0
        while limit is None or n < limit:
            self._in_source = True
            try:
                batch = self.source.next_batch()
            finally:
                self._in_source = False
            if batch is None:
                return
            n += 1
            yield self.writer.parse(batch, own=self.prefetch > 0)

    def _work(self) -> None:
        while not self._stop.is_set():
            limit = self._requests.get()
            if limit is _END:
                return
            try:
                for parsed in self._produce(limit):
                    if not self._put(parsed):
                        return
                self._put(_END)
            except _SourceAbandoned:
                return
            except BaseException as exc:  # noqa: BLE001 - handed to the training thread as is
                if self._stop.is_set():
                    return
                self._put(_Failure(exc))

    def _put(self, item: object) -> bool:
        results = self._results
        assert results is not None  # the worker thread starts after it is made
        while not self._stop.is_set():
            try:
                results.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def close(self) -> None:
        """Stop the worker (joined; abandoned in the source if it is inside it) and close the source."""
        busy = False
        thread = self._thread
        if thread is not None:
            self._stop.set()
            self._requests.put(_END)
            if self._in_source:
                _raise_in_thread(thread)
                thread.join(timeout=ABANDON_TIMEOUT_S)
            else:
                thread.join(timeout=JOIN_TIMEOUT_S)
                if thread.is_alive() and self._in_source:  # it entered the source meanwhile (a slow batch)
                    _raise_in_thread(thread)
                    thread.join(timeout=ABANDON_TIMEOUT_S)
            busy = thread.is_alive()  # blocked in a C call inside the source: it exits once that returns
            self._thread = None
        if not busy:  # closing a generator that another thread is running raises "generator already executing"
            self.source.close()


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
