"""Sharded full fine-tuning: FSDP2 (`torch.distributed.fsdp.fully_shard`) under torchrun.

`sharding: fsdp` (policy `training.sharding`, TrainSpec.sharding) with WORLD_SIZE > 1 shards every
trainable weight, its Adam state and its gradient across the ranks (ZeRO-3 layout: dim-0 chunks);
each transformer block is one FSDP unit, the rest (embeddings, tied LM head, final norm) is the
root's. A block's weights are all-gathered for its forward and again for its backward, then freed.

The DP step (`ShardedDPStep`), per step:
1. Each rank takes its own units of the step's Poisson batch (as in plain data parallel).
2. Per-record gradients come from layer inputs a and output gradients g (grad_samplers.HookPerRecord,
   book-kept clipped sums, no parameter .grad formed). FSDP shards weights, never activations: a and
   g of a rank's records are whole on that rank, so each unit's squared norm — summed over every
   layer, instantiated or ghost — is computed whole there and nothing of it lies on another shard;
   clipping reads only it. (A design that held per-record gradients sharded would have to sum the
   norm pieces across shards before clipping; this one never splits them.)
3. FSDP's all-gathers are collectives, so every rank runs the same number of forward/backward passes:
   the ranks agree on the step's most passes (all-reduce MAX) and a rank with fewer runs padding
   passes on one record whose result is discarded (it adds nothing to the sum, loss or counts).
4. The local clipped sum (full shape) is all-reduced, weight by weight; each rank keeps its shard.
5. Noise: every rank draws the same full N(0, σ²C²) vector from the step's seeded stream, weight by
   weight in the unsharded run's order, and adds only its shard's slice of it. The assembled noise is
   exactly the unsharded run's noise (one copy, same numbers).
6. Each rank divides by the expected batch size and steps Adam on its shard (state sharded).
So the released update is the unsharded run's up to float summation order; the accounting (q, σ, C,
T) and therefore ε are unchanged.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from components.core.errors import VeilError
from components.dpsgd.distributed import DistContext
from components.dpsgd.per_sample import pack, sequence_losses
from components.dpsgd.sampling import noise_seed
from components.dpsgd.step import DPStep
from components.dpsgd.grad_samplers import supported
from components.mechanisms.base import Mechanism, PlainStep


def active(spec, dctx: DistContext) -> bool:
    """fsdp was asked for and there is more than one rank (one process has nothing to shard)."""
    return spec.sharding == "fsdp" and dctx.active


def _blocks(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks: the children of the largest ModuleList whose children share one type."""
    best: list[nn.Module] = []
    for m in model.modules():
        if isinstance(m, nn.ModuleList) and len(m) > len(best) and len({type(c) for c in m}) == 1:
            best = list(m)
    return best


def shard_model(model: nn.Module, dctx: DistContext):
    """Apply FSDP2 in place (each block its own unit, then the root); returns the device mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard


    if not supported(model):
        raise VeilError("sharding fsdp: a trainable layer has no per-record sampler (grad_samplers); "
                        "train it with sharding: none")
    device = next(model.parameters()).device
    mesh = init_device_mesh(device.type, (dctx.world_size,))
    for block in _blocks(model):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return mesh


def is_sharded(p: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(p, DTensor)


def local_slice(full: torch.Tensor, p) -> torch.Tensor:
    """The part of `full` (a tensor of p's global shape) that p's local shard holds on this rank."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
    return full[tuple(slice(o, o + s) for o, s in zip(offset, shape))]


def full_state(named: list[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """{name: whole tensor on the CPU} of (possibly sharded) parameters. A collective: every rank calls it."""
    return {n: (p.full_tensor() if is_sharded(p) else p).detach().cpu().clone() for n, p in named}


def full_optimizer_state(model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    """The optimizer's state with whole tensors keyed by parameter name (a collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_optimizer_state(model: nn.Module, opt: torch.optim.Optimizer, state: dict) -> None:
    """Load `full_optimizer_state`'s dict back, each rank keeping its shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, opt, optim_state_dict=state,
                             options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=False))


def load_params(named: list[tuple[str, torch.Tensor]], state: dict[str, torch.Tensor]) -> None:
    """Copy whole tensors into (possibly sharded) parameters: each rank copies its slice."""
    with torch.no_grad():
        for n, p in named:
            src = state[n].to(p.device, p.dtype)
            if is_sharded(p):
                p.to_local().copy_(local_slice(src, p))
            else:
                p.copy_(src)


class ShardedDPStep(DPStep):
    """DPStep over FSDP2-sharded weights (see the module docstring for what each rank does)."""

    def __init__(self, model, optimizer, **kw):
        super().__init__(model, optimizer, **kw)
        if not self.private:
            raise VeilError("sharding fsdp: runs the private step only (the non-private baseline is not sharded)")
        if self.per_unit._hooks is None:
            raise VeilError("sharding fsdp: needs the per-layer samplers, not per_record vmap")
        self.passes = 0    # forward/backward passes run by this rank, padding included (tests read it)
        self.padding = 0   # of which padding passes

    def _all(self, values: list[float], op) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.named[0][1].device)
        dist.all_reduce(t, op=op)
        return t.tolist()

    def __call__(self, step: int, units, ids_all: np.ndarray, lengths_all: np.ndarray) -> tuple[float, int]:
        device = self.named[0][1].device
        pu, hooks = self.per_unit, self.per_unit._hooks
        if not pu._checked:
            self._self_check(units, ids_all, lengths_all, device)
        # one pass per group of whole units; a unit larger than micro_batch_size is one pass on its
        # own (the unsharded step would split it into micro-batches: same gradient, one pass here keeps
        # every rank's pass sequence alike)
        groups = pack(units, self.mbs)
        (n_pass,) = self._all([float(len(groups))], dist.ReduceOp.MAX)
        total = {n: torch.zeros(p.shape, dtype=p.dtype, device=device) for n, p in self.named}
        loss_sum, n_rec = 0.0, 0
        bad = torch.zeros((), dtype=torch.int64, device=device)
        for i in range(int(n_pass)):
            self.passes += 1
            if i >= len(groups):  # padding: the same collectives as a real pass, its result discarded
                self.padding += 1
                T = max(2, int(lengths_all[0]))
                hooks.clipped_group(torch.as_tensor(ids_all[:1, :T], device=device),
                                    torch.as_tensor(lengths_all[:1], device=device),
                                    torch.ones(1, dtype=torch.float64, device=device),
                                    torch.zeros(1, dtype=torch.long, device=device), 1, self.C, sequence_losses,
                                    ghost=pu._ghost)
                continue
            group = groups[i]
            recs = np.concatenate([u.records for u in group])
            owner = np.repeat(np.arange(len(group)), [len(u.records) for u in group])
            w = np.repeat(np.array([u.weight for u in group], dtype=np.float64), [len(u.records) for u in group])
            T = max(2, int(lengths_all[recs].max()))
            sums, losses = hooks.clipped_group(
                torch.as_tensor(ids_all[recs, :T], device=device), torch.as_tensor(lengths_all[recs], device=device),
                torch.as_tensor(w, device=device), torch.as_tensor(owner, device=device), len(group),
                self.C, sequence_losses, ghost=pu._ghost)
            for n in total:
                total[n] += sums[n]
            bad = bad + hooks.last_nonfinite
            loss_sum += float(losses.sum())
            n_rec += len(recs)
        pu.nonfinite_units += int(bad)
        stats = self._all([loss_sum, float(n_rec), float(int(bad))], dist.ReduceOp.SUM)
        self.nonfinite_units += int(stats[2])

        gen = None
        if self.sigma > 0:
            gen = torch.Generator(device=device)
            gen.manual_seed(noise_seed(self.private_seed, step))
        std = self.sigma * self.C
        finite = True
        for n, p in self.named:   # the unsharded step's order: the noise stream is consumed alike
            g = total.pop(n).float()
            dist.all_reduce(g, op=dist.ReduceOp.SUM)
            mine = local_slice(g, p)
            if gen is not None:
                noise = torch.normal(0.0, std, size=g.shape, generator=gen, device=device, dtype=torch.float32)
                mine = mine + local_slice(noise, p)   # this shard's slice of the one noise vector
                del noise
            finite = finite and bool(torch.isfinite(mine).all())
            grad = (mine / self.expected).to(p.dtype).contiguous()
            del g
            p.grad = _as_param_grad(grad, p)
        # every rank must take the same branch (a lone raise would leave the others in a collective)
        if self._all([1.0 if finite else 0.0], dist.ReduceOp.MIN)[0] < 1.0:
            raise VeilError(f"training step {step + 1}: the noisy update is not finite although every unit's "
                            "contribution was finite and clipped: the model's numbers diverged (lower the "
                            "learning rate or train in float32); the run stops, its steps are still charged")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        ok = all(bool(torch.isfinite(p.to_local() if is_sharded(p) else p).all()) for _, p in self.named)
        if self._all([1.0 if ok else 0.0], dist.ReduceOp.MIN)[0] < 1.0:
            raise VeilError(f"training step {step + 1}: the model's trainable weights are not finite (they were "
                            "before training, or the optimizer diverged): check the base model and the learning rate")
        return float(stats[0]), int(stats[1])

    def _self_check(self, units, ids_all, lengths_all, device) -> None:
        """PerUnitGradients.self_check in lock-step: every rank checks two records (its first two, or
        record 0 when it has none this step) with the same passes, against autograd's gradient with
        respect to the gathered weights the forward used (the sharded ones are not in the graph)."""
        pu, hooks = self.per_unit, self.per_unit._hooks
        recs = np.concatenate([u.records for u in units]) if units else np.zeros(0, dtype=np.int64)
        recs = np.resize(recs if len(recs) else np.zeros(1, dtype=np.int64), 2)
        T = max(2, int(lengths_all[recs].max()))
        ids = torch.as_tensor(ids_all[recs, :T], device=device)
        lengths = torch.as_tensor(lengths_all[recs], device=device)
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(0)
            per, _ = hooks(ids, lengths, sequence_losses)
        for _, p in self.named:
            p.grad = None
        used: dict[str, torch.Tensor] = {}

        def capture(module, _inputs, own):
            for local, name in own.items():
                used[name] = getattr(module, local)   # the gathered weight this forward computes with

        handles = [m.register_forward_pre_hook(lambda mod, inp, own=own: capture(mod, inp, own))
                   for m, own in hooks.layers]
        compared, wrong = 0, None
        try:
            for b in range(ids.shape[0]):
                used.clear()
                with torch.random.fork_rng(devices=devices):
                    torch.manual_seed(0)
                    out = hooks._forward(ids)
                    grads = torch.autograd.grad(sequence_losses(out.logits, ids, lengths)[b],
                                                [used[n] for n in pu.names], allow_unused=True)
                if not all(g is None or bool(torch.isfinite(g).all()) for g in grads) or wrong is not None:
                    continue
                compared += 1
                for n, want, (_, p) in zip(pu.names, grads, self.named):
                    want = torch.zeros(p.shape, dtype=p.dtype, device=device) if want is None else want
                    got = per[n][b]
                    rel = 3e-2 if p.dtype in (torch.float16, torch.bfloat16) else 1e-3
                    tol = rel * float(want.abs().max()) + 1e-7
                    if not torch.allclose(got.float(), want.float(), rtol=rel, atol=tol):
                        wrong = n
                        break
        finally:
            for h in handles:
                h.remove()
        mins = self._all([0.0 if wrong is not None else 1.0, 1.0 if compared else 0.0], dist.ReduceOp.MIN)
        if mins[0] < 1.0:
            layer = (wrong or "a layer").rsplit(".", 1)[0]
            raise VeilError(f"per-record gradients of {layer} disagree with autograd on some rank; "
                            "train with sharding: none and per_record='vmap'")
        pu._checked = mins[1] > 0   # all ranks compared a finite record: else all check again next step


def make_step(mech, spec, model, optimizer, *, private_seed: int, dctx: DistContext, expected: float):
    """The mechanism's standard DP step, sharded. A mechanism with its own step runner (non-private,
    filtered ULS) is refused: its step is not the one this module shards."""

    if type(mech).make_step is not Mechanism.make_step:
        raise VeilError(f"sharding fsdp: mechanism {spec.mechanism!r} has its own step; train it with sharding: none")
    return PlainStep(ShardedDPStep(model, optimizer, private=True, clip_norm=float(spec.clip_norm),
                                   noise_multiplier=float(spec.noise_multiplier), expected_batch_size=expected,
                                   micro_batch_size=spec.micro_batch_size, private_seed=private_seed, dctx=dctx,
                                   per_record=spec.per_record))


def _as_param_grad(local: torch.Tensor, p):
    from torch.distributed.tensor import DTensor

    if not is_sharded(p):
        return local
    return DTensor.from_local(local, p.device_mesh, p.placements, shape=p.shape, stride=p.stride(),
                              run_check=False)


def save_model(model: nn.Module, model_dir: str, tokenizer, is_main: bool) -> None:
    """save_pretrained of a sharded model: the whole weights are gathered (a collective), rank 0 writes."""
    state = _full_model_state(model)
    if is_main:
        model.save_pretrained(model_dir, state_dict=state)
        if hasattr(tokenizer, "save_pretrained"):
            tokenizer.save_pretrained(model_dir)


def _full_model_state(model: nn.Module) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
