"""Property tests of ingest over damaged files: random truncations (weighted to zstd block and
frame boundaries, where zstd itself sees nothing wrong), byte flips and record shuffles. Every
case ends in a clear error naming the file, or in rows that are exactly right: never exit 0
with wrong or silently missing rows."""

from __future__ import annotations

import tempfile
from pathlib import Path

import databento_dbn
import numpy as np
import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dbnfiles import NAME, mbp_records, meta, zstd_file
from foxhunt.ingest.core import IngestConfig, IngestError, load_manifest, run_ingest

RECS = mbp_records(240)
META = meta()
PLAIN = META + RECS.tobytes()
ZST, CUTS = zstd_file(PLAIN, frames=3, blocks_per_frame=3)
FUZZ = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


def _run(data: bytes, name: str = NAME, **kw):
    """(rows as a sorted polars frame or None, manifest or None, error message or None)."""
    with tempfile.TemporaryDirectory() as d:
        raw = Path(d) / "raw"
        raw.mkdir()
        (raw / name).write_bytes(data)
        try:
            run_ingest(IngestConfig(raw=raw, out=Path(d) / "out", workers=1, **kw))
        except IngestError as e:
            return None, None, str(e)
        out = Path(d) / "out"
        # one instrument and day: the parts in name order are the rows in file order
        parts = sorted(out.glob("schema=mbp-10/**/*.parquet"))
        rows = pl.read_parquet(parts) if parts else None
        return rows, load_manifest(out), None


def _seqs(rows) -> list[int]:
    return [] if rows is None else rows["sequence"].to_list()


cut_points = st.one_of(
    st.sampled_from(CUTS[:-1]),  # block and frame boundaries
    st.sampled_from([c + d for c in CUTS[:-1] for d in (1, 3, 4)]),  # inside headers, checksums
    st.integers(0, len(ZST) - 1),
)


@FUZZ
@given(cut=cut_points)
def test_a_cut_zstd_file_is_an_error_or_a_flagged_true_prefix(cut):
    rows, _, err = _run(ZST[:cut])
    assert rows is None and NAME in err, (cut, err)
    rows, man, err = _run(ZST[:cut], on_error="quarantine")
    if err is not None:  # e.g. cut inside the metadata: nothing can be read at all
        assert NAME in err
        return
    seqs = _seqs(rows)
    assert seqs == list(range(1, len(seqs) + 1))  # a prefix of the true records, in order
    v = man["validation"]
    assert v["truncated"].get(NAME) or v["quarantined"].get(NAME), (cut, v)


@FUZZ
@given(cut=st.integers(0, len(PLAIN) - 1))
def test_a_cut_plain_file_is_an_error_unless_cut_between_records(cut):
    rows, _, err = _run(PLAIN[:cut], name=NAME.removesuffix(".zst"))
    whole, rest = divmod(cut - len(META), RECS.itemsize)
    if cut >= len(META) and rest == 0:
        # Cut exactly between records, a plain file cannot tell (DBN has no record count):
        # the rows are then exactly the records before the cut.
        assert err is None and _seqs(rows) == list(range(1, whole + 1))
    else:
        assert rows is None and NAME.removesuffix(".zst") in err


@FUZZ
@given(at=st.integers(0, len(ZST) - 1), bit=st.integers(0, 7))
def test_a_flipped_bit_in_a_zstd_file_is_an_error_or_changes_nothing(at, bit):
    """Databento's files (and ours) carry zstd content checksums: a flip in the data is an
    error. (A few header bits carry no meaning, such as the frame descriptor's unused bit.)"""
    data = bytearray(ZST)
    data[at] ^= 1 << bit
    rows, _, err = _run(bytes(data))
    if err is None:
        assert _seqs(rows) == list(range(1, 241)), (at, bit)
    else:
        assert rows is None and NAME in err


@FUZZ
@given(at=st.integers(len(META), len(PLAIN) - 1), bit=st.integers(0, 7))
def test_a_flipped_bit_in_a_plain_file_is_refused_or_read_as_databento_reads_it(at, bit):
    """No checksum here: a flip that breaks no rule is data; then the rows are exactly what
    Databento's own decoder reads from the same bytes."""
    data = bytearray(PLAIN)
    data[at] ^= 1 << bit
    rows, _, err = _run(bytes(data), name=NAME.removesuffix(".zst"))
    if err is not None:
        assert NAME.removesuffix(".zst") in err
        return
    dec = databento_dbn.DBNDecoder()
    dec.write(bytes(data))
    ref = [r for r in dec.decode() if isinstance(r, databento_dbn.MBP10Msg)]
    cols = [pl.col("ts_event").cast(pl.Int64), "price", "size", "sequence", "instrument_id"]
    got = rows.select(cols).rows()
    assert got == [(r.ts_event, r.price, r.size, r.sequence, r.instrument_id) for r in ref]


@FUZZ
@given(perm=st.permutations(range(12)), start=st.integers(0, 228))
def test_shuffled_records_fail_or_lose_exactly_the_fewest(perm, start):
    """Records [start, start + 12) shuffled: failing names the break; set aside, the records
    dropped are as few as any non-decreasing selection allows, and the rest stay in order."""
    order = np.arange(240)
    order[start : start + 12] = start + np.array(perm)
    recs = RECS[order]
    data, _ = zstd_file(META + recs.tobytes(), frames=1)
    moved = list(perm) != sorted(perm)
    rows, _, err = _run(data)
    assert (err is not None) == moved and (not moved or "goes backwards" in err)
    rows, man, err = _run(data, on_error="quarantine", chunk_records=7)
    kept = _seqs(rows)
    ts = rows["ts_event"].cast(pl.Int64).to_numpy()
    assert (np.diff(ts) >= 0).all()  # what is kept is in order, in file order
    assert 240 - len(kept) == 12 - _longest_increasing(list(perm))
    q = man["validation"]["quarantined"]
    assert sum(q.get(NAME, {}).values()) == 240 - len(kept)


def _longest_increasing(xs: list[int]) -> int:
    """Length of a longest increasing subsequence, by the O(n^2) textbook recurrence."""
    best = [1] * len(xs)
    for i in range(len(xs)):
        for j in range(i):
            if xs[j] < xs[i]:
                best[i] = max(best[i], best[j] + 1)
    return max(best, default=0)
