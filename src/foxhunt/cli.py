"""The `foxhunt` command: one subcommand per pipeline step.

    foxhunt synth --help      demo market data as DBN files
    foxhunt ingest --help     DBN files (or a Databento download) -> validated Parquet

Each subcommand parses into the step's typed config dataclass (its field docstrings are the
`--help` text) and calls the step's one function, exactly as the KFP component does.
"""

from __future__ import annotations

import logging
import sys
from typing import Annotated, Union

import tyro
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from foxhunt.ingest.core import IngestConfig, IngestError, run_ingest
from foxhunt.synth.generate import SynthConfig, generate

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


def cmd_ingest(cfg: IngestConfig) -> int:
    try:
        with _progress() as progress:
            res = run_ingest(cfg, progress=progress)
    except IngestError as e:
        console.print(f"[red]ingest failed:[/red] {e}")
        return 1
    print(res.summary())
    return 0


COMMANDS = {
    "synth": (cmd_synth, SynthConfig),
    "ingest": (cmd_ingest, IngestConfig),
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
    for func, cls in COMMANDS.values():
        if isinstance(cfg, cls):
            return func(cfg)
    raise AssertionError(f"no command for {type(cfg).__name__}")


if __name__ == "__main__":
    sys.exit(main())
