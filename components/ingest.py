from kfp import dsl

from components.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def ingest(
    raw_dir: str,
    work_dir: str,
    manifest: dsl.Output[dsl.Artifact],
    on_error: str = "fail",
    download_symbols: str = "",
    start: str = "",
    end: str = "",
    max_cost: float = 10.0,
) -> str:
    """DBN files in raw_dir (downloaded first when download_symbols is set; DATABENTO_API_KEY
    from a Secret) -> Parquet in work_dir/ingested. Returns that directory."""
    import datetime as dt
    import shutil
    from pathlib import Path

    from foxhunt.ingest.core import IngestConfig, run_ingest

    out = Path(work_dir) / "ingested"
    download = bool(download_symbols.strip())
    cfg = IngestConfig(
        raw=Path(raw_dir),
        out=out,
        on_error=on_error,
        download=download,
        symbols=tuple(s.strip() for s in download_symbols.split(",") if s.strip()) or ("ES.FUT",),
        start=dt.date.fromisoformat(start) if start else None,
        end=dt.date.fromisoformat(end) if end else None,
        max_cost=max_cost,
    )
    print(run_ingest(cfg).summary())
    shutil.copy(out / "manifest.json", manifest.path)
    return str(out)
