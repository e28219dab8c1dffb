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
from foxhunt.fsutil import temp_path

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


class ZstdFrames:
    """Follows the frame structure of a zstd stream as its bytes go by (RFC 8878, section 3):
    frame headers, block headers, content checksums and skippable frames. zstd's streaming
    decoder returns end-of-data for a stream cut at any block boundary (a download or copy cut
    short reads as a shorter, valid file); `problem()` after the last byte says whether the
    stream ended anywhere but at the end of a frame. Block bodies are skipped, not parsed, so
    following a stream costs a few Python steps per 128 KB block."""

    # States whose bytes are parsed (kept); the others (header rest, block bodies) are skipped.
    _PARSE = frozenset(("magic", "descriptor", "block", "skip_size"))

    def __init__(self) -> None:
        self.pos = 0  # compressed bytes seen
        self.state, self.need = "magic", 4
        self.buf = bytearray()
        self.frames = 0
        self.checksum = False
        self.error: str | None = None
        self.started = 0  # where the current frame started

    def update(self, data) -> None:
        view, i, n = memoryview(data), 0, len(data)
        while i < n and self.error is None:
            take = min(self.need, n - i)
            if self.state in self._PARSE:
                self.buf += view[i : i + take]
            i += take
            self.pos += take
            self.need -= take
            if self.need == 0:
                self._next()

    def _next(self) -> None:
        b, st = bytes(self.buf), self.state
        self.buf.clear()
        if st == "magic":
            (magic,) = struct.unpack("<I", b)
            self.started = self.pos - 4
            if magic == 0xFD2FB528:
                self.state, self.need = "descriptor", 1
            elif SKIPPABLE_MAGIC_LOW <= magic <= SKIPPABLE_MAGIC_LOW + 15:
                self.state, self.need = "skip_size", 4
            else:
                self.error = f"no zstd frame starts at compressed byte {self.started}"
        elif st == "descriptor":
            d = b[0]
            single, did = (d >> 5) & 1, d & 3
            self.checksum = bool((d >> 2) & 1)
            if (d >> 3) & 1:
                self.error = f"reserved bit set in the zstd frame at byte {self.started}"
                return
            fcs = (single, 2, 4, 8)[d >> 6]
            self.state, self.need = "header_rest", (1 - single) + (0, 1, 2, 4)[did] + fcs
            if self.need == 0:
                self.state, self.need = "block", 3
        elif st == "header_rest":
            self.state, self.need = "block", 3
        elif st == "block":
            v = b[0] | b[1] << 8 | b[2] << 16
            last, kind, size = v & 1, (v >> 1) & 3, v >> 3
            if kind == 3:
                self.error = f"reserved block type at compressed byte {self.pos - 3}"
                return
            self.state = "last_body" if last else "body"
            self.need = 1 if kind == 1 else size  # an RLE block stores one byte
            if self.need == 0:
                self._next()
        elif st == "body":
            self.state, self.need = "block", 3
        elif st == "last_body":
            self.state, self.need = ("checksum", 4) if self.checksum else ("magic", 4)
            if not self.checksum:
                self.frames += 1
        elif st == "checksum":
            self.state, self.need = "magic", 4
            self.frames += 1
        elif st == "skip_size":
            self.state, self.need = "skip_body", struct.unpack("<I", b)[0]
            if self.need == 0:
                self.state, self.need = "magic", 4
        elif st == "skip_body":
            self.state, self.need = "magic", 4

    def problem(self) -> str | None:
        """None when the stream seen so far ends at the end of a frame; else what is wrong."""
        if self.error:
            return self.error
        if self.state == "magic" and self.need == 4 and self.frames:
            return None
        where = {
            "checksum": "inside the content checksum",
            "block": "inside a block header" if self.buf else "after a block that is not the last",
            "body": "inside a block",
            "last_body": "inside the last block",
        }.get(self.state, "inside the header")
        return (
            f"truncated zstd stream: the file ends {where} of the zstd frame that "
            f"starts at compressed byte {self.started} ({self.pos} bytes read); the download "
            "or copy was cut short"
        )


class _TappedFile:
    """A read-only file that hands every byte read to `taps` (a hash, a `ZstdFrames`): the
    input's digest and framing come from the one pass that decodes it."""

    def __init__(self, f: BinaryIO, taps: list) -> None:
        self.f, self.taps = f, taps

    def read(self, n: int = -1) -> bytes:
        b = self.f.read(n)
        for t in self.taps:
            t.update(b)
        return b

    def readinto(self, buf) -> int:
        k = self.f.readinto(buf)
        if k:
            with memoryview(buf) as view:
                for t in self.taps:
                    t.update(view[:k])
        return k

    def close(self) -> None:
        self.f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _open_decompressed(path: Path, hasher=None) -> tuple[BinaryIO, ZstdFrames | None]:
    """The decompressed stream, and for zstd the `ZstdFrames` that follows its framing."""
    f = open(path, "rb")
    head = f.read(4)
    f.seek(0)
    frames = ZstdFrames() if head == ZSTD_MAGIC else None
    taps = [t for t in (hasher, frames) if t is not None]
    if taps:
        f = _TappedFile(f, taps)
    if frames is not None:
        reader = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True)
        return reader, frames
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
    return f, None


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


def _open(path: Path, hasher) -> tuple[BinaryIO, DbnHeader, ZstdFrames | None]:
    stream, frames = _open_decompressed(path, hasher)
    try:
        return stream, read_header(stream, path, frames is not None), frames
    except BaseException:
        stream.close()
        raise


def _truncated(path: Path, header: DbnHeader, index: int, rest: int, allow: bool) -> Exception:
    """The error for a trailing partial record after `index` whole ones."""
    size = header.dtype.itemsize
    rule = f"truncated file: last record has {rest} of {size} bytes"
    where = f"record {index} (byte {header.header_bytes + index * size})"
    return Truncated(path, index, rule, where) if allow else DbnFormatError(path, rule, where)


def _check_end(path: Path, frames: ZstdFrames | None, index: int, allow: bool) -> None:
    """At the end of the decompressed stream: raise unless the zstd framing ended whole."""
    if frames is not None and (problem := frames.problem()):
        where = f"record {index}"
        raise (
            Truncated(path, index, problem, where)
            if allow
            else DbnFormatError(path, problem, where)
        )


def iter_chunks(
    path: os.PathLike | str,
    chunk_records: int = 1 << 18,
    allow_truncated: bool = False,
    hasher=None,
) -> tuple[DbnHeader, Iterator[Chunk]]:
    """The header, and an iterator over the records in chunks of at most `chunk_records`.

    Memory stays bounded by one chunk. A file that ends early (a partial last record, a zstd
    frame cut short) is an error, or with `allow_truncated` the whole records before the cut
    are yielded and `Truncated` is raised at the end.
    A `hasher` (hashlib object) receives the file's bytes as they are read; once the iterator
    is exhausted it holds the digest of the whole file.
    """
    path = Path(path)
    stream, header, frames = _open(path, hasher)
    return header, _record_chunks(stream, header, frames, path, chunk_records, allow_truncated)


def _record_chunks(
    stream: BinaryIO,
    header: DbnHeader,
    frames: ZstdFrames | None,
    path: Path,
    chunk_records: int,
    allow: bool,
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
                _check_end(path, frames, index, allow)
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
    allow_truncated: bool = False,
    hasher=None,
) -> tuple[DbnHeader, Iterator[ColumnChunk]]:
    """Like `iter_chunks`, but each chunk comes as columns (`RecordColumns`) with every column
    already extracted. The file is read in cache-sized pieces, each transposed straight into
    the chunk's columns, so no chunk-sized record array is ever filled (one pass over memory
    fewer), and under `read_ahead` the transposes run on the reader thread with the
    decompression. Every record layout is a whole number of 8-byte words (a test checks)."""
    path = Path(path)
    stream, header, frames = _open(path, hasher)
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
                    raise _truncated(path, header, index, rest, allow_truncated)
                if end:
                    _check_end(path, frames, index, allow_truncated)
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


class Truncated(Exception):
    """The file ends early (a partial last record, or a zstd frame cut short) after `index`
    whole records; raised in place of `DbnFormatError` when the caller accepts a truncated
    file (quarantine), which then knows what it read and that the rest is missing."""

    def __init__(self, path: Path, index: int, rule: str, where: str) -> None:
        super().__init__(f"{path} at {where}: {rule}")
        self.index, self.rule = index, rule


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
    """Write a DBN file atomically (temporary file, then rename); `.zst` names are compressed,
    with a content checksum as Databento's files carry (a flipped bit is then an error)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    payload = records if isinstance(records, bytes | bytearray | memoryview) else records.data
    with open(tmp, "wb") as f:
        if path.suffix == ".zst":
            cctx = zstandard.ZstdCompressor(level=level, write_checksum=True)
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
