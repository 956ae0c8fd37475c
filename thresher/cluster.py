"""Joining a Ray cluster, for the samplers and verifiers that run there (`executor: ray`)."""

from __future__ import annotations

import sys


def connect(address: str | None) -> None:
    """Join the Ray cluster at `address` once (None: $RAY_ADDRESS, else the cluster last
    started on this machine, else a new local instance: Ray's own rules)."""
    try:
        import ray
    except ImportError:
        raise RuntimeError(
            "executor: ray needs Ray on this machine: pip install 'thresher[ray]'"
        ) from None
    if ray.is_initialized():
        return
    print(f"connecting to Ray at {address or 'auto'} ...", file=sys.stderr, flush=True)
    ray.init(address=address, namespace="thresher", logging_level="WARNING")


def cluster_gpus(address: str | None) -> float:
    """GPUs the cluster has in all."""
    import ray

    connect(address)
    return float(ray.cluster_resources().get("GPU", 0))


def is_cluster_failure(error: BaseException) -> bool:
    """A lost actor or node: worth retrying the batch (Ray restarts the engine)."""
    ray = sys.modules.get("ray")
    if ray is None:
        return False
    from ray.exceptions import ActorDiedError, ActorUnavailableError, NodeDiedError

    return isinstance(error, ActorDiedError | ActorUnavailableError | NodeDiedError)
