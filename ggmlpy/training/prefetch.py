"""Feeding one epoch of parsed batches, optionally read ahead by a background thread.

With ``prefetch=N`` a worker thread pulls up to N batches ahead from the source and
converts them, while ggml computes (cffi releases the GIL during C calls). The worker
never reads past the current epoch's limit, so epoch boundaries stay exactly where
they would be without it. An exception raised by the source is re-raised unchanged
in the training thread.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Iterator

from .adapters import BatchWriter, Source

_END = object()
JOIN_TIMEOUT_S = 5.0  # how long close() waits for the worker to leave the source


class BatchFeed:
    def __init__(self, source: Source, writer: BatchWriter, prefetch: int = 0) -> None:
        self.source, self.writer, self.prefetch = source, writer, prefetch
        self._requests: queue.Queue = queue.Queue()
        self._results: queue.Queue | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def epoch(self, limit: int | None) -> Iterator[Any]:
        """Parsed batches of one epoch: at most ``limit``, fewer if the source ends the epoch."""
        if self.prefetch <= 0:
            yield from self._produce(limit)
            return
        if self._thread is None:
            self._results = queue.Queue(maxsize=self.prefetch)
            self._thread = threading.Thread(target=self._work, name=f"ggmlpy-prefetch-{self.source.name}",
                                            daemon=True)
            self._thread.start()
        self._requests.put(limit)
        while True:
            item = self._results.get()  # type: ignore[union-attr]
            if item is _END:
                return
            if isinstance(item, _Failure):
                raise item.exc
            yield item

    def _produce(self, limit: int | None) -> Iterator[Any]:
        self.source.start_epoch()
        n = 0
        while limit is None or n < limit:
            batch = self.source.next_batch()
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
            except BaseException as exc:  # noqa: BLE001 - handed to the training thread as is
                self._put(_Failure(exc))

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._results.put(item, timeout=0.1)  # type: ignore[union-attr]
                return True
            except queue.Full:
                continue
        return False

    def close(self) -> None:
        busy = False
        if self._thread is not None:
            self._stop.set()
            self._requests.put(_END)
            self._thread.join(timeout=JOIN_TIMEOUT_S)
            busy = self._thread.is_alive()  # still inside the source (a slow batch): it exits once that returns
            self._thread = None
        if not busy:  # closing a generator that another thread is running raises "generator already executing"
            self.source.close()


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
