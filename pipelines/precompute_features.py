"""precompute-features: ingest -> precompute (fill the fxcache for later training runs)."""

from typing import Literal

from kfp import dsl

from components import ingest, precompute
from pipelines.platform import DATABENTO_SECRET, RAW_MOUNT, WORK_MOUNT, Cluster, configure


def build_precompute_features(
    platform: Literal["cluster", "local"] = "cluster", cluster: Cluster | None = None
):
    local = platform == "local"
    cluster = cluster or Cluster()

    @dsl.pipeline(name="precompute-features", description="Databento DBN -> fxcache")
    def precompute_features(
        symbols: str = "ES,NQ",
        bar_size: str = "1m",
        start: str = "",
        end: str = "",
        download_symbols: str = "",
        raw_dir: str = "data/raw" if local else RAW_MOUNT,
        work_dir: str = "data" if local else WORK_MOUNT,
        raw_pvc: str = "foxhunt-raw",
        fxcache_pvc: str = "foxhunt-fxcache",
    ):
        ing = ingest(raw_dir=raw_dir, work_dir=work_dir, download_symbols=download_symbols,
                     start=start, end=end)  # fmt: skip
        ing.set_display_name("Ingest DBN files").set_caching_options(True)
        ing.set_retry(num_retries=2, backoff_duration="60s")
        pre = precompute(ingested=ing.outputs["Output"], work_dir=work_dir, symbols=symbols,
                         bar_size=bar_size)  # fmt: skip
        pre.set_display_name("Bars, features, order flow -> fxcache").set_caching_options(True)
        if not local:
            configure(ing, "ingest", cluster, raw_pvc, fxcache_pvc, (DATABENTO_SECRET,))
            configure(pre, "precompute", cluster, work_pvc=fxcache_pvc)

    return precompute_features
