"""Output safety: foxhunt never replaces what it did not write, and cleans what dead runs left."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time

import pytest

from foxhunt import fsutil
from foxhunt.fsutil import OutputError, clean_stale, publish_dir, staging_dir, temp_path
from foxhunt.ingest.core import IngestConfig, run_ingest
from foxhunt.synth.generate import SynthConfig, generate


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture()
def data(small_raw, tmp_path):
    """A user's data directory: raw DBN files, a previous ingest, a folds file, a run."""
    import shutil

    d = tmp_path / "data"
    shutil.copytree(small_raw, d / "raw")
    (d / "folds").mkdir()
    (d / "folds" / "ES.json").write_text("{}")
    (d / "runs" / "r1").mkdir(parents=True)
    (d / "runs" / "r1" / "results.json").write_text("{}")
    return d


def _ingest(raw, out):
    return run_ingest(IngestConfig(raw=raw, out=out, workers=1))


def test_ingest_out_holding_the_input_is_refused_and_nothing_moves(data):
    before = _tree(data)
    for out in (data, data / "raw"):  # --out data and --out equal to --raw
        with pytest.raises(OutputError, match="holds the input"):
            _ingest(data / "raw", out)
        assert _tree(data) == before
    with pytest.raises(OutputError, match="inside the input"):
        _ingest(data / "raw", data / "raw" / "GLBX.MDP3" / "out")
    assert _tree(data) == before


def test_ingest_out_not_written_by_ingest_is_refused(data):
    (data / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match="not a directory"):
        _ingest(data / "raw", data / "notes.txt")
    assert (data / "notes.txt").read_text() == "mine"
    assert not [p for p in data.iterdir() if p.name.startswith(".")]
    with pytest.raises(OutputError, match="not written by foxhunt ingest"):
        _ingest(data / "raw", data / "folds")
    assert (data / "folds" / "ES.json").exists()


def test_ingest_replaces_its_own_output_and_an_empty_directory(data):
    (data / "ingested").mkdir()
    _ingest(data / "raw", data / "ingested")  # empty: fine
    assert (data / "ingested" / "manifest.json").is_file()
    res = run_ingest(IngestConfig(raw=data / "raw", out=data / "ingested", workers=1, force=True))
    assert not res.skipped and (data / "ingested" / "manifest.json").exists()


def test_cli_ingest_into_the_data_directory_fails_clearly(data):
    before = _tree(data)
    out = subprocess.run(
        [sys.executable, "-m", "foxhunt.cli", "ingest", "--raw", str(data / "raw"), "--out",
         str(data)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 1 and "holds the input" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and _tree(data) == before


def test_synth_never_replaces_downloaded_data(tmp_path):
    """A download writes raw/GLBX.MDP3/ES.FUT/...: synth writes raw/GLBX.MDP3 and must not
    replace it."""
    mine = tmp_path / "raw" / "GLBX.MDP3" / "ES.FUT" / "glbx-mdp3-20240102.mbp-10.dbn.zst"
    mine.parent.mkdir(parents=True)
    mine.write_bytes(b"real data")
    cfg = SynthConfig(out=tmp_path / "raw", start=dt.date(2024, 3, 6), end=dt.date(2024, 3, 7))
    with pytest.raises(OutputError, match="not written by foxhunt synth"):
        generate(cfg, workers=1)
    assert mine.read_bytes() == b"real data"


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_staging_of_dead_processes_is_removed_and_live_ones_kept(tmp_path):
    final = tmp_path / "ingested"
    dead = tmp_path / f".ingested.tmp-h{fsutil.HOST}-{_dead_pid()}-0123abcd"
    live = tmp_path / f".ingested.tmp-h{fsutil.HOST}-{os.getpid()}-0123abcd"
    legacy_old = tmp_path / f".fxcache.tmp-{_dead_pid()}-89abcdef"  # before owner tags: by age
    other_new = tmp_path / ".k.tmp-h00000000-1-0123abcd"  # another host, recently written
    other_old = tmp_path / ".k2.tmp-h00000000-1-0123abcd"  # another host, silent for a day
    for d in (dead, live, legacy_old, other_new, other_old):
        (d / "schema=mbp-10").mkdir(parents=True)
        (d / "schema=mbp-10" / "part.parquet").write_bytes(b"x" * 1000)
    day_ago = time.time() - 24 * 3600
    for d in (legacy_old, other_old):
        for p in (d, d / "schema=mbp-10", d / "schema=mbp-10" / "part.parquet"):
            os.utime(p, (day_ago, day_ago))
    stage = staging_dir(final)  # a new run cleans up before it starts
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {stage.name, live.name, other_new.name}


def test_a_swap_cut_between_its_renames_is_undone_by_the_next_run(tmp_path):
    final = tmp_path / "ingested"
    old = tmp_path / f".ingested.old-h{fsutil.HOST}-{_dead_pid()}-0123abcd"
    old.mkdir()
    (old / "manifest.json").write_text(json.dumps({"kept": True}))
    clean_stale(tmp_path)
    assert json.loads((final / "manifest.json").read_text()) == {"kept": True}
    assert not old.exists()


def test_publish_dir_and_temp_names_carry_their_owner(tmp_path):
    final = tmp_path / "out"
    stage = staging_dir(final)
    assert stage.name.startswith(f".out.tmp-h{fsutil.HOST}-{os.getpid()}-")
    (stage / "a").write_text("1")
    publish_dir(stage, final)
    assert (final / "a").read_text() == "1" and [p.name for p in tmp_path.iterdir()] == ["out"]
    assert temp_path(final / "x.json").name.startswith(f".x.json.tmp-h{fsutil.HOST}-")


def test_a_killed_ingest_leaves_staging_that_the_next_run_removes(small_raw, tmp_path):
    """SIGKILL mid-run (no handler runs), as a pod eviction or OOM kill would."""
    out = tmp_path / "ingested"
    cmd = [sys.executable, "-m", "foxhunt.cli", "ingest", "--raw", str(small_raw), "--out",
           str(out), "--workers", "1", "--chunk-records", "64"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while not list(tmp_path.glob(".ingested.tmp-*")) and time.time() < deadline:
        time.sleep(0.005)
    proc.kill()
    proc.wait()
    left = list(tmp_path.glob(".ingested.tmp-*"))
    assert left and not out.exists(), "the run was to be killed while writing its staging"
    res = run_ingest(IngestConfig(raw=small_raw, out=out, workers=1))
    assert res.records > 0 and not list(tmp_path.glob(".ingested.tmp-*"))
