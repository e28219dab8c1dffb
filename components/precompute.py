from kfp import dsl

from components.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def precompute(ingested: str, work_dir: str, symbols: str, bar_size: str) -> str:
    """Ingested Parquet -> one fxcache per symbol under work_dir/fxcache. Returns a JSON object
    symbol -> cache key."""
    import json
    from pathlib import Path

    from foxhunt.precompute import PrecomputeConfig, run_precompute

    cfg = PrecomputeConfig(
        data=Path(ingested),
        out=Path(work_dir) / "fxcache",
        symbols=tuple(s.strip() for s in symbols.split(",") if s.strip()),
        bar_size=bar_size,
    )
    res = run_precompute(cfg)
    print(res.summary())
    return json.dumps({s.symbol: s.key for s in res.symbols})
