"""Small DBN files made in the tests: MBP-10 records, metadata, zstd framing with known
block and frame boundaries."""

from __future__ import annotations

import datetime as dt
import io

import numpy as np
import zstandard

from foxhunt.dbn.io import encode_metadata
from foxhunt.dbn.layout import MBP10_DTYPE

NAME = "glbx-mdp3-20240102.mbp-10.dbn.zst"


def meta(schema="mbp-10") -> bytes:
    day = dt.date(2024, 1, 2)
    return encode_metadata("GLBX.MDP3", schema, 0, 10**18, {"ESH4": 42}, day, day)


def mbp_records(n: int, iid: int = 42, t0: int = 1_704_205_800_000_000_000) -> np.ndarray:
    r = np.zeros(n, dtype=MBP10_DTYPE)
    r["length"] = MBP10_DTYPE.itemsize // 4
    r["rtype"] = 0x0A
    r["publisher_id"] = 1
    r["instrument_id"] = iid
    t = t0 + np.arange(n) * 1_000_000
    r["ts_event"], r["ts_recv"] = t, t + 5_000
    r["sequence"] = np.arange(n) + 1
    r["action"], r["side"] = b"A", b"B"
    r["size"], r["price"] = 3, 4_800_000_000_000
    for i in range(10):
        r[f"bid_px_{i:02d}"] = 4_800_000_000_000 - i * 250_000_000
        r[f"ask_px_{i:02d}"] = 4_800_250_000_000 + i * 250_000_000
        r[f"bid_sz_{i:02d}"] = r[f"ask_sz_{i:02d}"] = 10
    return r


def zstd_file(payload: bytes, frames: int = 3, blocks_per_frame: int = 4) -> tuple[bytes, list]:
    """`payload` compressed as several frames of several blocks each (with checksums, as
    Databento writes them); also every block and frame boundary's byte offset."""
    bio = io.BytesIO()
    cuts = []
    per_frame = -(-len(payload) // frames)
    for f in range(frames):
        part = payload[f * per_frame : (f + 1) * per_frame]
        w = zstandard.ZstdCompressor(level=1, write_checksum=True).stream_writer(bio, closefd=False)
        step = -(-len(part) // blocks_per_frame)
        for b in range(0, len(part), step):
            w.write(part[b : b + step])
            w.flush(zstandard.FLUSH_BLOCK)
            cuts.append(bio.tell())
        w.flush(zstandard.FLUSH_FRAME)
        cuts.append(bio.tell())
    return bio.getvalue(), sorted(set(cuts))
