from kfp import dsl

from components.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def precompute(
    ingested: dsl.Input[dsl.Dataset],
    work_dir: str,
    symbols: str,
    bar_size: str,
    fxcache: dsl.Output[dsl.Dataset],
) -> str:
    """Ingested Parquet -> one fxcache per symbol under work_dir/fxcache. Returns a JSON object
    symbol -> cache key; the `fxcache` Dataset lists the caches (key, rows, dates, place on the
    volume), for the UI's lineage."""
    import json
    from pathlib import Path

    from foxhunt.precompute import PrecomputeConfig, run_precompute

    cfg = PrecomputeConfig(
        data=Path(ingested.metadata["path"]),
        out=Path(work_dir) / "fxcache",
        symbols=tuple(s.strip() for s in symbols.split(",") if s.strip()),
        bar_size=bar_size,
    )
    res = run_precompute(cfg)
    print(res.summary())
    caches = {
        s.symbol: {"key": s.key, "rows": s.rows, "start": s.start, "end": s.end, "hit": s.hit,
                   "path": str(s.path)}
        for s in res.symbols
    }  # fmt: skip
    Path(fxcache.path).write_text(json.dumps(caches, indent=2))
    fxcache.metadata.update(path=str(cfg.out), keys={k: v["key"] for k, v in caches.items()})
    return json.dumps({s.symbol: s.key for s in res.symbols})
