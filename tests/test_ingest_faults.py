"""Ingest never writes wrong rows with exit 0: files cut short (on zstd block and frame
boundaries too), records out of order, files that are not their schema, garbage letters, and the
same records in two input files."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from dbnfiles import NAME, mbp_records, meta, zstd_file
from foxhunt.dbn.layout import MBP10_DTYPE, TRADE_DTYPE
from foxhunt.ingest.core import IngestConfig, IngestError, load_manifest, run_ingest
from foxhunt.ingest.validate import RULE_ACTION, RULE_ORDER, RULE_RTYPE


def _ingest(raw: Path, out: Path, **kw):
    return run_ingest(IngestConfig(raw=raw, out=out, **({"workers": 1} | kw)))


@pytest.fixture(scope="module")
def zfile():
    recs = mbp_records(600)
    data, cuts = zstd_file(meta() + recs.tobytes())
    return recs, data, cuts


def test_a_zstd_file_cut_on_any_block_or_frame_boundary_is_refused(tmp_path, zfile):
    _, data, cuts = zfile
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / NAME).write_bytes(data)
    assert len(_read(_ingest(raw, tmp_path / "whole").out)) == 600  # the whole file is fine
    messages = set()
    for cut in cuts[:-1]:
        (raw / NAME).write_bytes(data[:cut])
        with pytest.raises(IngestError, match=rf"{NAME} at .*: truncated") as e:
            _ingest(raw, tmp_path / "out")
        messages.add(str(e.value).split(": ", 1)[1].split(":")[0])
        assert not (tmp_path / "out").exists()
    # inside the metadata, inside a record, or (what zstd alone would accept) between records
    assert messages == {"truncated metadata", "truncated file", "truncated zstd stream"}


def test_quarantine_keeps_what_precedes_a_cut_and_says_the_file_is_truncated(tmp_path, zfile):
    recs, data, cuts = zfile
    raw = tmp_path / "raw"
    raw.mkdir()
    cut = cuts[len(cuts) // 2]
    (raw / NAME).write_bytes(data[:cut])
    res = _ingest(raw, tmp_path / "out", on_error="quarantine")
    got = _read(tmp_path / "out")
    n = res.files[0].written
    assert 0 < n < 600 and got["sequence"].to_list() == recs["sequence"][:n].tolist()
    v = load_manifest(tmp_path / "out")["validation"]
    assert v["truncated"][NAME]["after_record"] == n and "TRUNCATED" in res.summary()
    assert v["quarantined"] == {}  # nothing is counted as a set-aside record that was not one


def _write(tmp_path, recs: np.ndarray, schema="mbp-10", name=NAME) -> Path:
    raw = tmp_path / "raw"
    raw.mkdir(exist_ok=True)
    data, _ = zstd_file(meta(schema) + recs.tobytes(), frames=1, blocks_per_frame=1)
    (raw / name).write_bytes(data)
    return raw


def _read(out: Path) -> pl.DataFrame:
    return pl.read_parquet(out / "schema=mbp-10" / "**" / "*.parquet").sort("sequence")


@pytest.mark.parametrize("at", [17, 9, 10, 0, 99])
def test_a_displaced_record_is_the_one_set_aside(tmp_path, at):
    """One record with a time far in the future (chunks of 10: also at a chunk's last and first
    record, and at the file's ends): it alone is quarantined, its valid neighbours are kept."""
    recs = mbp_records(100)
    recs["ts_event"][at] += 3_600_000_000_000
    raw = _write(tmp_path, recs)
    res = _ingest(raw, tmp_path / "out", on_error="quarantine", chunk_records=10)
    q = load_manifest(tmp_path / "out")["validation"]["quarantined"]
    if at == 99:  # the last record moved later keeps the order: nothing to set aside
        assert q == {} and res.files[0].written == 100
        return
    assert q == {NAME: {RULE_ORDER: 1}}
    assert _read(tmp_path / "out")["sequence"].to_list() == [i + 1 for i in range(100) if i != at]


def test_records_swapped_cost_the_fewestmbp_records(tmp_path):
    recs = mbp_records(100)
    order = np.arange(100)
    order[[40, 41]] = order[[41, 40]]  # two neighbours swapped: one is out of order
    order[60:70] = order[60:70][::-1]  # ten reversed: nine are
    raw = _write(tmp_path, recs[order])
    _ingest(raw, tmp_path / "out", on_error="quarantine", chunk_records=16)
    q = load_manifest(tmp_path / "out")["validation"]["quarantined"]
    assert q == {NAME: {RULE_ORDER: 10}}
    ts = _read(tmp_path / "out").sort("ts_recv")["ts_event"].cast(pl.Int64).to_numpy()
    assert len(ts) == 90 and (np.diff(ts) >= 0).all()


def test_a_file_that_is_not_its_schema_is_quarantined_whole(tmp_path):
    """Trade records behind an MBP-10 header: the framing is wrong from the first record."""
    t = np.zeros(400, dtype=TRADE_DTYPE)
    t["length"], t["rtype"], t["instrument_id"] = TRADE_DTYPE.itemsize // 4, 0, 7
    t["ts_event"] = np.arange(400) * 12345
    t["action"], t["side"], t["price"] = b"T", b"\xff", 99
    good = mbp_records(20, t0=1_704_300_000_000_000_000)
    raw = _write(tmp_path, t)
    with pytest.raises(IngestError, match=rf"{NAME} at record 0 .*{RULE_RTYPE}"):
        _ingest(raw, tmp_path / "out")
    _write(tmp_path, good, name="glbx-mdp3-20240103.mbp-10.dbn.zst")
    res = _ingest(raw, tmp_path / "out", on_error="quarantine")
    man = load_manifest(tmp_path / "out")
    n_records = 400 * TRADE_DTYPE.itemsize // MBP10_DTYPE.itemsize
    assert man["validation"]["quarantined"][NAME] == {
        f"whole file not decodable as mbp-10: {RULE_RTYPE} at record 0": n_records
    }
    assert sum(f.written for f in res.files) == 20
    # Only the good file's partition exists, and every Parquet file reads.
    assert list(man["rows_per_partition"]) == ["schema=mbp-10/symbol=ESH4/date=2024-01-03"]
    assert sorted(p.parent.name for p in (tmp_path / "out").rglob("*.parquet")) == [
        "date=2024-01-03"
    ]
    assert len(pl.read_parquet(tmp_path / "out" / "**" / "*.parquet")) == 20


def test_letters_that_are_not_dbn_are_refused_or_set_aside_readable(tmp_path):
    recs = mbp_records(30)
    recs["action"][4] = b"\xe9"
    raw = _write(tmp_path, recs)
    with pytest.raises(IngestError, match=rf"record 4 .*{re.escape(RULE_ACTION)}"):
        _ingest(raw, tmp_path / "out")
    _ingest(raw, tmp_path / "out", on_error="quarantine")
    bad = pl.read_parquet(tmp_path / "out" / "quarantine" / "**" / "*.parquet")
    assert bad["record_index"].to_list() == [4] and bad["rule"].to_list() == [RULE_ACTION]
    assert len(_read(tmp_path / "out")) == 29


def test_the_same_records_in_two_input_files_are_refused(tmp_path):
    """The same day as synth writes it (ES/) and as a download does (ES.FUT/)."""
    raw = _write(tmp_path, mbp_records(50))
    (raw / "ES").mkdir()
    (raw / "ES.FUT").mkdir()
    shutil.move(raw / NAME, raw / "ES" / NAME)
    shutil.copy(raw / "ES" / NAME, raw / "ES.FUT" / NAME)
    with pytest.raises(IngestError, match=r"ES/.* and ES.FUT/.* are the same file"):
        _ingest(raw, tmp_path / "out")
    # Not byte-identical, but overlapping: the second file's records start inside the first's.
    other = mbp_records(50, t0=1_704_205_800_000_000_000 + 20 * 1_000_000)
    data, _ = zstd_file(meta() + other.tobytes(), frames=1)
    (raw / "ES.FUT" / NAME).write_bytes(data)
    with pytest.raises(IngestError, match=r"both hold mbp-10 records of instrument_id 42"):
        _ingest(raw, tmp_path / "out", workers=2)
    assert not (tmp_path / "out").exists()
    # Back to back (the next day's file, say) is not an overlap.
    later = mbp_records(50, t0=1_704_205_800_000_000_000 + 50 * 1_000_000)
    data, _ = zstd_file(meta() + later.tobytes(), frames=1)
    (raw / "ES.FUT" / NAME).write_bytes(data)
    assert sum(f.written for f in _ingest(raw, tmp_path / "out").files) == 100
