"""Verification spread over a Ray cluster's CPUs (`executor: ray`): chunks as Ray tasks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from thresher.cluster import connect
from thresher.config import RayConfig
from thresher.verifiers import get_verifier, portable_name

if TYPE_CHECKING:
    import polars as pl

_REMOTE: dict[str, Any] = {}


def _verify_chunk(name: str, options: dict[str, Any] | None, rows):
    return get_verifier(name, options).run(rows)


def verify_on_cluster(
    ray_cfg: RayConfig, name: str, options: dict[str, Any] | None, rows: pl.DataFrame
) -> pl.DataFrame:
    """Verdicts of verifier `name` for `rows`, computed in chunks on the cluster's CPUs."""
    import polars as pl
    import ray

    name = portable_name(name)  # a user's verifier is imported by its module there
    connect(ray_cfg.address)
    if "verify" not in _REMOTE:  # exported to the cluster once per process
        _REMOTE["verify"] = ray.remote(num_cpus=1)(_verify_chunk)
    task = _REMOTE["verify"]
    step = ray_cfg.verify_chunk
    refs = [task.remote(name, options, rows.slice(i, step)) for i in range(0, rows.height, step)]
    return pl.concat(ray.get(refs), how="diagonal_relaxed")
