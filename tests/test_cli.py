"""The `foxhunt` CLI: help for every step, and a smoke run of synth then ingest."""

from __future__ import annotations

import json
import re
import subprocess
import sys


def _run(*args, check=True):
    return subprocess.run(
        [sys.executable, "-m", "foxhunt.cli", *args], capture_output=True, text=True, check=check
    )


def test_help_lists_steps_and_explains_options():
    out = _run("--help").stdout
    assert "synth" in out and "ingest" in out
    out = _run("ingest", "--help").stdout
    for opt in ("--raw", "--out", "--on-error", "--chunk-records", "--download", "--max-cost"):
        assert opt in out
    assert "quarantine" in out and "DATABENTO_API_KEY" in out
    out = _run("synth", "--help").stdout
    assert "--signal" in out and "next bar" in out


def test_help_reflows_wrapped_field_docstrings():
    # tyro 1.0 broke a help line at each indented continuation line of a field's docstring;
    # foxhunt.cli joins each paragraph first. The text tyro wraps for `--model`:
    code = (
        "import json, tyro._docstrings as d; from foxhunt import cli; "
        "from foxhunt.train.core import TrainConfig; cli._reflow_field_docstrings(); "
        "print(json.dumps(d.get_field_docstring(TrainConfig, 'model', ())))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    text = json.loads(r.stdout)
    assert "\n" not in text
    assert "factorised policy over the branches), pqn (Q(lambda) on PPO's rollouts" in text
    assert text.endswith("(the members' own: --ensemble.tlob.*, ...).")


def test_synth_then_ingest_smoke(tmp_path):
    raw, out = tmp_path / "raw", tmp_path / "ingested"
    synth = ["synth", "--out", str(raw), "--symbols", "ES", "--start", "2024-01-02"]
    synth += ["--end", "2024-01-04", "--events-per-bar", "5"]
    assert "wrote 8 DBN files" in _run(*synth).stdout
    assert "nothing to do" in _run(*synth).stdout
    r = _run("ingest", "--raw", str(raw), "--out", str(out))
    said = r"ingested 8 files into .* [\d,]+ records read \(\d+(\.\d+ [kM])? records/s\), "
    assert re.search(said + r"written definition \d+, mbp-10 [\d,]+, ", r.stdout), r.stdout
    assert json.loads((out / "manifest.json").read_text())["validation"]["records_read"] > 0
    assert "no work" in _run("ingest", "--raw", str(raw), "--out", str(out)).stdout


def test_ingest_error_exits_nonzero_with_message(tmp_path):
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "x.trades.dbn").write_bytes(b"not dbn at all")
    r = _run("ingest", "--raw", str(tmp_path / "raw"), "--out", str(tmp_path / "o"), check=False)
    assert r.returncode == 1
    assert "x.trades.dbn" in r.stderr and "no DBN metadata header" in r.stderr
