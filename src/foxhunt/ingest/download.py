"""Databento Historical downloads into the raw-data directory, one DBN file per day and schema.

The API key comes from `DATABENTO_API_KEY` (a Kubernetes Secret in the cluster) and is never
logged, written or passed on the command line. The cost of what is missing is asked first
(`metadata.get_cost`) and a download over `--max-cost` is refused. Files are written to a
temporary name and renamed when complete, so a file present under its final name is whole and
a rerun fetches only what is missing (resumable).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from pathlib import Path

from foxhunt.errors import StepError

log = logging.getLogger(__name__)

KEY_ENV = "DATABENTO_API_KEY"
GATEWAY_ENV = "DATABENTO_GATEWAY"  # another API host (tests, proxies); default: Databento's


class DownloadError(StepError):
    pass


def _days(start: dt.date, end: dt.date) -> list[dt.date]:
    out, d = [], start
    while d < end:
        out.append(d)
        d += dt.timedelta(days=1)
    return out


def target_path(
    raw: Path, dataset: str, symbols: tuple[str, ...], day: dt.date, schema: str
) -> Path:
    tag = "_".join(s.replace("/", "-") for s in symbols)
    stem = dataset.lower().replace(".", "-")
    return raw / dataset / tag / f"{stem}-{day:%Y%m%d}.{schema}.dbn.zst"


def download(cfg) -> list[Path]:
    """Fetch the missing day files of `cfg` (an IngestConfig); returns the files written."""
    from foxhunt.ingest.core import IngestError

    key = os.environ.get(KEY_ENV)
    if not key:
        raise IngestError(f"--download needs the API key in the environment variable {KEY_ENV}")
    if cfg.start is None or cfg.end is None or cfg.end <= cfg.start:
        raise IngestError("--download needs --start and --end (end exclusive, after start)")
    import databento as db

    gateway = os.environ.get(GATEWAY_ENV)
    client = db.Historical(key=key, gateway=gateway) if gateway else db.Historical(key=key)
    missing: dict[str, list[dt.date]] = {}
    for schema in cfg.download_schemas:
        days = [
            d
            for d in _days(cfg.start, cfg.end)
            if not target_path(cfg.raw, cfg.dataset, cfg.symbols, d, schema).exists()
        ]
        if days:
            missing[schema] = days
    if not missing:
        log.info("download: every requested file is already in %s", cfg.raw)
        return []
    cost = 0.0
    for schema, days in missing.items():
        try:
            cost += float(
                client.metadata.get_cost(
                    dataset=cfg.dataset,
                    symbols=list(cfg.symbols),
                    stype_in=cfg.stype_in,
                    schema=schema,
                    start=days[0].isoformat(),
                    end=(days[-1] + dt.timedelta(days=1)).isoformat(),
                )
            )
        except Exception as e:  # the client's errors carry the HTTP status, never the key
            raise IngestError(
                f"download: cost query for {schema} failed: {_scrub(e, key)}"
            ) from None
    log.info("download: %d files missing, quoted cost $%.2f", sum(map(len, missing.values())), cost)
    if cost > cfg.max_cost:
        raise IngestError(
            f"download refused: quoted cost ${cost:.2f} exceeds --max-cost ${cfg.max_cost:.2f}"
        )
    written = []
    for schema, days in missing.items():
        for day in days:
            final = target_path(cfg.raw, cfg.dataset, cfg.symbols, day, schema)
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp = final.with_name(f".{final.name}.part-{os.getpid()}")
            tmp.unlink(missing_ok=True)
            try:
                client.timeseries.get_range(
                    dataset=cfg.dataset,
                    symbols=list(cfg.symbols),
                    stype_in=cfg.stype_in,
                    schema=schema,
                    start=day.isoformat(),
                    end=(day + dt.timedelta(days=1)).isoformat(),
                    path=tmp,
                )
            except Exception as e:
                tmp.unlink(missing_ok=True)
                raise IngestError(f"download of {final.name} failed: {_scrub(e, key)}") from None
            os.replace(tmp, final)
            written.append(final)
            log.info("download: %s", final)
    return written


def _scrub(e: Exception, key: str) -> str:
    return str(e).replace(key, "***")
