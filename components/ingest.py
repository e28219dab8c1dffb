from kfp import dsl

from components.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def scan_raw(raw_dir: str) -> str:
    """A digest of the DBN files in raw_dir (paths, sizes, times; nothing is read): the ingest
    step takes it as a parameter, so its cached result is reused only while the files are the
    same. An empty or missing raw_dir gives '' (ingest downloads or says what is missing)."""
    from pathlib import Path

    from foxhunt.ingest.core import IngestError, inputs_digest

    try:
        digest = inputs_digest(Path(raw_dir))
    except IngestError as e:
        print(e)
        return ""
    print(f"raw files in {raw_dir}: digest {digest}")
    return digest


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def ingest(
    raw_dir: str,
    work_dir: str,
    ingested: dsl.Output[dsl.Dataset],
    raw_digest: str = "",
    on_error: str = "fail",
    download_symbols: str = "",
    start: str = "",
    end: str = "",
    max_cost: float = 10.0,
) -> None:
    """DBN files in raw_dir (downloaded first when download_symbols is set; DATABENTO_API_KEY
    from a Secret) -> Parquet in work_dir/ingested. The `ingested` Dataset is its manifest
    (inputs, rows, validation), with the data's place on the volume and its counts as metadata.
    raw_digest (from scan_raw) is not used here: it is part of the step's cache key."""
    import datetime as dt
    import json
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
    shutil.copy(out / "manifest.json", ingested.path)
    validation = json.loads((out / "manifest.json").read_text())["validation"]
    ingested.metadata.update(
        path=str(out), records=validation["records_written"], mode=validation["mode"]
    )
