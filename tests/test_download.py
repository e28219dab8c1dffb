"""The Databento download path against a local HTTPS server that answers as the API does."""

from __future__ import annotations

import datetime as dt
import http.server
import json
import logging
import ssl
import subprocess
import threading
import urllib.parse
from typing import ClassVar

import pytest

from foxhunt.dbn.io import encode_metadata, write_dbn
from foxhunt.ingest.core import IngestConfig, IngestError, run_ingest
from foxhunt.ingest.download import KEY_ENV

KEY = "db-TESTKEYabcdefghijklmnopqrstuvw"  # the shape of a Databento key, not a real one


class FakeDatabento(http.server.BaseHTTPRequestHandler):
    cost = 1.25
    calls: ClassVar[list] = []
    payload = None  # the day's file (zstd DBN) for a start date, as the API streams it

    def log_message(self, *a):  # keep test output quiet
        pass

    def _auth_ok(self) -> bool:
        import base64

        want = "Basic " + base64.b64encode(f"{KEY}:".encode()).decode()
        return self.headers.get("Authorization") == want

    def do_GET(self):
        type(self).calls.append(("GET", self.path, {}))
        self.send_response(404)
        self.end_headers()

    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0))
        form = dict(urllib.parse.parse_qsl(self.rfile.read(n).decode()))
        type(self).calls.append(("POST", self.path, form))
        if not self._auth_ok():
            self.send_response(401)
            self.end_headers()
            return
        if self.path == "/v0/metadata.get_cost":
            self._send(json.dumps(type(self).cost).encode(), "application/json")
        elif self.path == "/v0/timeseries.get_range":
            self._send(type(self).payload(form["start"][:10]), "application/octet-stream")
        else:
            self.send_response(400)
            self.end_headers()

    def _send(self, body: bytes, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def api(tmp_path, monkeypatch):
    cert, keyf = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(keyf),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeDatabento)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, keyf)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    FakeDatabento.calls = []
    FakeDatabento.cost = 1.25
    # A one-day trades file of the day asked for, as the API streams it (zstd DBN).
    import numpy as np

    from foxhunt.dbn.layout import TRADE_DTYPE

    def payload(start: str) -> bytes:
        day = dt.date.fromisoformat(start)
        recs = np.zeros(3, dtype=TRADE_DTYPE)
        recs["length"], recs["rtype"], recs["instrument_id"], recs["publisher_id"] = 12, 0, 5, 1
        t0 = int(np.datetime64(day, "ns").astype(np.int64)) + 14 * 3_600_000_000_000
        recs["ts_event"] = recs["ts_recv"] = t0 + np.arange(3)
        recs["price"], recs["size"] = 4_800_000_000_000, 1
        recs["action"], recs["side"] = b"T", b"B"
        meta = encode_metadata(
            "GLBX.MDP3", "trades", 0, 10**18, {"ES.FUT": 5}, day, day + dt.timedelta(days=1)
        )
        write_dbn(tmp_path / f"payload-{start}.dbn.zst", meta, recs)
        return (tmp_path / f"payload-{start}.dbn.zst").read_bytes()

    FakeDatabento.payload = staticmethod(payload)
    monkeypatch.setenv("DATABENTO_GATEWAY", f"127.0.0.1:{srv.server_address[1]}")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert))
    monkeypatch.setenv(KEY_ENV, KEY)
    yield srv
    srv.shutdown()


def _cfg(tmp_path, **kw):
    return IngestConfig(
        raw=tmp_path / "raw",
        out=tmp_path / "out",
        download=True,
        symbols=("ES.FUT",),
        stype_in="parent",
        download_schemas=("trades",),
        start=dt.date(2024, 1, 2),
        end=dt.date(2024, 1, 4),
        workers=1,
        **kw,
    )


def test_download_asks_cost_first_then_fetches_and_ingests(api, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    res = run_ingest(_cfg(tmp_path))
    assert len(res.downloaded) == 2 and res.records == 6
    kinds = [(m, p) for m, p, _ in FakeDatabento.calls]
    assert kinds[0] == ("POST", "/v0/metadata.get_cost")
    assert kinds[1:] == [("POST", "/v0/timeseries.get_range")] * 2
    _, _, q = FakeDatabento.calls[0]
    assert q["dataset"] == "GLBX.MDP3" and q["symbols"] == "ES.FUT" and q["stype_in"] == "parent"
    assert q["schema"] == "trades"
    _, _, form = FakeDatabento.calls[1]
    assert form["start"].startswith("2024-01-02") and form["end"].startswith("2024-01-03")
    # the key appears nowhere: logs, manifest, output
    assert KEY not in caplog.text
    for p in (tmp_path / "out").rglob("*"):
        if p.is_file():
            assert KEY.encode() not in p.read_bytes()
    # resumable: a rerun downloads nothing, and asks nothing
    FakeDatabento.calls = []
    res = run_ingest(_cfg(tmp_path))
    assert res.downloaded == [] and FakeDatabento.calls == [] and res.skipped


def test_download_refused_above_max_cost(api, tmp_path):
    FakeDatabento.cost = 99.0
    with pytest.raises(IngestError, match=r"quoted cost \$99.00 exceeds --max-cost \$10.00"):
        run_ingest(_cfg(tmp_path))
    assert [p for _, p, _ in FakeDatabento.calls] == ["/v0/metadata.get_cost"]
    assert not list((tmp_path / "raw").rglob("*.dbn.zst")) if (tmp_path / "raw").exists() else True


def test_download_needs_the_key(tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(IngestError, match=KEY_ENV):
        run_ingest(_cfg(tmp_path))


def test_bad_key_error_does_not_leak_it(api, tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "db-WRONGKEYabcdefghijklmnopqrstuv")
    with pytest.raises(IngestError) as e:
        run_ingest(_cfg(tmp_path))
    assert "WRONGKEY" not in str(e.value)
