"""Reusable chunk buffers.

A fresh multi-megabyte numpy array is mmapped, and the kernel zeroes each of its pages when it
is first touched: ingest allocated ~120 MB per chunk that way (read buffer, transpose, narrow
columns), and page zeroing took ~10% of its CPU. The pool hands a buffer out again once nothing
refers to it any more (no numpy view, no Arrow array built on one), which CPython's reference
count tells, so reuse can never overwrite data still in use.
"""

from __future__ import annotations

import sys
import threading

import numpy as np


def _idle_refcount() -> int:
    """sys.getrefcount of a pooled buffer that nothing else holds, as seen inside `take`."""
    held = [np.empty(1, dtype=np.uint8)]
    for buf in held:
        return sys.getrefcount(buf)
    raise AssertionError


_IDLE = _idle_refcount()
# Smaller arrays come from malloc's heap, which reuses memory anyway.
POOLED_BYTES = 1 << 20
ALIGN = 64


class BufferPool:
    def __init__(self, max_buffers: int = 16) -> None:
        self.max_buffers = max_buffers
        self._bufs: list[np.ndarray] = []
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray:
        """A 64-byte aligned uint8 array of `nbytes` (uninitialised): the smallest idle pooled
        buffer that is large enough (and at most twice the size), else a new one. A new buffer
        is pooled while there are fewer than `max_buffers`, else in place of an idle one (one
        that did not fit, so the pool follows the sizes in use)."""
        need = nbytes + ALIGN
        with self._lock:
            best, idle = None, None
            for i in range(len(self._bufs)):  # (enumerate's tuple would hold a reference)
                buf = self._bufs[i]
                if sys.getrefcount(buf) == _IDLE:
                    idle = i
                    fits = need <= buf.nbytes <= 2 * need  # not a much bigger one: keep it
                    if fits and (best is None or buf.nbytes < best.nbytes):
                        best = buf
            if best is None:
                best = np.empty(need, dtype=np.uint8)
                if len(self._bufs) < self.max_buffers:
                    self._bufs.append(best)
                elif idle is not None:
                    self._bufs[idle] = best
            start = -best.ctypes.data % ALIGN
            return best[start : start + nbytes]

    def clear(self) -> None:
        """Forget the pooled buffers (their memory is freed once nothing refers to them)."""
        with self._lock:
            self._bufs.clear()

    def __len__(self) -> int:
        return len(self._bufs)


# One per process: ingest's reader thread, its main thread and Parquet writers share it.
POOL = BufferPool()
