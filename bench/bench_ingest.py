"""Synth and ingest throughput on this machine, beside the raw decode rate of the same files.

    make bench          (or: .venv/bin/python bench/bench_ingest.py [--days 20] [--repeats 3])

Raw decode = read the file (and zstd-decompress it, streaming into one reused buffer), then
np.frombuffer over the records: the floor any DBN reader pays. Ingest = `foxhunt ingest` on
the same file: decode, validate every rule, convert to Arrow and write Parquet. Figures go to
docs/performance.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing as mp
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import zstandard

from foxhunt.dbn.io import encode_metadata, iter_chunks, read_header, write_dbn
from foxhunt.ingest.core import IngestConfig, run_ingest
from foxhunt.synth.contracts import ROOTS, front_and_next, trading_days
from foxhunt.synth.generate import SynthConfig, generate
from foxhunt.synth.market import MarketParams, bar_path, day_records, quarter_index


def _best(f, repeats: int, setup=None) -> tuple[float, list[float]]:
    """Median seconds of `f()` over `repeats` calls; `setup()` runs untimed before each."""
    times = []
    for _ in range(repeats):
        if setup is not None:
            setup()
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return statistics.median(times), times


def _paired(decode, ingest, repeats: int, setup) -> tuple[float, float, float]:
    """Median seconds of `decode()` and of `ingest()`, timed in alternation, and the median of
    the per-pair ratios decode/ingest. The VM's speed drifts by a third within a minute; a
    ratio of two figures taken seconds apart in the same pair cancels most of that."""
    dec, ing = [], []
    for _ in range(repeats):
        dec.append(_best(decode, 1)[0])
        ing.append(_best(ingest, 1, setup)[0])
    ratios = [d / i for d, i in zip(dec, ing, strict=True)]
    return statistics.median(dec), statistics.median(ing), statistics.median(ratios)


def _clear(d: Path) -> None:
    """Delete the previous repeat's output before a timed one. Outside the timing: the kernel
    may still be writing those pages back, and deleting them waits for that (up to half the
    time of a repeat here), which is the benchmark's doing, not the step's."""
    shutil.rmtree(d, ignore_errors=True)


def synth_rate(days: int, repeats: int, tmp: Path) -> dict[str, float]:
    """One core: generate MBP-10 days of ES and write them as .dbn and .dbn.zst."""
    spec, p = ROOTS["ES"], MarketParams()
    ds = trading_days(dt.date(2024, 4, 1), dt.date(2024, 7, 1))[:days]
    path = bar_path(spec, ds, p, 7)
    bq = quarter_index(front_and_next("ES", ds[0])[0])
    meta = encode_metadata("GLBX.MDP3", "mbp-10", 0, 1, {"ESM4": 1}, ds[0], ds[-1])
    out = {}
    n = sum(len(day_records(spec, path, i, p, 7, bq).mbp10) for i in range(len(ds)))
    dest = tmp / "synth"
    for ext in (".dbn", ".dbn.zst"):

        def run(ext=ext):
            for i in range(len(ds)):
                write_dbn(
                    dest / f"s{i}.mbp-10{ext}", meta, day_records(spec, path, i, p, 7, bq).mbp10
                )

        sec, _ = _best(run, repeats, setup=lambda: _clear(dest))
        out[ext] = n / sec
    return out


def one_file(days: int, tmp: Path) -> tuple[dict[str, Path], int]:
    """One MBP-10 file of `days` trading days of ES, plain and zstd."""
    spec, p = ROOTS["ES"], MarketParams()
    ds = trading_days(dt.date(2024, 4, 1), dt.date(2024, 7, 1))[:days]
    path = bar_path(spec, ds, p, 7)
    bq = quarter_index(front_and_next("ES", ds[0])[0])
    recs = np.concatenate([day_records(spec, path, i, p, 7, bq).mbp10 for i in range(len(ds))])
    recs = recs[recs["instrument_id"] == recs["instrument_id"][0]]  # one contract, outside the roll
    meta = encode_metadata(
        "GLBX.MDP3", "mbp-10", 0, 1, {"ESM4": int(recs["instrument_id"][0])}, ds[0], ds[-1]
    )
    files = {}
    for ext in (".dbn", ".dbn.zst"):
        d = tmp / f"in{ext.replace('.', '_')}"
        d.mkdir()
        f = d / f"glbx-mdp3-bench.mbp-10{ext}"
        write_dbn(f, meta, recs)
        files[ext] = f
    return files, len(recs)


def raw_decode(f: Path) -> int:
    """Records in the file, decoded the cheapest way: a plain file read whole and viewed; a
    zstd file decompressed in 16 MB pieces into one reused buffer (no copies, no fresh pages),
    each piece viewed as records."""
    with open(f, "rb") as fh:
        header = read_header(fh, f, False) if f.suffix == ".dbn" else None
    if header is not None:  # plain file: read it, view the records
        data = np.fromfile(f, dtype=np.uint8)
        return len(data[header.header_bytes :].view(header.dtype))
    header, _ = iter_chunks(f)
    size = header.dtype.itemsize
    buf = np.empty((16 << 20) // size * size, dtype=np.uint8)
    n = rest = 0
    with (
        open(f, "rb") as fh,
        zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True) as r,
    ):
        r.read(header.header_bytes)  # the metadata
        while k := r.readinto(buf[rest:]):
            k += rest
            whole = k // size * size
            n += len(buf[:whole].view(header.dtype))
            rest = k - whole  # a record split between two reads: keep its start
            buf[:rest] = buf[whole:k]
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=int, default=30, help="trading days in the single-file test")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--month-days", type=int, default=21, help="trading days of day files")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="foxhunt-bench-"))
    try:
        print(
            f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
            f"python {platform.python_version()}, {dt.date.today()}"
        )
        rates = synth_rate(min(args.days, 10), max(args.repeats, 5), tmp)
        print(
            f"synth, 1 core:     {rates['.dbn'] / 1e6:5.2f} M MBP-10 records/s to .dbn, "
            f"{rates['.dbn.zst'] / 1e6:5.2f} M/s to .dbn.zst"
        )
        files, n = one_file(args.days, tmp)
        print(f"\nsingle MBP-10 file of {n:,} records ({args.days} days), one process:")
        print(f"{'file':10} {'raw decode M/s':>15} {'ingest M/s':>11} {'ratio':>6}")
        # The last row writes uncompressed Parquet (--compression none, ~5.6x the disk): what
        # the LZ4 step costs, for comparison only.
        for ext, compression in ((".dbn", "lz4"), (".dbn.zst", "lz4"), (".dbn.zst", "none")):
            f = files[ext]

            def ingest(f=f, compression=compression):
                cfg = IngestConfig(
                    raw=f.parent, out=tmp / "out", workers=1, force=True, compression=compression
                )
                run_ingest(cfg)

            dec, ing, ratio = _paired(
                lambda f=f: raw_decode(f), ingest, args.repeats, lambda: _clear(tmp / "out")
            )
            name = ext if compression == "lz4" else f"{ext} (Parquet uncompressed)"
            print(f"{name:10} {n / dec / 1e6:15.2f} {n / ing / 1e6:11.2f} {ratio:6.0%}")

        # The demo layout: one MBP-10 file per root and day, all cores for decode and ingest.
        cores = os.cpu_count() or 1
        print(
            f"\nMBP-10 day files of ES and NQ ({args.month_days} trading days), {cores} processes:"
        )
        print(
            f"{'files':10} {'records':>10} {'raw decode M/s':>15} {'ingest M/s':>11} {'ratio':>6}"
        )
        for compress in (False, True):
            raw = tmp / f"month-{compress}"
            res = generate(
                SynthConfig(
                    out=raw,
                    start=dt.date(2024, 4, 1),
                    end=dt.date(2024, 7, 1),
                    schemas=("mbp-10",),
                    compress=compress,
                ),
            )
            files = sorted(raw.rglob("*.dbn*"))[: 2 * args.month_days]
            for f in sorted(raw.rglob("*.dbn*")):
                if f not in files:
                    f.unlink()
            n = sum(raw_decode(f) for f in files)

            def ingest(raw=raw):
                run_ingest(IngestConfig(raw=raw, out=tmp / "out-month", force=True))

            with mp.get_context("fork").Pool(cores) as pool:
                dec, ing, ratio = _paired(
                    lambda files=files: sum(pool.map(raw_decode, files)),
                    ingest,
                    args.repeats,
                    lambda: _clear(tmp / "out-month"),
                )
            ext = ".dbn.zst" if compress else ".dbn"
            print(f"{ext:10} {n:10,} {n / dec / 1e6:15.2f} {n / ing / 1e6:11.2f} {ratio:6.0%}")
            del res
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
