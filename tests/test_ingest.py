"""Ingest: real samples equal databento's own decoding, every validation rule fires with a clear
message, failures leave earlier output intact, reruns do no work, memory stays bounded."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import threading
import tracemalloc
from pathlib import Path

import databento as db
import databento_dbn
import numpy as np
import polars as pl
import pytest
import zstandard

from foxhunt.dbn.buffers import BufferPool
from foxhunt.dbn.columns import RecordColumns
from foxhunt.dbn.io import encode_metadata, read_ahead, read_all, write_dbn
from foxhunt.dbn.layout import MBP10_DTYPE, OHLCV_DTYPE
from foxhunt.ingest.core import (
    IngestConfig,
    IngestError,
    file_digest,
    load_manifest,
    run_ingest,
)
from foxhunt.synth.generate import DATASET


def _ingest(raw: Path, out: Path, **kw):
    return run_ingest(IngestConfig(raw=raw, out=out, workers=1, **kw))


def _read(out: Path, schema: str) -> pl.DataFrame:
    return pl.read_parquet(out / f"schema={schema}" / "**" / "*.parquet", hive_partitioning=True)


# --- real Databento files ---------------------------------------------------------------------


@pytest.mark.parametrize("folder", ["GLBX.MDP3", "XNAS.ITCH", "dbn-v2"])
def test_samples_equal_databento_to_df(samples, tmp_path, folder):
    raw = tmp_path / "raw"
    shutil.copytree(samples / folder, raw)
    res = _ingest(raw, tmp_path / "out")
    assert res.records > 0
    for f in sorted(raw.iterdir()):
        store = db.DBNStore.from_file(f)
        schema = str(store.schema)
        if schema == "definition":
            ref = store.to_df(price_type="fixed", pretty_ts=False, map_symbols=False).reset_index()
            got = _read(tmp_path / "out", schema)
            assert sorted(got["raw_symbol"].to_list()) == sorted(ref["raw_symbol"].to_list())
            continue
        ref = store.to_df(price_type="fixed", pretty_ts=False, map_symbols=False).reset_index()
        got = _read(tmp_path / "out", schema).sort("ts_recv" if "ts_recv" in ref else "ts_event")
        assert len(got) == len(ref), f
        for col in ref.columns:
            if col in ("symbol",):
                continue
            r = ref[col].to_numpy()
            g = got[col].to_numpy()
            if col.startswith("ts_") and col != "ts_in_delta":
                g = got[col].dt.epoch("ns").to_numpy()
                r = r.astype("int64")
            assert g.tolist() == r.tolist(), f"{f.name}: column {col}"
        # symbols come from the files' symbology mappings
        syms = {p.name.split("=", 1)[1] for p in (tmp_path / "out" / f"schema={schema}").iterdir()}
        assert syms <= {"ESH1", "NVDA", "MSFT", *map(str, ref["instrument_id"].unique())}


def test_synth_round_trip_keeps_every_record(small_raw, tmp_path):
    out = tmp_path / "out"
    res = _ingest(small_raw, out)
    files = sorted((small_raw / DATASET).rglob("*.dbn.zst"))
    assert len(res.files) == len(files)
    man = load_manifest(out)
    assert man["validation"]["records_read"] == man["validation"]["records_written"]
    # digests taken while decoding equal a separate read of each whole file
    assert {i["path"]: i["digest"] for i in man["inputs"]} == {
        str(f.relative_to(small_raw)): file_digest(f) for f in files
    }
    mbp_files = [f for f in files if ".mbp-10." in f.name]
    recs = np.concatenate([read_all(f)[1] for f in mbp_files])
    got = _read(out, "mbp-10")
    assert len(got) == len(recs)
    # every record, every field: sort both the same way and compare columns exactly
    order = np.lexsort((recs["sequence"], recs["ts_recv"], recs["instrument_id"]))
    recs = recs[order]
    got = got.sort(["instrument_id", "ts_recv", "sequence"])
    for name in MBP10_DTYPE.names:
        if name == "length":
            continue
        g = got[name]
        if name in ("ts_event", "ts_recv"):
            g = g.dt.epoch("ns")
        if name in ("action", "side"):
            assert g.to_list() == [v.decode() for v in recs[name].tolist()], name
        else:
            assert g.to_numpy().tolist() == recs[name].tolist(), name
    # contract symbols from the definition records, partitions by UTC date
    assert set(got["symbol"].unique()) == {"ESH4", "ESM4", "NQH4", "NQM4"}
    assert got["date"].n_unique() == 3
    assert got["price"].dtype == pl.Int64 and got["ts_event"].dtype == pl.Datetime("ns", "UTC")


def test_rerun_does_no_work_and_changes_redo_it(small_raw, tmp_path):
    raw = tmp_path / "raw"
    shutil.copytree(small_raw, raw)
    out = tmp_path / "out"
    assert not _ingest(raw, out).skipped
    res = _ingest(raw, out)
    assert res.skipped and "no work" in res.summary()
    f = sorted(raw.rglob("*.trades.dbn.zst"))[0]
    f.touch()  # same content, new mtime: the digest says unchanged
    assert _ingest(raw, out).skipped
    f.unlink()
    assert not _ingest(raw, out).skipped


# --- validation rules, each with a malformed file made here -----------------------------------


def _dbn_file(tmp: Path, recs: np.ndarray, schema: str, name: str, symbols: dict, version=3):
    day = dt.date(2024, 1, 2)
    meta = encode_metadata(
        "GLBX.MDP3", schema, 0, 10**18, symbols, day, day + dt.timedelta(days=1), version=version
    )
    path = tmp / "raw" / name
    write_dbn(path, meta, recs)
    return path


def _mbp_file(tmp: Path, recs: np.ndarray, name="glbx-mdp3-20240102.mbp-10.dbn") -> Path:
    return _dbn_file(tmp, recs, "mbp-10", name, {"ESH4": 42})


def _good_mbp(n=50) -> np.ndarray:
    r = np.zeros(n, dtype=MBP10_DTYPE)
    r["length"] = MBP10_DTYPE.itemsize // 4
    r["rtype"] = 0x0A
    r["publisher_id"] = 1
    r["instrument_id"] = 42
    t = 1_704_205_800_000_000_000 + np.arange(n) * 1_000_000
    r["ts_event"] = t
    r["ts_recv"] = t + 5_000
    r["sequence"] = np.arange(n) + 1
    r["action"] = b"A"
    r["side"] = b"B"
    r["size"] = 3
    r["price"] = 4_800_000_000_000
    for i in range(10):
        r[f"bid_px_{i:02d}"] = 4_800_000_000_000 - i * 250_000_000
        r[f"ask_px_{i:02d}"] = 4_800_250_000_000 + i * 250_000_000
        r[f"bid_sz_{i:02d}"] = r[f"ask_sz_{i:02d}"] = 10
        r[f"bid_ct_{i:02d}"] = r[f"ask_ct_{i:02d}"] = 1
    return r


def _breaks(recs):
    bad = {}
    r = recs.copy()
    r["ts_event"][30] = r["ts_event"][10]
    bad["ts_event goes backwards"] = (r, 30)
    r = recs.copy()
    r["price"][7] = -250_000_000
    bad["non-positive price"] = (r, 7)
    r = recs.copy()
    r["bid_px_03"][12] = 0
    bad["non-positive price "] = (r, 12)
    r = recs.copy()
    r["bid_px_00"][20] = r["ask_px_00"][20]
    bad["crossed book"] = (r, 20)
    r = recs.copy()
    r[25] = r[24]
    bad["duplicate record"] = (r, 25)
    r = recs.copy()
    r["rtype"][5] = 0x01
    bad["record type does not belong"] = (r, 5)
    r = recs.copy()
    r["length"][9] = 12
    bad["record length field"] = (r, 9)
    return bad


@pytest.mark.parametrize("rule", list(_breaks(_good_mbp())))
def test_each_record_rule_fails_with_file_record_and_rule(tmp_path, rule):
    recs, idx = _breaks(_good_mbp())[rule]
    path = _mbp_file(tmp_path, recs)
    with pytest.raises(IngestError) as e:
        _ingest(tmp_path / "raw", tmp_path / "out")
    msg = str(e.value)
    assert str(path) in msg and f"record {idx} " in msg and rule.strip() in msg, msg
    assert f"byte {path.stat().st_size - (50 - idx) * MBP10_DTYPE.itemsize}" in msg
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("rule", list(_breaks(_good_mbp())))
def test_quarantine_sets_bad_records_aside_and_counts_them(tmp_path, rule):
    recs, idx = _breaks(_good_mbp())[rule]
    _mbp_file(tmp_path, recs)
    res = _ingest(tmp_path / "raw", tmp_path / "out", on_error="quarantine")
    man = load_manifest(tmp_path / "out")
    q = man["validation"]["quarantined"]["glbx-mdp3-20240102.mbp-10.dbn"]
    if rule.startswith(("record type", "record length")):
        # The fixed-size framing is lost: the file is set aside whole, nothing of it written.
        assert q == {f"whole file not decodable as mbp-10: {_rule(rule)} at record {idx}": 50}
        assert res.files[0].written == 0 and man["rows_per_partition"] == {}
        assert not list((tmp_path / "out").rglob("*.parquet"))
        return
    # Exactly the one offending record is set aside, counted once, under its rule.
    assert q == {_rule(rule): 1}
    assert res.files[0].written == 49
    bad = pl.read_parquet(tmp_path / "out" / "quarantine" / "**" / "*.parquet")
    assert bad["record_index"].to_list() == [idx]
    good = pl.read_parquet(tmp_path / "out" / "schema=mbp-10" / "**" / "*.parquet")
    assert good["sequence"].to_list() == [i + 1 for i in range(50) if i != idx]


def _rule(prefix: str) -> str:
    from foxhunt.ingest import validate

    rules = [v for k, v in vars(validate).items() if k.startswith("RULE_")]
    return next(r for r in rules if r.startswith(prefix.strip()))


def test_truncated_file(tmp_path):
    path = _mbp_file(tmp_path, _good_mbp())
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    with pytest.raises(
        IngestError, match=r"record 49 \(byte \d+\).*truncated file: last record has 268 of 368"
    ):
        _ingest(tmp_path / "raw", tmp_path / "out")
    res = _ingest(tmp_path / "raw", tmp_path / "out", on_error="quarantine")
    assert res.files[0].written == 49
    v = load_manifest(tmp_path / "out")["validation"]
    assert v["quarantined"] == {}
    assert v["truncated"][path.name]["after_record"] == 49
    assert "TRUNCATED" in res.summary()


def test_corrupt_and_truncated_zstd(tmp_path):
    path = _mbp_file(tmp_path, _good_mbp(), name="x.mbp-10.dbn.zst")
    data = bytearray(path.read_bytes())
    path.write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(IngestError, match=str(path)):
        _ingest(tmp_path / "raw", tmp_path / "out")
    data[40:60] = b"\xff" * 20
    path.write_bytes(bytes(data))
    with pytest.raises(IngestError, match=str(path)):
        _ingest(tmp_path / "raw", tmp_path / "out")


def test_fragment_without_metadata(tmp_path):
    path = tmp_path / "raw" / "frag.mbp-10.dbn"
    path.parent.mkdir()
    path.write_bytes(_good_mbp().tobytes())
    with pytest.raises(IngestError, match="no DBN metadata header"):
        _ingest(tmp_path / "raw", tmp_path / "out")


def test_legacy_dbz_is_refused(tmp_path):
    path = tmp_path / "raw" / "old.mbp-10.dbz"
    path.parent.mkdir()
    path.write_bytes(b"\x50\x2a\x4d\x18" + b"\0" * 64)
    with pytest.raises(IngestError, match="legacy DBZ"):
        _ingest(tmp_path / "raw", tmp_path / "out")
    path.rename(path.with_name("old.mbp-10.dbn"))  # same bytes, misnamed
    with pytest.raises(IngestError, match="legacy DBZ"):
        _ingest(tmp_path / "raw", tmp_path / "out")


def test_unknown_and_mismatched_schema(tmp_path):
    raw = tmp_path / "raw"
    meta = bytes(
        databento_dbn.Metadata(
            dataset="GLBX.MDP3",
            start=0,
            stype_in=databento_dbn.SType.RAW_SYMBOL,
            stype_out=databento_dbn.SType.INSTRUMENT_ID,
            schema=databento_dbn.Schema.MBO,
        )
    )
    write_dbn(raw / "a.mbo.dbn", meta, b"")
    with pytest.raises(IngestError, match="unsupported schema 'mbo'"):
        _ingest(raw, tmp_path / "out")
    (raw / "a.mbo.dbn").unlink()
    _mbp_file(tmp_path, _good_mbp(), name="glbx-mdp3-20240102.trades.dbn")
    with pytest.raises(IngestError, match="mismatched schema: the file name says 'trades'"):
        _ingest(raw, tmp_path / "out")


def test_unsupported_version(tmp_path):
    path = _mbp_file(tmp_path, _good_mbp())
    data = bytearray(path.read_bytes())
    data[3] = 9
    path.write_bytes(bytes(data))
    with pytest.raises(IngestError, match="unsupported DBN version 9"):
        _ingest(tmp_path / "raw", tmp_path / "out")


def test_dbn_v1_file_ingests(tmp_path):
    recs = np.zeros(3, dtype=OHLCV_DTYPE)
    recs["length"], recs["rtype"], recs["instrument_id"] = 14, 0x21, 7
    recs["ts_event"] = np.arange(3) * 60_000_000_000 + 1_704_205_800_000_000_000
    recs["open"] = recs["high"] = recs["low"] = recs["close"] = 100_000_000_000
    _dbn_file(tmp_path, recs, "ohlcv-1m", "v1.ohlcv-1m.dbn", {"ESH4": 7}, version=1)
    res = _ingest(tmp_path / "raw", tmp_path / "out")
    assert res.files[0].version == 1
    assert res.files[0].digest == file_digest(tmp_path / "raw" / "v1.ohlcv-1m.dbn")  # plain file
    assert _read(tmp_path / "out", "ohlcv-1m")["close"].to_list() == [100_000_000_000] * 3


def test_failed_run_leaves_previous_output_untouched(small_raw, tmp_path):
    raw = tmp_path / "raw"
    shutil.copytree(small_raw, raw)
    out = tmp_path / "out"
    _ingest(raw, out)
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    victim = sorted(raw.rglob("*.mbp-10.dbn.zst"))[-1]
    data = zstandard.ZstdDecompressor().stream_reader(open(victim, "rb")).read()
    victim.write_bytes(data[:-10])  # now a plain, truncated file under a .zst name
    victim.rename(victim.with_suffix(""))
    with pytest.raises(IngestError, match="truncated"):
        _ingest(raw, out)
    after = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    assert before == after
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".out.")]


def test_memory_is_bounded_by_the_chunk(tmp_path):
    n = 100_000  # 36.8 MB of records
    recs = _good_mbp(n)
    _mbp_file(tmp_path, recs)
    tracemalloc.start()
    run_ingest(
        IngestConfig(raw=tmp_path / "raw", out=tmp_path / "out", workers=1, chunk_records=2048)
    )
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 8_000_000, peak  # a few chunks of 0.75 MB, far below the file's 36.8 MB
    assert (
        json.loads((tmp_path / "out" / "manifest.json").read_text())["validation"][
            "records_written"
        ]
        == n
    )


def test_read_ahead_keeps_order_raises_in_place_and_stops_when_left():
    def numbers(n, fail_at=None, closed=None):
        try:
            for i in range(n):
                if i == fail_at:
                    raise ValueError(f"bad item {i}")
                yield i
        finally:
            if closed is not None:
                closed.set()

    assert list(read_ahead(numbers(50), depth=2)) == list(range(50))
    got = []
    with pytest.raises(ValueError, match="bad item 7"):
        for x in read_ahead(numbers(20, fail_at=7)):
            got.append(x)
    assert got == list(range(7))  # everything before the error, nothing after
    closed = threading.Event()
    it = read_ahead(numbers(10**9, closed=closed))
    assert next(it) == 0
    it.close()  # the consumer leaves early: the thread stops and closes the source
    assert closed.wait(5)
    assert not any(t.name == "dbn-read-ahead" for t in threading.enumerate())


def test_buffer_pool_reuses_only_buffers_nothing_refers_to():
    import pyarrow as pa

    pool = BufferPool()
    a = pool.take(1 << 20)
    first = a.ctypes.data
    assert first % 64 == 0
    held = pa.array(a[:4096].view(np.uint32))  # an Arrow array built on a view of it
    del a
    b = pool.take(1 << 20)
    assert b.ctypes.data != first  # still referenced through the Arrow array
    del held
    c = pool.take(1 << 19)
    assert c.ctypes.data == first  # free again: reused (the smallest that fits)
    del b, c
    small = BufferPool(max_buffers=2)
    held = [small.take(1000), small.take(1000)]
    del held  # the pool is full of idle buffers too small for the next request
    big = small.take(1 << 20)
    ptr = big.ctypes.data
    del big
    assert small.take(1 << 20).ctypes.data == ptr  # it replaced one of them and is reused


def test_record_columns_equal_the_fields_and_start_aligned():
    """Chunk-sized columns come out of pooled buffers; each equals the strided field."""
    n = 9000  # large enough for the pooled transpose and narrow-column block
    raw = np.random.default_rng(0).integers(0, 256, n * MBP10_DTYPE.itemsize, dtype=np.uint8)
    recs = raw.view(MBP10_DTYPE)
    cols = RecordColumns(recs)
    for name in MBP10_DTYPE.names:
        col = cols[name]
        assert np.array_equal(col, recs[name]), name
        if col.dtype.kind in "iu":
            assert col.ctypes.data % 64 == 0, name
    sub = cols.subset(slice(100, 200))
    assert np.array_equal(sub["bid_sz_03"], recs["bid_sz_03"][100:200])


@pytest.mark.parametrize("name", ["x.mbp-10.dbn", "x.mbp-10.dbn.zst"])
def test_column_chunks_equal_the_records_whatever_the_pieces(tmp_path, monkeypatch, name):
    """The reader that transposes piece by piece gives the records' every field, at every
    chunk and piece size, with the same chunk starts and truncated-tail handling as
    `iter_chunks`."""
    import foxhunt.dbn.io as dbn_io

    n = 1000
    raw = np.random.default_rng(1).integers(0, 256, n * MBP10_DTYPE.itemsize, dtype=np.uint8)
    recs = raw.view(MBP10_DTYPE)
    meta = encode_metadata(
        "GLBX.MDP3", "mbp-10", 0, 1, {"ESH4": 1}, dt.date(2024, 1, 2), dt.date(2024, 1, 3)
    )
    path = tmp_path / name
    write_dbn(path, meta, recs)
    for piece, chunk in [(3 * 368, 250), (1000, 333), (1 << 19, 1000), (368, 7)]:
        monkeypatch.setattr(dbn_io, "PIECE_BYTES", piece)
        _, chunks = dbn_io.iter_column_chunks(path, chunk)
        got = list(chunks)
        assert [c.first_index for c in got] == list(range(0, n, chunk))
        assert got[-1].first_offset == len(meta) + got[-1].first_index * MBP10_DTYPE.itemsize
        for c in got:
            want = recs[c.first_index : c.first_index + len(c.columns)]
            for field in MBP10_DTYPE.names:
                assert np.array_equal(c.columns[field], want[field]), (piece, chunk, field)
            assert c.columns.recs.tobytes() == want.tobytes()
    # A partial last record: an error naming it, or with the allowance the whole records
    # first and then Truncated.
    write_dbn(path, meta, raw[:-100].tobytes())
    _, chunks = dbn_io.iter_column_chunks(path, 300)
    with pytest.raises(dbn_io.DbnFormatError, match=r"record 999 .*268 of 368"):
        list(chunks)
    _, chunks = dbn_io.iter_column_chunks(path, 300, allow_truncated=True)
    seen = []
    with pytest.raises(dbn_io.Truncated):
        for c in chunks:
            seen.append(len(c.columns))
    assert seen == [300, 300, 300, 99]


def test_record_columns_subsets_of_subsets():
    n = 5000
    raw = np.random.default_rng(2).integers(0, 256, n * MBP10_DTYPE.itemsize, dtype=np.uint8)
    recs = raw.view(MBP10_DTYPE)
    cols = RecordColumns(recs)
    idx = np.flatnonzero(recs["ts_event"] % 3 == 0)
    sub = cols.subset(idx).subset(slice(10, 60))
    want = recs[idx][10:60]
    assert len(sub) == 50
    for field in ("ts_event", "action", "bid_sz_07", "ask_px_09", "flags"):
        assert np.array_equal(sub[field], want[field]), field
    assert sub.recs.tobytes() == want.tobytes()
    head = np.ascontiguousarray(want).view(np.uint8).reshape(50, -1)[:, :48]
    assert np.array_equal(sub.header_words(), np.ascontiguousarray(head).view(np.uint64).T)


def test_every_record_layout_is_whole_words():
    """The column reader transposes records as [n, size // 8] u64 words."""
    from foxhunt.dbn.layout import SCHEMAS

    for name, layout in SCHEMAS.items():
        for version in (1, 2, 3):
            for ts_out in (False, True):
                size = layout.dtype(version, ts_out).itemsize
                assert size % 8 == 0, (name, version, ts_out, size)


def test_the_inputs_digest_follows_the_raw_files(small_raw, tmp_path):
    """What the pipeline's scan step hands to ingest as its cache key: the same for the same
    files, different when one is added, replaced or removed (hidden files do not count)."""
    from foxhunt.ingest.core import inputs_digest

    raw = tmp_path / "raw"
    shutil.copytree(small_raw, raw)
    first = inputs_digest(raw)
    assert inputs_digest(raw) == first
    (raw / ".partial.dbn.zst.tmp").write_bytes(b"x")
    assert inputs_digest(raw) == first
    f = sorted(raw.rglob("*.dbn.zst"))[0]
    extra = f.with_name("glbx-mdp3-20240311.trades.dbn.zst")
    shutil.copy(f, extra)
    assert inputs_digest(raw) != first
    extra.unlink()
    assert inputs_digest(raw) == first
    f.write_bytes(f.read_bytes() + b"\0")
    assert inputs_digest(raw) != first
