"""The `foxhunt` command: one subcommand per pipeline step.

    foxhunt synth --help      demo market data as DBN files
    foxhunt ingest --help     DBN files (or a Databento download) -> validated Parquet
    foxhunt precompute --help ingested data -> the fxcache (bars, features, order flow)
    foxhunt fxcache ls        list the precomputed caches (fxcache verify: check them)
    foxhunt folds --help      walk-forward train/val/test ranges of a cache, as JSON
    foxhunt train --help      an agent over the folds (Rainbow DQN), on a GPU or the CPU
    foxhunt report --help     test metrics over folds and seeds, deflated Sharpe, equity curves

Each subcommand parses into the step's typed config dataclass (its field docstrings are the
`--help` text) and calls the step's one function, exactly as the KFP component does.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Union

import tyro
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from foxhunt.folds import FoldError, FoldsConfig, run_folds
from foxhunt.fsutil import OutputError
from foxhunt.fxcache import FxCacheError, list_caches, verify
from foxhunt.fxcache.store import quarantine
from foxhunt.ingest.core import IngestConfig, IngestError, run_ingest
from foxhunt.precompute import PrecomputeConfig, PrecomputeError, run_precompute
from foxhunt.precompute.source import SourceError
from foxhunt.report import ReportConfig, ReportError, run_report
from foxhunt.synth.generate import SynthConfig, SynthError, generate
from foxhunt.train import TrainConfig, TrainError, run_train

console = Console(stderr=True)


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )


def cmd_synth(cfg: SynthConfig) -> int:
    with _progress() as progress:
        res = generate(cfg, progress=progress)
    if res.skipped:
        print(f"demo data already present in {res.out} (same parameters); nothing to do")
        return 0
    rate = res.mbp10_records / res.seconds if res.seconds else 0.0
    print(
        f"wrote {res.files} DBN files ({res.bytes_written / 1e6:.1f} MB) to {res.out} in "
        f"{res.seconds:.1f} s: "
        + ", ".join(f"{k} {v:,}" for k, v in res.per_schema.items())
        + f" records ({rate / 1e6:.2f} M MBP-10 records/s)"
    )
    return 0


@dataclass
class FxcacheCommand:
    """List the fxcache's caches, or verify their checksums."""

    action: tyro.conf.Positional[Literal["ls", "verify"]]
    """ls: one line per cache; verify: recompute every checksum; a damaged cache is reported and
    moved aside (`.corrupt-<key>-*`), so the next precompute computes it again."""
    root: Path = Path("data/fxcache")
    """Cache root (the fxcache volume in the cluster)."""
    key: str | None = None
    """Only this cache (default: all)."""


def cmd_fxcache(cfg: FxcacheCommand) -> int:
    if not cfg.root.is_dir():
        raise FxCacheError(f"{cfg.root}: no such cache root")
    rows = [r for r in list_caches(cfg.root) if cfg.key in (None, r["key"])]
    paths = [r["path"] for r in rows]
    if cfg.action == "ls":
        if not rows:
            print(f"no caches under {cfg.root}")
        for r in rows:
            print(
                f"{r['key']}  {r['symbol']:6} {r['bar_size']:4} {r['start']} .. {r['end']}  "
                f"{r['rows']:>10,} rows  {r['bytes'] / 1e6:9.1f} MB"
            )
        return 0
    if not paths:
        what = f"fxcache {cfg.key}" if cfg.key else "fxcache"
        raise FxCacheError(
            f"{cfg.root}: no {what} there (a cache is a directory holding an fxcache "
            "manifest.json); nothing verified"
        )
    bad = 0
    for path in paths:
        problems = verify(path)
        if problems:
            bad += 1
            moved = quarantine(path)
            print(f"{path.name}  DAMAGED: " + "; ".join(problems) + f" (moved to {moved.name})")
        else:
            print(f"{path.name}  ok")
    if bad:
        print(f"{bad} damaged cache(s): the next precompute recomputes them")
    return 1 if bad else 0


def cmd_ingest(cfg: IngestConfig) -> int:
    with _progress() as progress:
        res = run_ingest(cfg, progress=progress)
    print(res.summary())
    return 0


def cmd_precompute(cfg: PrecomputeConfig) -> int:
    with _progress() as progress:
        res = run_precompute(cfg, progress=progress)
    print(res.summary())
    return 0


def cmd_folds(cfg: FoldsConfig) -> int:
    out, doc = run_folds(cfg)
    for f in doc["folds"]:
        p = f["periods"]
        print(
            f"fold {f['fold']:2d}  train {p['train'][0]}..{p['train'][1]} "
            f"[{f['train_start']}, {f['train_end']})  val [{f['val_start']}, {f['val_end']})  "
            f"test [{f['test_start']}, {f['test_end']})  mean ADX {f['difficulty']:.1f}"
        )
    for d in doc["dropped"]:
        print(f"fold {d['fold']:2d}  dropped: {d['reason']}")
    print(doc.pop("picture"))
    print(f"{len(doc['folds'])} fold(s) of {doc['symbol']} ({doc['fxcache_key']}) written to {out}")
    return 0


def cmd_train(cfg: TrainConfig) -> int:
    res = run_train(cfg)
    print(res.summary())
    return 0


def cmd_report(cfg: ReportConfig) -> int:
    rep = run_report(cfg)
    a, d = rep["aggregate"], rep["deflated_sharpe"]
    print(
        f"{len(rep['rows'])} test range(s): mean Sharpe {a['mean_test_sharpe']:.2f}, "
        f"deflated Sharpe ratio {d['dsr']:.3f} over {d['trials']} trial(s); "
        f"{cfg.out / 'report.md'} and report.html"
    )
    return 0


# Errors a step raises for bad input or missing data: one line naming what is wrong, exit 1.
STEP_ERRORS = (
    OutputError,
    SynthError,
    IngestError,
    PrecomputeError,
    SourceError,
    FoldError,
    FxCacheError,
    TrainError,
    ReportError,
)

COMMANDS = {
    "synth": (cmd_synth, SynthConfig),
    "ingest": (cmd_ingest, IngestConfig),
    "precompute": (cmd_precompute, PrecomputeConfig),
    "fxcache": (cmd_fxcache, FxcacheCommand),
    "folds": (cmd_folds, FoldsConfig),
    "train": (cmd_train, TrainConfig),
    "report": (cmd_report, ReportConfig),
}


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=console, show_path=False, show_time=False)],
    )
    subcommands = {
        name: Annotated[cls, tyro.conf.subcommand(name, description=(cls.__doc__ or "").strip())]
        for name, (_, cls) in COMMANDS.items()
    }
    cfg = tyro.cli(
        Union[tuple(subcommands.values())],  # noqa: UP007 - tyro needs a runtime Union
        args=argv,
        prog="foxhunt",
        description=__doc__,
        config=(tyro.conf.OmitArgPrefixes,),
    )
    for name, (func, cls) in COMMANDS.items():
        if isinstance(cfg, cls):
            try:
                return func(cfg)
            except STEP_ERRORS as e:
                console.print(f"[red]{name} failed:[/red] {e}", soft_wrap=True)
                return 1
    raise AssertionError(f"no command for {type(cfg).__name__}")


if __name__ == "__main__":
    sys.exit(main())
