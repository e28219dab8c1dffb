"""Contiguous columns of DBN records, through one transposed copy.

DBN records are whole multiples of 8 bytes with naturally aligned fields, so the records viewed
as an [n, words] u64 matrix transpose into one contiguous row per 8-byte word; a field is then
its word's row (8-byte fields, no further copy) or an every-k-th slice of it (narrower fields,
one copy each). One transpose is about twice as fast as a strided copy per field, and
validation and Arrow conversion share it.

Ingest's reader builds the transpose piece by piece as it decompresses (`from_words`), so a
chunk never exists as a record array; `recs` rebuilds one on demand for the rare paths that
want whole records (error messages, wide text fields).
"""

from __future__ import annotations

import numpy as np

from foxhunt.dbn.buffers import ALIGN, POOL, POOLED_BYTES

TRANSPOSE_BLOCK = 1024


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def transpose_into(words: np.ndarray, lo: int, raw: np.ndarray) -> None:
    """Records in `raw` (bytes of whole records) -> columns lo.. of `words` [words, n], in
    blocks of rows that fit in cache (~1.7x a single whole transpose)."""
    w = words.shape[0]
    mat = raw.view(np.uint64).reshape(-1, w)
    for a in range(0, len(mat), TRANSPOSE_BLOCK):
        b = min(a + TRANSPOSE_BLOCK, len(mat))
        words[:, lo + a : lo + b] = mat[a:b].T


def _in_word(dt: np.dtype, offset: int) -> bool:
    """Whether a field is a whole 1/2/4/8-byte part of one word of the transpose."""
    return dt.kind in "iufS" and dt.itemsize in (1, 2, 4, 8) and offset % dt.itemsize == 0


class RecordColumns:
    def __init__(self, recs: np.ndarray) -> None:
        self._init(recs.dtype, len(recs))
        self._recs = recs
        size = recs.dtype.itemsize
        if size % 8 == 0 and self.n:
            base = recs if recs.flags.c_contiguous else np.ascontiguousarray(recs)
            self._words = POOL.take(size * self.n).view(np.uint64).reshape(size // 8, self.n)
            transpose_into(self._words, 0, base.view(np.uint8))

    @classmethod
    def from_words(cls, words: np.ndarray, dtype: np.dtype) -> RecordColumns:
        """Columns over an already transposed [itemsize // 8, n] u64 matrix (rows contiguous)."""
        self = cls.__new__(cls)
        self._init(dtype, words.shape[1])
        self._words = words
        return self

    def _init(self, dtype: np.dtype, n: int) -> None:
        self.dtype = dtype
        self.n = n
        self._recs: np.ndarray | None = None
        self._words: np.ndarray | None = None
        self._cache: dict[str, np.ndarray] = {}
        self._block: np.ndarray | None = None
        self._used = 0  # bytes of _block handed out
        self._parent: RecordColumns | None = None
        self._sel: slice | np.ndarray | None = None

    def __len__(self) -> int:
        return self.n

    @property
    def recs(self) -> np.ndarray:
        """The records as a structured array (rebuilt from the columns when need be)."""
        if self._recs is None:
            if self._parent is not None:
                self._recs = self._parent.recs[self._sel]
            else:
                self._recs = np.ascontiguousarray(self._words.T).view(self.dtype).reshape(self.n)
        return self._recs

    def __getitem__(self, name: str) -> np.ndarray:
        col = self._cache.get(name)
        if col is not None:
            return col
        if self._parent is not None:
            col = self._cache[name] = self._parent[name][self._sel]
            return col
        dt, off = self.dtype.fields[name][:2]
        w, k = divmod(off, 8)
        if self._words is None or not _in_word(dt, off):
            col = np.ascontiguousarray(self.recs[name])
        else:
            row = self._words[w]  # contiguous: a view
            if dt.itemsize == 8:
                col = row.view(dt)
            else:
                col = self._narrow(dt)
                np.copyto(col, row.view(dt)[k // dt.itemsize :: 8 // dt.itemsize])
        self._cache[name] = col
        return col

    def materialize(self) -> RecordColumns:
        """Extract every column that comes out of the transpose now (ingest's reader thread
        does this, off the main thread: numpy copies release the GIL)."""
        if self._words is not None:
            for name, (dt, off, *_) in self.dtype.fields.items():
                if _in_word(dt, off):
                    self[name]
        return self

    def _narrow(self, dt: np.dtype) -> np.ndarray:
        """An empty column for a field narrower than 8 bytes: a slice of one pooled block per
        chunk that holds them all (their copies out of the transpose)."""
        n = self.n
        if self._block is None:
            sizes = [f[0].itemsize for f in self.dtype.fields.values() if f[0].itemsize < 8]
            total = sum(_aligned(n * k) for k in sizes)
            self._block = POOL.take(total) if total >= POOLED_BYTES else None
        if self._block is None or self._used + n * dt.itemsize > len(self._block):
            return np.empty(n, dtype=dt)
        col = self._block[self._used : self._used + n * dt.itemsize].view(dt)
        self._used += _aligned(n * dt.itemsize)  # every column starts ALIGN-byte aligned
        return col

    def subset(self, sel: slice | np.ndarray) -> RecordColumns:
        """The records selected by a slice or an index array. Its columns are the parent's
        columns indexed the same way (views for a slice), each computed once per chunk."""
        sub = RecordColumns.__new__(RecordColumns)
        n = len(range(*sel.indices(self.n))) if isinstance(sel, slice) else len(sel)
        sub._init(self.dtype, n)
        sub._parent, sub._sel = self, sel
        return sub

    def header_words(self) -> np.ndarray:
        """[6, n] u64: the first 48 bytes of each record (everything of an event but the book)."""
        if self._parent is not None:
            return self._parent.header_words()[:, self._sel]
        if self._words is None:
            raw = np.ascontiguousarray(self.recs).view(np.uint8).reshape(self.n, -1)
            return np.ascontiguousarray(raw[:, :48]).view(np.uint64).T
        return self._words[:6]
