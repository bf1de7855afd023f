"""The DP-SGD loop: select (Poisson) → per-unit gradients → clip → sum → noise once → ÷ expected
batch → optimizer step. Accounting lives elsewhere; this module only runs the mechanism the plan
accounted for and reports what it actually ran."""
from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import torch

from components.core.errors import VeilError
from components.core.progress import progress as _progress
from components.core.faults import kill_point
from components.training import checkpoint as ckpt, sharding
from components.mechanisms import get as get_mechanism
from components.dpsgd.batches import BatchBuilder
from components.dpsgd.data import records_by_user, tokenize_table, user_streams
from components.dpsgd.distributed import DistContext
from components.dpsgd.model_prep import prepare_model
from components.dpsgd.precision import MasterWeights, cast_base, describe as describe_precision
from components.dpsgd.sampling import PoissonSampler
from components.training.spec import TrainResult, TrainSpec
from components.core.fingerprints import base_fingerprints, weights_fingerprint


def _data_fingerprint(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


# Schema metadata key under which `draws.data.training_records` passes on the sha256 of the
# train-records file it read (the run records it; the certificate compares it with the plan's).
TRAIN_RECORDS_SHA256_KEY = b"veil.train_records_sha256"


def _device_and_precision(device: torch.device, params: list[torch.Tensor], spec: TrainSpec) -> tuple[str, str]:
    name = device.type
    if device.type == "cuda":
        name = f"cuda ({torch.cuda.get_device_name(device)})"
    if spec.precision == "fp32":
        prec = "/".join(sorted({str(p.dtype).replace("torch.", "") for p in params}))
    else:
        prec = describe_precision(spec.precision, full_finetune=spec.lora is None)
    if device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        prec += " (tf32 matmul)"
    return name, prec


def train(spec: TrainSpec, data: pa.Table, model: torch.nn.Module, tokenizer, out_dir, *,
          resume: bool = True, progress: bool = True,
          on_step: Callable[[int], None] | None = None, base_dir: str | Path | None = None) -> TrainResult:
    """Run `spec` on `data` (user_id, text[, rate]); returns what was actually run.

    out_dir receives checkpoint.pt, progress.json, private_seed (secret: keep it with the run, never
    publish it), adapter/ (LoRA) or model/ (full fine-tuning) and train_result.json.
    A second call with the same out_dir resumes from the last checkpoint (resume=True).
    `on_step(steps_done)` is called after every step (tests use it to pace a run).
    `base_dir`: the directory `model` and `tokenizer` were loaded from; its and its tokenizer's
    hashes go into the result (and so into the certificate). The sha256 of the train-records file
    comes from `data`'s schema metadata when `draws.data.training_records` built it.
    """
    t0 = time.time()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    device = next(model.parameters()).device
    dctx = DistContext.from_env(device)

    torch.manual_seed(int(spec.seed))
    mech = get_mechanism(spec.mechanism)
    mech.check_runtime(dctx.world_size)
    if spec.precision != "fp32":
        # the base in 16 bits (a no-op when loaded so); LoRA weights are made float32 by prepare_model,
        # full fine-tuning's by the master copies below (components/dpsgd/precision.py)
        model = cast_base(model, spec.precision)
    model = prepare_model(model, spec)
    model.train()
    sharded = sharding.active(spec, dctx)
    if sharded:     # FSDP2: weights, gradients and Adam state sharded across the ranks (sharding.py)
        sharding.shard_model(model, dctx)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        raise VeilError("model: no trainable parameters")
    params = [p for _, p in named]

    # --- data and units -------------------------------------------------------------------
    tok = tokenize_table(data, tokenizer, spec.seq_len)
    by_user = records_by_user(tok)
    # what the Poisson sampler draws (users or records) and what the step divides by: the mechanism's
    rates = mech.unit_rates(spec, data, tok, by_user)
    if mech.bounds_records and not mech.samples_users:
        counts = np.array([len(r) for r in by_user])
        worst = int(counts.argmax())
        if counts[worst] > int(spec.records_per_user):
            raise VeilError(
                f"training data: user {tok.users[worst]!r} has {int(counts[worst])} records but "
                f"{spec.mechanism} is bounded to k={spec.records_per_user}; pass only the plan's selected records")
    expected = mech.step_divisor(spec, rates)
    if not expected > 0:
        raise VeilError("training data: expected batch size is 0 (all sampling rates are 0)")
    mode = mech.batch_mode(spec)
    streams = user_streams(data, tokenizer, tok.users) if mode == "uls-chunks" else None
    fingerprint = _data_fingerprint(tok.ids, tok.lengths, tok.user_index, rates,
                                    *(streams if streams is not None else []))

    # --- private randomness ------------------------------------------------------------------
    if spec.private_seed is not None:
        private_seed, seed_source = int(spec.private_seed), "spec"
    else:
        private_seed = ckpt.private_seed_for(out_dir, resume) if dctx.is_main else 0
        private_seed = dctx.broadcast_int(private_seed, device)
        seed_source = "os_entropy"
    sampler = PoissonSampler(rates, private_seed)

    # the optimizer updates float32 masters of 16-bit trainable weights (full fine-tuning in bf16/fp16;
    # DPStep copies them back into the model after each step), the weights themselves otherwise
    masters = MasterWeights(named)
    opt = (torch.optim.SGD(masters.params, lr=float(spec.learning_rate)) if spec.optimizer == "sgd"
           else torch.optim.Adam(masters.params, lr=float(spec.learning_rate)))

    # --- resume -------------------------------------------------------------------------------
    start, losses, batch_sizes, resumed_from = 0, [], [], None
    halted_at = None  # a mechanism whose step may halt (filtered ULS): the step that halted it
    state = ckpt.load_checkpoint(out_dir) if resume else None
    if state is not None:
        # a checkpoint from before the precision setting trained in fp32
        if {"precision": "fp32", **state["spec"]} != spec.identity():
            raise VeilError(f"{out_dir}: holds a checkpoint of a different training spec; "
                            "use a fresh folder or resume=False")
        if state["data"] != fingerprint:
            raise VeilError(f"{out_dir}: holds a checkpoint trained on different data; "
                            "use a fresh folder or resume=False")
        if state["private_seed_sha"] != hashlib.sha256(str(private_seed).encode()).hexdigest():
            raise VeilError(f"{out_dir}: private seed does not match the checkpoint's")
        try:
            if sharded:   # the checkpoint holds whole tensors: each rank takes its shard
                sharding.load_params(named, state["trainable"])
                sharding.load_optimizer_state(model, opt, state["optimizer"])
            else:
                with torch.no_grad():
                    for n, p in masters.named:
                        p.copy_(state["trainable"][n].to(p.device, p.dtype))
                masters.sync()
                opt.load_state_dict(state["optimizer"])
            torch.set_rng_state(state["torch_rng"])
            if device.type == "cuda" and state.get("cuda_rng") is not None:
                torch.cuda.set_rng_state_all(state["cuda_rng"])
            start, losses, batch_sizes = int(state["step"]), list(state["losses"]), list(state["batch_sizes"])
        except (KeyError, RuntimeError, ValueError, TypeError, AttributeError) as e:
            raise VeilError(f"{out_dir / ckpt.CHECKPOINT}: does not fit this model and optimizer "
                            f"({type(e).__name__}); use a fresh folder or resume=False") from None
        halted_at = state.get("halted_at")
        resumed_from = start
    prior_attempted = ckpt.read_ledger(out_dir) if (resume and dctx.is_main) else 0

    def save(step: int) -> None:
        # sharded: the whole weights and Adam state are gathered first (collectives: every rank)
        trainable = sharding.full_state(named) if sharded else None
        optimizer = sharding.full_optimizer_state(model, opt) if sharded else None
        if not dctx.is_main:
            return
        ckpt.save_checkpoint(out_dir, {
            "step": step, "spec": spec.identity(), "data": fingerprint,
            "private_seed_sha": hashlib.sha256(str(private_seed).encode()).hexdigest(),
            # float32 masters of 16-bit weights (the model's own weights otherwise)
            "trainable": trainable if sharded else {n: p.detach().cpu().clone() for n, p in masters.named},
            "optimizer": optimizer if sharded else opt.state_dict(), "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if device.type == "cuda" else None,
            "sampler": sampler.state_dict(step), "losses": losses, "batch_sizes": batch_sizes,
            "halted_at": halted_at,
        })

    G = int(spec.records_per_user) if spec.records_per_user else None
    batches = BatchBuilder(mode, tok, by_user, G=G, streams=streams, seq_len=spec.seq_len)
    if sharded:
        step_fn = sharding.make_step(mech, spec, model, opt, private_seed=private_seed, dctx=dctx, expected=expected)
    else:
        step_fn = mech.make_step(spec, model, opt, n_units=len(rates), private_seed=private_seed, dctx=dctx,
                                 expected=expected)
    started = 0
    try:
        with _progress("train (DP steps)", int(spec.steps), on=progress and dctx.is_main and spec.steps > start) as tick:
            if start:
                tick(start)     # resumed: the steps before the checkpoint are done
            for step in range(start, int(spec.steps) if halted_at is None else start):
                if dctx.is_main and step + 1 > prior_attempted:
                    ckpt.write_ledger(out_dir, step + 1)
                started = max(started, step + 1)
                chosen, rng = sampler.sample(step)
                units, ids, lengths = batches.build(chosen, rng)
                mine = dctx.shard(units)

                loss_sum, n_rec_tot, halted = step_fn(step, mine, ids, lengths)
                if halted:  # e.g. filtered ULS's sparse-vector test failed: no update at this step
                    halted_at = step
                    save(step)
                    break
                losses.append(loss_sum / n_rec_tot if n_rec_tot > 0 else float("nan"))
                batch_sizes.append(int(len(chosen)))
                done = step + 1
                if done % int(spec.checkpoint_every) == 0 or done == int(spec.steps):
                    save(done)
                    if done < int(spec.steps):
                        kill_point("mid-training")     # a testing facility (components.core.faults)
                # steps only: a step's loss or batch size is a statistic of a private batch
                tick(1)
                if on_step is not None:
                    on_step(done)

    finally:
        step_fn.close()  # the per-record hooks come off the model, even on error
    if state is None and int(spec.steps) == 0:
        save(0)
    dctx.barrier()
    adapter_dir = model_dir = None
    if sharded:     # gathered by every rank, written by rank 0
        model_dir = str(out_dir / "model")
        sharding.save_model(model, model_dir, tokenizer, dctx.is_main)
    elif dctx.is_main:
        from peft import PeftModel

        if isinstance(model, PeftModel):
            adapter_dir = str(out_dir / "adapter")
            model.save_pretrained(adapter_dir)
        else:
            model_dir = str(out_dir / "model")
            model.save_pretrained(model_dir)
            if hasattr(tokenizer, "save_pretrained"):
                tokenizer.save_pretrained(model_dir)

    weights = weights_fingerprint(adapter_dir or model_dir) if dctx.is_main else None
    base_fp, tok_fp = base_fingerprints(base_dir) if (base_dir is not None and dctx.is_main) else (None, None)
    meta = data.schema.metadata or {}
    data_sha = meta[TRAIN_RECORDS_SHA256_KEY].decode() if TRAIN_RECORDS_SHA256_KEY in meta else None
    device_name, precision = _device_and_precision(device, params, spec)
    bs = np.array(batch_sizes, dtype=np.int64)
    result = TrainResult(
        steps_run=len(batch_sizes), mechanism=spec.mechanism, noise_multiplier=step_fn.sigma,  # 0 for nonprivate
        sampling_rate=float(spec.sampling_rate),  # secret: the plan's mean rate, checked against the data
        clip_norm=float(spec.clip_norm), expected_batch_size=expected, plan_expected_batch_size=spec.expected_batch_size,
        records_per_user=spec.records_per_user,
        batch_mean=float(bs.mean()) if bs.size else 0.0, batch_min=int(bs.min()) if bs.size else 0,
        batch_max=int(bs.max()) if bs.size else 0, empty_steps=int((bs == 0).sum()),
        n_units=int(len(rates)), n_records=tok.n_records, losses=losses,
        adapter_dir=adapter_dir, model_dir=model_dir, seconds=time.time() - t0, seed=int(spec.seed),
        private_seed_source=seed_source, resumed_from_step=resumed_from,
        steps_attempted=max(prior_attempted, len(batch_sizes), started, (halted_at + 1) if halted_at is not None else 0), world_size=dctx.world_size,
        trainable_params=int(sum(p.numel() for p in params)), sharding="fsdp" if sharded else "none",
        extra={"per_record": step_fn.per_unit.method if step_fn.per_unit else "plain-backward",
               "selection": spec.selection, "optimizer": spec.optimizer,
               "gradient_checkpointing": bool(spec.gradient_checkpointing),
               "normalisation": "sum of clipped unit gradients + N(0, σ²C²), divided by the expected batch size",
               "noise": "added once per step after the all-reduce (same per-step seeded stream on every rank)",
               **({"halted_at_step": halted_at} if mech.may_halt else {}),
               **step_fn.result_extra()},
        train_records_sha256=data_sha, weights=weights, base_model=base_fp, tokenizer=tok_fp,
        device=device_name, precision=precision, nonfinite_units=int(step_fn.nonfinite_units),
    )
    if dctx.is_main:
        d = result.to_dict()
        d["losses"] = [x if math.isfinite(x) else None for x in d["losses"]]
        (out_dir / "train_result.json").write_text(json.dumps(d, indent=2))
    return result
