"""Every ensemble member's LoRA in one batched forward: row k of the batch goes through adapter idx[k].

peft's mixed-batch path (`adapter_names=`) loops over the adapters inside every LoRA layer and re-installs
forward hooks on every call; measured on the demo-sized model it made a PMixED token 5.7× a single-adapter
token. Here each adapted layer keeps the adapters' A and B stacked, (R, r, d_in) and (R, d_out, r), with
row 0 all zeros (the public model), and adds scaling · B_k A_k x for row k with two `bmm`s — the same
arithmetic as peft's LoRA (lora_B(lora_A(x)) · α/r; tests check the outputs agree with peft per adapter).
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from components.core.errors import VeilError


def _module(owner_cls):
    import torch

    class StackedLoRA(torch.nn.Module):
        def __init__(self, base, A, B, scaling, owner):
            super().__init__()
            self.base = base
            self.scaling = float(scaling)
            self.owner = [owner]  # a list: not registered as a submodule
            self.register_buffer("At", A.transpose(1, 2).contiguous(), persistent=False)
            self.register_buffer("Bt", B.transpose(1, 2).contiguous(), persistent=False)

        def forward(self, x):
            y = self.base(x)
            idx = self.owner[0].rows
            a, b = self.At.index_select(0, idx), self.Bt.index_select(0, idx)
            return y + torch.bmm(torch.bmm(x.to(a.dtype), a), b).to(y.dtype) * self.scaling

    return StackedLoRA


class BatchedLoRAModel:
    """base model + N adapters; `forward(ids, cache, rows)` with rows[k] = 0 (public) or 1 + member."""

    def __init__(self, base, adapter_dirs: Sequence[str | Path]):
        import torch
        from safetensors.torch import load_file

        cfgs = [json.loads((Path(d) / "adapter_config.json").read_text()) for d in adapter_dirs]
        keyset = ("r", "lora_alpha", "use_rslora", "target_modules", "use_dora", "bias", "rank_pattern", "alpha_pattern")
        first = {k: cfgs[0].get(k) for k in keyset}
        for c in cfgs[1:]:
            if {k: c.get(k) for k in keyset} != first:
                raise VeilError("pmixed: the shards' adapters have different LoRA configurations")
        if first["use_dora"] or first["use_rslora"] or first["rank_pattern"] or first["alpha_pattern"] \
                or first["bias"] != "none":
            raise VeilError("pmixed: batched serving supports plain LoRA adapters only (no DoRA/rsLoRA/patterns/bias)")
        r, scaling = int(first["r"]), float(first["lora_alpha"]) / int(first["r"])
        weights = [load_file(str(Path(d) / "adapter_model.safetensors")) for d in adapter_dirs]
        prefix = "base_model.model."
        names = sorted({k[len(prefix):-len(".lora_A.weight")] for k in weights[0] if k.endswith(".lora_A.weight")})
        if not names:
            raise VeilError("pmixed: an adapter has no LoRA weights")
        self.model = base
        self.rows = torch.zeros(1, dtype=torch.long)
        cls = _module(None)
        dev = next(base.parameters()).device
        dtype = next(base.parameters()).dtype
        for name in names:
            A = torch.stack([torch.zeros_like(weights[0][f"{prefix}{name}.lora_A.weight"])] +
                            [w[f"{prefix}{name}.lora_A.weight"] for w in weights]).to(dev, dtype)
            B = torch.stack([torch.zeros_like(weights[0][f"{prefix}{name}.lora_B.weight"])] +
                            [w[f"{prefix}{name}.lora_B.weight"] for w in weights]).to(dev, dtype)
            parent_name, _, leaf = name.rpartition(".")
            parent = base.get_submodule(parent_name)
            setattr(parent, leaf, cls(getattr(parent, leaf), A, B, scaling, self))
        self.r = r

    def forward(self, ids, cache, rows: Sequence[int]):
        import torch

        self.rows = torch.tensor(list(rows), dtype=torch.long, device=ids.device)
        with torch.inference_mode():
            return self.model(input_ids=ids, past_key_values=cache, use_cache=True)
