"""precompute-features: ingest -> precompute (fill the fxcache for later training runs)."""

from typing import Literal

from kfp import dsl

from pipelines.platform import RAW_MOUNT, WORK_MOUNT, Cluster, ingest_and_precompute


def build_precompute_features(
    platform: Literal["cluster", "local"] = "cluster", cluster: Cluster | None = None
):
    local = platform == "local"
    cluster = cluster or Cluster.from_env()

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
        ingest_and_precompute(
            local, cluster, raw_dir, work_dir, download_symbols, start, end, symbols, bar_size,
            raw_pvc, fxcache_pvc,
        )  # fmt: skip

    return precompute_features
