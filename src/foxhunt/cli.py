"""The `foxhunt` command: one subcommand per pipeline step.

    foxhunt synth --help      demo market data as DBN files
    foxhunt ingest --help     DBN files (or a Databento download) -> validated Parquet
    foxhunt precompute --help ingested data -> the fxcache (bars, features, order flow)
    foxhunt fxcache ls        list the precomputed caches (fxcache verify: check them)
    foxhunt folds --help      walk-forward train/val/test ranges of a cache, as JSON
    foxhunt train --help      a model over the folds (dqn, ppo, pqn, tlob, cfc, mamba2, tft,
                              their ensemble), on a GPU or the CPU
    foxhunt report --help     test metrics over folds and seeds, deflated Sharpe, equity curves
    foxhunt bench --help      training speed, memory and stability of every model on this machine

Each subcommand parses into the step's typed config dataclass (its field docstrings are the
`--help` text) and calls the step's one function, exactly as the KFP component does.
"""

from __future__ import annotations

import importlib
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import tyro
from rich.console import Console

from foxhunt.errors import StepError, Terminated

console = Console(stderr=True)

# name -> (module holding its config, config class). A step's module is imported only when
# that step runs: `foxhunt --help` imports none of them (torch alone takes seconds to import).
COMMANDS = {
    "synth": ("foxhunt.synth.generate", "SynthConfig"),
    "ingest": ("foxhunt.ingest.core", "IngestConfig"),
    "precompute": ("foxhunt.precompute.core", "PrecomputeConfig"),
    "fxcache": ("foxhunt.cli", "FxcacheCommand"),
    "folds": ("foxhunt.folds.core", "FoldsConfig"),
    "train": ("foxhunt.train.core", "TrainConfig"),
    "report": ("foxhunt.report.core", "ReportConfig"),
    "bench": ("foxhunt.bench.core", "BenchConfig"),
}


def _reflow_field_docstrings() -> None:
    """Field docstrings as paragraphs in `--help`. tyro (1.0) reads a config field's docstring
    through docstring_parser, which keeps the source's indentation on its continuation lines,
    and then starts a new help line at every indented line: each wrapped docstring came out
    as ragged lines. Here each paragraph is joined into one line before tyro sees it, and
    tyro wraps it to the terminal (a paragraph holding a list keeps its lines)."""
    import inspect
    import re

    from tyro import _docstrings

    parse = getattr(_docstrings, "parse_docstring_from_object", None)
    if parse is None or getattr(parse, "reflowed", False):
        return

    def paragraph(text: str) -> str:
        return text if re.search(r"^\s*[-*] ", text, re.M) else " ".join(text.split())

    def reflowed(obj: object) -> dict[str, str]:
        return {
            name: "\n\n".join(paragraph(p) for p in re.split(r"\n\s*\n", inspect.cleandoc(doc)))
            for name, doc in parse(obj).items()
        }

    reflowed.reflowed = True
    _docstrings.parse_docstring_from_object = reflowed


def _progress():
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )


def cmd_synth(cfg) -> int:
    from foxhunt.synth.generate import generate

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
    from foxhunt.fxcache import FxCacheError, list_caches, verify
    from foxhunt.fxcache.store import quarantine

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


def cmd_ingest(cfg) -> int:
    from foxhunt.ingest.core import run_ingest

    with _progress() as progress:
        res = run_ingest(cfg, progress=progress)
    print(res.summary())
    return 0


def cmd_precompute(cfg) -> int:
    from foxhunt.precompute.core import run_precompute

    with _progress() as progress:
        res = run_precompute(cfg, progress=progress)
    print(res.summary())
    return 0


def cmd_folds(cfg) -> int:
    from foxhunt.folds.core import run_folds

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


def cmd_train(cfg) -> int:
    from foxhunt.train import distributed
    from foxhunt.train.core import run_train, train_seeds

    if cfg.seeds:  # side by side in this process
        for seed, res in zip(cfg.seeds, train_seeds(cfg), strict=True):
            print(f"seed {seed}:\n{res.summary()}")
        return 0
    if cfg.gpus > 1 and not distributed.launched():  # one process per GPU, through torchrun
        try:
            res = distributed.run_ranks(cfg)
        except Exception as e:  # torchrun's ChildFailedError: a rank failed, the job ended
            console.print(f"[red]train failed:[/red] {e}", soft_wrap=True)
            return 1
    else:
        res = run_train(cfg)
    if distributed.launched_rank() == 0:  # a data-parallel job's rank 0 speaks for it
        print(res.summary())
    return 0


def cmd_report(cfg) -> int:
    from foxhunt.report.core import run_report

    rep = run_report(cfg)
    a, d = rep["aggregate"], rep["deflated_sharpe"]
    print(
        f"{len(rep['rows'])} test range(s): mean Sharpe {a['mean_test_sharpe']:.2f}, "
        f"deflated Sharpe ratio {d['dsr']:.3f} over {d['trials']} trial(s); "
        f"{cfg.out / 'report.md'} and report.html"
    )
    return 0


def cmd_bench(cfg) -> int:
    from foxhunt.bench.core import run_bench

    rep = run_bench(cfg)
    if "decision" in rep:
        d = rep["decision"]
        print(f"decision: {d['recommendation']} ({d['reason']})")
    print(f"{cfg.out / 'report.md'} and report.json")
    failures = rep.get("gate", {}).get("failures", [])
    for f in failures:
        console.print(f"[red]slower than the baseline:[/red] {f}", soft_wrap=True)
    bad = [m for m, w in rep["workloads"].items() if w["status"] != "ok"]
    return 1 if failures or bad else 0


def usage() -> str:
    return f"usage: foxhunt COMMAND [--help | OPTIONS]\n\n{__doc__.strip()}\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        console.print(f"foxhunt: no command {name!r}\n\n{usage()}", soft_wrap=True)
        return 2
    from rich.logging import RichHandler

    logging.basicConfig(
        level=logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=console, show_path=False, show_time=False)],
    )
    module, cls_name = COMMANDS[name]
    cls = getattr(importlib.import_module(module), cls_name)
    # A config's __post_init__ refusing a value (ValueError) is reported by tyro, exit 2.
    # train's and bench's nested configs keep their prefixes (--dqn.lr, --ppo.lr,
    # --env.fee-bps; --plan.epochs): their fields share names.
    flat = () if name in ("train", "bench") else (tyro.conf.OmitArgPrefixes,)
    _reflow_field_docstrings()
    cfg = tyro.cli(cls, args=rest, prog=f"foxhunt {name}", config=flat)
    try:
        return globals()[f"cmd_{name}"](cfg)
    except StepError as e:
        console.print(f"[red]{name} failed:[/red] {e}", soft_wrap=True)
        return 1
    except (KeyboardInterrupt, Terminated) as e:
        console.print(f"{name} stopped: {type(e).__name__}", soft_wrap=True)
        return 143 if isinstance(e, Terminated) else 130


if __name__ == "__main__":
    sys.exit(main())
