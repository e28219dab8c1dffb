"""Reading and writing DBN files as numpy record arrays, plain or zstd-compressed.

A DBN stream is `b"DBN"`, a version byte, a little-endian u32 length, the metadata, then
fixed-size records. `databento_dbn.Metadata` encodes and decodes the metadata; the records are
read in chunks straight into numpy arrays with the dtypes of `foxhunt.dbn.layout`.
"""

from __future__ import annotations

import io
import os
import queue
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

import databento_dbn as dbn
import numpy as np
import zstandard

from foxhunt.dbn.buffers import POOL, POOLED_BYTES
from foxhunt.dbn.columns import RecordColumns, transpose_into
from foxhunt.dbn.layout import SCHEMAS, SUPPORTED_VERSIONS, SchemaLayout

DBN_MAGIC = b"DBN"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# Legacy DBZ files start with a zstd skippable frame (magic 0x184D2A50..0x184D2A5F).
SKIPPABLE_MAGIC_LOW = 0x184D2A50

T = TypeVar("T")


class DbnFormatError(ValueError):
    """A DBN file breaks a rule. The message names the file, where, and the rule."""

    def __init__(self, path: os.PathLike | str, rule: str, where: str = "") -> None:
        self.path = str(path)
        self.rule = rule
        self.where = where
        loc = f" at {where}" if where else ""
        super().__init__(f"{self.path}{loc}: {rule}")


@dataclass(frozen=True)
class DbnHeader:
    metadata: dbn.Metadata
    version: int
    schema: str
    layout: SchemaLayout
    dtype: np.dtype
    header_bytes: int
    compressed: bool

    def instrument_symbols(self) -> dict[int, str]:
        """instrument_id -> input symbol from the metadata's symbology mappings."""
        out: dict[int, str] = {}
        for raw_symbol, intervals in (self.metadata.mappings or {}).items():
            for iv in intervals:
                sym = iv["symbol"] if isinstance(iv, dict) else iv.symbol
                if sym and str(sym).isdigit():
                    out[int(sym)] = raw_symbol
        return out


class _HashingFile:
    """A read-only file that feeds every byte read into a hash: the input's digest comes from
    the one pass that decodes it, not from reading the file a second time."""

    def __init__(self, f: BinaryIO, hasher) -> None:
        self.f, self.hasher = f, hasher

    def read(self, n: int = -1) -> bytes:
        b = self.f.read(n)
        self.hasher.update(b)
        return b

    def readinto(self, buf) -> int:
        k = self.f.readinto(buf)
        if k:
            self.hasher.update(memoryview(buf)[:k])
        return k

    def close(self) -> None:
        self.f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _open_decompressed(path: Path, hasher=None) -> tuple[BinaryIO, bool]:
    f = open(path, "rb")
    head = f.read(4)
    f.seek(0)
    if hasher is not None:
        f = _HashingFile(f, hasher)
    if head == ZSTD_MAGIC:
        reader = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True)
        return reader, True
    if (
        len(head) == 4
        and SKIPPABLE_MAGIC_LOW <= struct.unpack("<I", head)[0] <= SKIPPABLE_MAGIC_LOW + 15
    ):
        f.close()
        raise DbnFormatError(
            path,
            "unsupported encoding: legacy DBZ (zstd skippable-frame metadata); "
            "convert it with `dbn --upgrade` or download it again as DBN",
            "byte 0",
        )
    return f, False


def _fill(stream: BinaryIO, view: memoryview, path: Path) -> int:
    """Read into `view` until it is full or the stream ends; the bytes read."""
    got, n = 0, len(view)
    while got < n:
        try:
            k = stream.readinto(view[got:])
        except zstandard.ZstdError as e:
            raise DbnFormatError(path, f"corrupt zstd stream: {e}") from None
        if not k:
            break
        got += k
    return got


def _read_exact(stream: BinaryIO, n: int, path: Path) -> np.ndarray:
    """Up to n bytes (fewer only at the end of the stream), read into one uint8 buffer.

    np.empty, not bytearray: the buffer is not zero-filled, so pages a short file never
    reaches are never touched. Chunk-sized buffers come from the buffer pool."""
    buf = POOL.take(n) if n >= POOLED_BYTES else np.empty(n, dtype=np.uint8)
    with memoryview(buf) as view:
        got = _fill(stream, view, path)
    return buf[:got]


def read_header(stream: BinaryIO, path: Path, compressed: bool) -> DbnHeader:
    prefix = _read_exact(stream, 8, path).tobytes()
    if len(prefix) < 8 or prefix[:3] != DBN_MAGIC:
        raise DbnFormatError(
            path,
            "no DBN metadata header (expected b'DBN' and a version byte): a fragment without "
            "metadata or not a DBN file",
            "byte 0",
        )
    version = prefix[3]
    if version not in SUPPORTED_VERSIONS:
        raise DbnFormatError(
            path, f"unsupported DBN version {version} (supported: 1, 2, 3)", "byte 3"
        )
    (length,) = struct.unpack("<I", prefix[4:8])
    body = _read_exact(stream, length, path)
    if len(body) < length:
        raise DbnFormatError(path, f"truncated metadata: {len(body)} of {length} bytes", "byte 8")
    try:
        meta = dbn.Metadata.decode(prefix + body.tobytes())
    except Exception as e:  # databento_dbn raises its own error types
        raise DbnFormatError(path, f"corrupt metadata: {e}", "byte 8") from None
    schema = str(meta.schema) if meta.schema is not None else None
    if schema not in SCHEMAS:
        raise DbnFormatError(
            path,
            f"unsupported schema {schema!r} in metadata (supported: {', '.join(SCHEMAS)})",
            "metadata",
        )
    layout = SCHEMAS[schema]
    return DbnHeader(
        metadata=meta,
        version=version,
        schema=schema,
        layout=layout,
        dtype=layout.dtype(version, bool(meta.ts_out)),
        header_bytes=8 + length,
        compressed=compressed,
    )


@dataclass
class Chunk:
    records: np.ndarray
    first_index: int
    """Index in the file of the chunk's first record."""
    first_offset: int
    """Byte offset (in the decompressed stream) of the chunk's first record."""


def _open(path: Path, hasher) -> tuple[BinaryIO, DbnHeader]:
    stream, compressed = _open_decompressed(path, hasher)
    try:
        return stream, read_header(stream, path, compressed)
    except BaseException:
        stream.close()
        raise


def _truncated(path: Path, header: DbnHeader, index: int, rest: int, allow: bool) -> Exception:
    """The error for a trailing partial record after `index` whole ones."""
    size = header.dtype.itemsize
    if allow:
        return TruncatedTail(path, index, rest, size)
    return DbnFormatError(
        path,
        f"truncated file: last record has {rest} of {size} bytes",
        f"record {index} (byte {header.header_bytes + index * size})",
    )


def iter_chunks(
    path: os.PathLike | str,
    chunk_records: int = 1 << 18,
    allow_truncated_tail: bool = False,
    hasher=None,
) -> tuple[DbnHeader, Iterator[Chunk]]:
    """The header, and an iterator over the records in chunks of at most `chunk_records`.

    Memory stays bounded by one chunk. A trailing partial record is an error, or with
    `allow_truncated_tail` it is dropped and reported through `TruncatedTail` at the end.
    A `hasher` (hashlib object) receives the file's bytes as they are read; once the iterator
    is exhausted it holds the digest of the whole file.
    """
    path = Path(path)
    stream, header = _open(path, hasher)
    return header, _record_chunks(stream, header, path, chunk_records, allow_truncated_tail)


def _record_chunks(
    stream: BinaryIO, header: DbnHeader, path: Path, chunk_records: int, allow: bool
) -> Iterator[Chunk]:
    itemsize = header.dtype.itemsize
    index = 0
    with stream:
        while True:
            buf = _read_exact(stream, itemsize * chunk_records, path)
            whole = len(buf) // itemsize
            if whole:
                arr = buf[: whole * itemsize].view(header.dtype)
                yield Chunk(arr, index, header.header_bytes + index * itemsize)
                index += whole
            if rest := len(buf) - whole * itemsize:
                raise _truncated(path, header, index, rest, allow)
            if len(buf) < itemsize * chunk_records:
                return


@dataclass
class ColumnChunk:
    columns: RecordColumns
    first_index: int
    """Index in the file of the chunk's first record."""
    first_offset: int
    """Byte offset (in the decompressed stream) of the chunk's first record."""


# Bytes decompressed per read when building columns: a piece stays in the core's L2 cache
# between the read and its transpose.
PIECE_BYTES = 1 << 19


def iter_column_chunks(
    path: os.PathLike | str,
    chunk_records: int = 1 << 17,
    allow_truncated_tail: bool = False,
    hasher=None,
) -> tuple[DbnHeader, Iterator[ColumnChunk]]:
    """Like `iter_chunks`, but each chunk comes as columns (`RecordColumns`) with every column
    already extracted. The file is read in cache-sized pieces, each transposed straight into
    the chunk's columns, so no chunk-sized record array is ever filled (one pass over memory
    fewer), and under `read_ahead` the transposes run on the reader thread with the
    decompression. Every record layout is a whole number of 8-byte words (a test checks)."""
    path = Path(path)
    stream, header = _open(path, hasher)
    size = header.dtype.itemsize

    def gen() -> Iterator[ColumnChunk]:
        per_piece = max(PIECE_BYTES // size, 1)
        piece = np.empty(per_piece * size, dtype=np.uint8)
        index = 0
        with stream, memoryview(piece) as view:
            while True:
                words = POOL.take(size * chunk_records).view(np.uint64)
                words = words.reshape(size // 8, chunk_records)
                n, rest, end = 0, 0, False
                while n < chunk_records and not end:
                    want = min(per_piece, chunk_records - n) * size
                    got = _fill(stream, view[:want], path)
                    whole, rest = divmod(got, size)
                    transpose_into(words, n, piece[: whole * size])
                    n += whole
                    end = got < want
                if n:
                    cols = RecordColumns.from_words(words[:, :n], header.dtype).materialize()
                    yield ColumnChunk(cols, index, header.header_bytes + index * size)
                    index += n
                if rest:
                    raise _truncated(path, header, index, rest, allow_truncated_tail)
                if end:
                    return

    return header, gen()


def read_ahead(items: Iterator[T], depth: int = 1) -> Iterator[T]:
    """Iterate `items` on a background thread, up to `depth` items ahead. File reads and zstd
    decompression release the GIL, so the next chunk is decoded while the caller works on this
    one. An error is raised where it happened in the sequence; closing the generator (or
    leaving a loop over it early) stops the thread."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    end = object()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for x in items:
                if not put((x, None)):
                    return
            put((end, None))
        except BaseException as e:  # handed to the consumer, raised there
            put((end, e))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    worker = threading.Thread(target=run, name="dbn-read-ahead", daemon=True)
    worker.start()
    try:
        while True:
            x, err = q.get()
            if x is end:
                if err is not None:
                    raise err
                return
            yield x
    finally:
        stop.set()
        worker.join()


class TruncatedTail(Exception):
    def __init__(self, path: Path, index: int, rest: int, itemsize: int) -> None:
        super().__init__(f"{path}: {rest} trailing bytes of a {itemsize}-byte record at {index}")
        self.index = index
        self.rest = rest


def encode_metadata(
    dataset: str,
    schema: str,
    start_ns: int,
    end_ns: int,
    symbols: dict[str, int],
    start_date,
    end_date,
    stype_in: dbn.SType = dbn.SType.RAW_SYMBOL,
    version: int = 3,
) -> bytes:
    """DBN metadata bytes for a file whose records carry `symbols` (raw symbol -> instrument id)."""
    from types import SimpleNamespace as NS

    mappings = [
        NS(raw_symbol=s, intervals=[NS(start_date=start_date, end_date=end_date, symbol=str(i))])
        for s, i in symbols.items()
    ]
    meta = dbn.Metadata(
        dataset=dataset,
        start=start_ns,
        end=end_ns,
        stype_in=stype_in,
        stype_out=dbn.SType.INSTRUMENT_ID,
        schema=dbn.Schema(schema),
        symbols=list(symbols),
        partial=[],
        not_found=[],
        mappings=mappings,
        version=version,
    )
    return bytes(meta)


def write_dbn(
    path: os.PathLike | str, metadata: bytes, records: np.ndarray | bytes, level: int = 1
) -> int:
    """Write a DBN file atomically (temporary file, then rename); `.zst` names are compressed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    payload = records if isinstance(records, bytes | bytearray | memoryview) else records.data
    with open(tmp, "wb") as f:
        if path.suffix == ".zst":
            cctx = zstandard.ZstdCompressor(level=level)
            with cctx.stream_writer(f, closefd=False) as w:
                w.write(metadata)
                w.write(payload)
        else:
            f.write(metadata)
            f.write(payload)
    os.replace(tmp, path)
    return path.stat().st_size


def read_all(path: os.PathLike | str) -> tuple[DbnHeader, np.ndarray]:
    """Every record of a (small) file in one array. Tests and tools; ingest streams."""
    header, chunks = iter_chunks(path, chunk_records=1 << 16)
    parts = [c.records for c in chunks]
    recs = np.concatenate(parts) if parts else np.zeros(0, dtype=header.dtype)
    return header, recs


def raw_bytes(path: os.PathLike | str) -> bytes:
    """The decompressed stream of a DBN file."""
    path = Path(path)
    stream, _ = _open_decompressed(path)
    with stream:
        out = io.BytesIO()
        while b := stream.read(1 << 24):
            out.write(b)
    return out.getvalue()
