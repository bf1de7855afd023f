"""Data-parallel DP-SGD under torchrun.

Every rank runs the same sampler (same private seed), so all ranks agree on the step's batch and
each takes the units at positions rank, rank+world, … . Clipped sums are all-reduced (SUM). The
noise is then drawn by every rank from the same per-step generator and added after the reduce, so
the noised sum holds exactly one copy of N(0, σ²C²) and all ranks take the identical step.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1

    @property
    def active(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, device: torch.device) -> "DistContext":
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1 or not dist.is_available():
            return cls()
        if not dist.is_initialized():
            dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        return cls(rank=dist.get_rank(), world_size=dist.get_world_size())

    def shard(self, items: list) -> list:
        return items[self.rank::self.world_size] if self.active else items

    def all_reduce_sum(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        if not self.active or not tensors:
            return tensors
        flat = torch.cat([t.reshape(-1) for t in tensors])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        out, i = [], 0
        for t in tensors:
            out.append(flat[i:i + t.numel()].view_as(t))
            i += t.numel()
        return out

    def broadcast_int(self, value: int | None, device: torch.device) -> int:
        """Rank 0's 128-bit value, on every rank."""
        if not self.active:
            return int(value)
        parts = torch.zeros(4, dtype=torch.int64, device=device)
        if self.is_main:
            parts = torch.tensor([(int(value) >> (32 * i)) & 0xFFFFFFFF for i in range(4)],
                                 dtype=torch.int64, device=device)
        dist.broadcast(parts, src=0)
        return sum(int(p) << (32 * i) for i, p in enumerate(parts.tolist()))

    def barrier(self) -> None:
        if self.active:
            dist.barrier()
