"""Several training processes under torchrun: the process group, data shards, DDP or FSDP
wrapping, and full (unsharded) state for checkpoints and export.

`Dist()` is a world of one process, where every helper is the identity, so the trainer
runs the same code with or without torchrun. With N processes each optimizer step still
sees the config's whole batch (`batch_size` is the global batch): every rank builds the
same seeded micro-batches and trains on its own disjoint slice (rows rank, rank+N, ...)
of each. A rank's loss is the sum of its answer tokens' losses divided by the answer
tokens of the whole step (every rank, every micro-batch: all ranks count them from the
same rows), times N because DDP and FSDP average gradients over ranks; so the gradient is
the one a single process computes on the whole batch, up to float rounding. The logged
loss is the ranks' parts summed with an all-reduce: the same token-level mean.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

Strategy = Literal["ddp", "fsdp"]


@dataclass(frozen=True)
class Dist:
    """This process's place among the training processes (a world of one by default)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    strategy: Strategy = "ddp"
    backend: str = "gloo"
    device: str | None = None  # cuda:<local_rank> on GPU machines, None on CPU

    @property
    def main(self) -> bool:
        """Whether this process logs, writes checkpoints and exports (rank 0)."""
        return self.rank == 0

    @property
    def fsdp(self) -> bool:
        """Whether parameters are sharded over the processes."""
        return self.world > 1 and self.strategy == "fsdp"

    @property
    def load_device(self) -> str | None:
        """Where load_model puts the weights: the CPU until FSDP shards them."""
        return "cpu" if self.fsdp else self.device

    def shard(self, batch: list[int]) -> tuple[list[int], float]:
        """This rank's slice of a global batch, and its weight (0: a stand-in row).

        A rank left without rows (a batch smaller than the world) runs one row with
        weight 0, so that every rank takes part in the same collectives."""
        mine = batch[self.rank :: self.world]
        return (mine, 1.0) if mine else (batch[:1], 0.0)

    def sum(self, *values: float) -> list[float]:
        """The values summed over all processes."""
        if self.world == 1:
            return list(values)
        import torch
        import torch.distributed as dist

        where = self.device if self.backend == "nccl" else "cpu"
        t = torch.tensor(values, dtype=torch.float64, device=where)
        dist.all_reduce(t)
        return t.tolist()

    def barrier(self) -> None:
        """Wait for every process."""
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def wrap(self, model):
        """The model as it trains here: as is, under DDP, or sharded with FSDP2."""
        if self.world == 1:
            return model
        if self.strategy == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.local_rank] if self.device else None
            return DistributedDataParallel(model, device_ids=ids, **_no_buffer_sync())
        return _fully_shard(model, "cuda" if self.device else "cpu", self.world)

    def unwrap(self, model):
        """The module under a DDP wrapper (FSDP2 modules are their own module)."""
        return model.module if self.world > 1 and self.strategy == "ddp" else model

    @contextmanager
    def grad_sync(self, model, sync: bool) -> Iterator[None]:
        """Skip the gradient reduction on all but the last micro-batch of a step."""
        if self.world == 1 or sync:
            yield
        elif self.strategy == "ddp":
            with model.no_sync():
                yield
        else:
            model.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)

    def full_state(self, model, keys: set[str] | None = None) -> dict[str, Any]:
        """model.state_dict() (only `keys` when given) unsharded on the CPU: complete on
        rank 0, empty elsewhere. Every process must call it (it gathers the shards)."""
        state = model.state_dict()
        full = {k: self._gathered(v) for k, v in state.items() if keys is None or k in keys}
        return full if self.main else {}

    def optim_state(self, opt) -> dict[str, Any]:
        """opt.state_dict() with unsharded tensors (on rank 0; the same layout as one
        process writes). Every process must call it."""
        state = opt.state_dict()
        if not self.fsdp:
            return state
        full = {i: {k: self._gathered(v) for k, v in s.items()} for i, s in state["state"].items()}
        return {"state": full, "param_groups": state["param_groups"]} if self.main else {}

    def _gathered(self, value):
        """A DTensor gathered whole (a collective), on rank 0's CPU; None elsewhere."""
        if hasattr(value, "full_tensor"):
            value = value.full_tensor()
        if not self.main:
            return None
        return value.detach().cpu() if hasattr(value, "detach") else value

    def load_optim_state(self, opt, state: dict[str, Any]) -> None:
        """Load an unsharded optimizer state, sharding it as the parameters are."""
        if self.fsdp:
            from torch.distributed.tensor import DTensor, distribute_tensor

            ids = [i for g in state["param_groups"] for i in g["params"]]
            params = dict(zip(ids, [p for g in opt.param_groups for p in g["params"]], strict=True))
            for i, s in state["state"].items():
                p = params[i]
                for k, v in s.items():
                    if isinstance(p, DTensor) and v.shape == p.shape and v.dim() > 0:
                        # every rank read the whole tensor: each keeps its own shard
                        s[k] = distribute_tensor(
                            v.to(p.device), p.device_mesh, p.placements, src_data_rank=None
                        )
        opt.load_state_dict(state)


def _no_buffer_sync() -> dict[str, bool]:
    """DDP's option not to broadcast buffers each forward (they never change here)."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    names = inspect.signature(DistributedDataParallel.__init__).parameters
    key = "forward_sync_buffers" if "forward_sync_buffers" in names else "broadcast_buffers"
    return {key: False}


def _fully_shard(model, device_type: str, world: int):
    """FSDP2: each transformer block its own shard group, the rest in the root's."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device_type, (world,))
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    blocks = set(getattr(base, "_no_split_modules", None) or [])
    for module in [m for m in model.modules() if type(m).__name__ in blocks]:
        fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def init_distributed(strategy: Strategy = "ddp", backend: str = "auto") -> Dist:
    """Join the process group torchrun set up (RANK, WORLD_SIZE, LOCAL_RANK); each
    process on its own GPU when there are GPUs. backend auto: nccl on GPUs, else gloo."""
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    cuda = torch.cuda.is_available()
    if backend == "auto":
        backend = "nccl" if cuda else "gloo"
    if backend == "nccl" and not cuda:
        raise ValueError("backend nccl needs CUDA GPUs; use gloo (or auto) without them")
    device = None
    if cuda:
        if local >= torch.cuda.device_count():
            raise ValueError(
                f"{os.environ.get('LOCAL_WORLD_SIZE', world)} processes on this machine but "
                f"only {torch.cuda.device_count()} GPUs visible: one process per GPU"
            )
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    dist.init_process_group(backend)
    return Dist(rank, world, local, strategy, backend, device)


def close_distributed() -> None:
    """Leave the process group."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
