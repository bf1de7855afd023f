"""A study's grid (YAML) → its points, and each point → the policy file it trains under.

    name: eps-sweep                      # optional, [a-z0-9_-]
    axes:                                # the cartesian product of these lists
      mechanism: [uls, els, group, record, non-private]
      epsilon: [1, 4, 8]                 # non-private points ignore ε (one point each)
      selection: [random]                # contribution.selection
      k: [4]                             # contribution.max_records_per_user (k for els/group, G for uls)
      lora: [true]                       # false: full fine-tuning
    points:                              # extra points, each a mapping of the same keys (optional)
      - {mechanism: uls, epsilon: 2, selection: random-chunk}
    training: {steps: 40, lora_r: 4}     # overrides of the policy's spec.training for every point
    eval: {max_records: 1000}            # evaluation records scored per point (a stable subset)
    private_selection:                   # read by --private-selection only (Papernot & Steinke 2022)
      distribution: truncated-negative-binomial   # or poisson (then mu)
      eta: 0
      gamma: 0.3
      score_clip: 8.0                    # B: a person's mean NLL is clipped to [0, B]
      score_noise: 2.0                   # σ_s: the score sum gets N(0, (σ_s·B)²)
      score_records_per_person: 8        # each evaluation person's records scored (picked from their own)

Every error is one line naming the file, the key and what is wrong (VeilError → exit 2).
"""
from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from components.core.errors import VeilError
from components.mechanisms import get as get_mechanism
from components.mechanisms import names as mechanism_names
from components.policy import load_policy

NON_PRIVATE = "non-private"   # a grid keyword: the ULS plan trained with the `nonprivate` mechanism
# Registered mechanisms a study can compare on perplexity against ε: an (ε, δ) guarantee of clipped
# DP-SGD (secret protection has γ per secret, filtered ULS a τ-scaled noise: not on one ε axis).
MECHANISMS = (*(n for n in mechanism_names(plannable=True)
                if get_mechanism(n).has_epsilon and get_mechanism(n).clipped), NON_PRIVATE)
SELECTIONS = ("random", "longest", "shortest", "ppl-high", "ppl-low", "random-chunk")
AXES = ("mechanism", "epsilon", "selection", "k", "lora")
TOP = ("name", "description", "axes", "points", "training", "eval", "private_selection")
TRAINING_KEYS = ("steps", "expected_batch_size", "clip_norm", "learning_rate", "seq_len", "micro_batch_size", "seed",
                 "lora_r")
NON_PRIVATE_PLAN = "uls"        # what a non-private point plans as (same people trained and evaluated)
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


@dataclass(frozen=True)
class Point:
    mechanism: str
    epsilon: float | None
    selection: str | None
    k: int | None
    lora: bool

    @property
    def private(self) -> bool:
        return self.mechanism != "non-private"

    @property
    def key(self) -> str:
        """A readable, file-safe id: uls-e8-random-k4-lora."""
        parts = [self.mechanism]
        if self.epsilon is not None:
            parts.append(f"e{self.epsilon:g}")
        if self.selection:
            parts.append(self.selection)
        if self.k is not None:
            parts.append(f"k{self.k}")
        parts.append("lora" if self.lora else "full")
        return "-".join(parts)

    def to_dict(self) -> dict:
        return {"key": self.key, "mechanism": self.mechanism, "epsilon": self.epsilon, "selection": self.selection,
                "k": self.k, "lora": self.lora}


@dataclass(frozen=True)
class Grid:
    name: str
    points: tuple[Point, ...]
    training: dict = field(default_factory=dict)
    eval_max_records: int = 1000
    private_selection: dict | None = None
    sha256: str = ""
    description: str = ""


def _bad(where: str, what: str) -> VeilError:
    return VeilError(f"{where}: {what}")


def _point(raw: dict, where: str) -> Point:
    if not isinstance(raw, dict):
        raise _bad(where, f"a point is a mapping of {', '.join(AXES)}, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(AXES))
    if unknown:
        raise _bad(where, f"unknown key {unknown[0]!r}; a point has {', '.join(AXES)}")
    mech = raw.get("mechanism", "uls")
    if mech == "nonprivate":
        mech = "non-private"
    if mech not in MECHANISMS:
        raise _bad(f"{where}.mechanism", f"{mech!r} is not one of {', '.join(MECHANISMS)}")
    eps = raw.get("epsilon")
    if mech == "non-private":
        eps = None
    else:
        if eps is None:
            raise _bad(f"{where}.epsilon", f"mechanism {mech} needs an epsilon")
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (eps > 0 and math.isfinite(eps)):
            raise _bad(f"{where}.epsilon", f"{eps!r} is not a finite number > 0")
        eps = float(eps)
    sel = raw.get("selection")
    if sel is not None and sel not in SELECTIONS:
        raise _bad(f"{where}.selection", f"{sel!r} is not one of {', '.join(SELECTIONS)}")
    if sel == "random-chunk" and mech != NON_PRIVATE and not get_mechanism(mech).per_user_clip:
        raise _bad(f"{where}.selection", f"random-chunk works with uls only, not {mech}")
    k = raw.get("k")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise _bad(f"{where}.k", f"{k!r} is not an integer ≥ 1")
    lora = raw.get("lora", True)
    if not isinstance(lora, bool):
        raise _bad(f"{where}.lora", f"{lora!r} is not true or false")
    return Point(mechanism=mech, epsilon=eps, selection=sel, k=k, lora=lora)


def parse_grid(path: str | Path) -> Grid:
    p = Path(path)
    if not p.is_file():
        raise VeilError(f"--grid: {p}: no such file")
    raw_bytes = p.read_bytes()
    try:
        doc = yaml.safe_load(raw_bytes)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f":{mark.line + 1}" if mark is not None else ""
        why = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise VeilError(f"{p}{at}: not valid YAML: {why}") from None
    if not isinstance(doc, dict):
        raise VeilError(f"{p}: a grid is a YAML mapping with 'axes' and/or 'points'")
    unknown = sorted(set(doc) - set(TOP))
    if unknown:
        raise VeilError(f"{p}: unknown key {unknown[0]!r}; a grid has {', '.join(TOP)}")
    name = str(doc.get("name") or p.stem.lower().replace(".", "-"))
    if not _NAME.match(name):
        raise VeilError(f"{p}: name: {name!r} must be lower-case letters, digits, '-' or '_'")
    points: list[Point] = []
    axes = doc.get("axes") or {}
    if not isinstance(axes, dict):
        raise VeilError(f"{p}: axes: a mapping of {', '.join(AXES)} to lists")
    for k, v in axes.items():
        if k not in AXES:
            raise VeilError(f"{p}: axes: unknown axis {k!r}; axes are {', '.join(AXES)}")
        if not isinstance(v, list) or not v:
            raise VeilError(f"{p}: axes.{k}: a non-empty list, got {v!r}")
    if axes:
        names = list(axes)
        for i, combo in enumerate(itertools.product(*(axes[n] for n in names))):
            points.append(_point(dict(zip(names, combo)), f"{p}: axes (combination {i + 1})"))
    extra = doc.get("points") or []
    if not isinstance(extra, list):
        raise VeilError(f"{p}: points: a list of mappings")
    for i, raw in enumerate(extra):
        points.append(_point(raw, f"{p}: points[{i}]"))
    seen, unique = set(), []
    for pt in points:  # non-private points collapse over ε
        if pt.key not in seen:
            seen.add(pt.key)
            unique.append(pt)
    if not unique:
        raise VeilError(f"{p}: the grid has no points (give axes or points)")
    training = doc.get("training") or {}
    if not isinstance(training, dict):
        raise VeilError(f"{p}: training: a mapping of {', '.join(TRAINING_KEYS)}")
    for k, v in training.items():
        if k not in TRAINING_KEYS:
            raise VeilError(f"{p}: training: unknown key {k!r}; allowed: {', '.join(TRAINING_KEYS)}")
        if isinstance(v, str):  # YAML reads 5e-3 (no dot) as a string
            try:
                v = training[k] = float(v)
            except ValueError:
                pass
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise VeilError(f"{p}: training.{k}: {v!r} is not a number > 0")
        if k in ("steps", "expected_batch_size", "seq_len", "micro_batch_size", "seed", "lora_r") and v != int(v):
            raise VeilError(f"{p}: training.{k}: {v!r} is not an integer")
    ev = doc.get("eval") or {}
    if not isinstance(ev, dict) or set(ev) - {"max_records"}:
        raise VeilError(f"{p}: eval: a mapping with max_records only")
    max_records = ev.get("max_records", 1000)
    if isinstance(max_records, bool) or not isinstance(max_records, int) or max_records < 1:
        raise VeilError(f"{p}: eval.max_records: {max_records!r} is not an integer ≥ 1")
    ps = doc.get("private_selection")
    if ps is not None:
        ps = _private_selection(ps, p)
    return Grid(name=name, points=tuple(unique), training=dict(training), eval_max_records=max_records,
                private_selection=ps, sha256=hashlib.sha256(raw_bytes).hexdigest(),
                description=str(doc.get("description") or ""))


PS_KEYS = ("distribution", "eta", "gamma", "mu", "score_clip", "score_noise", "score_records_per_person")


def _private_selection(ps, p: Path) -> dict:
    from components.accounting.private_selection import expected_trials  # startup

    if not isinstance(ps, dict):
        raise VeilError(f"{p}: private_selection: a mapping of {', '.join(PS_KEYS)}")
    unknown = sorted(set(ps) - set(PS_KEYS))
    if unknown:
        raise VeilError(f"{p}: private_selection: unknown key {unknown[0]!r}; allowed: {', '.join(PS_KEYS)}")
    out = {"distribution": ps.get("distribution", "truncated-negative-binomial"), "eta": ps.get("eta", 0.0),
           "gamma": ps.get("gamma", 0.3), "mu": ps.get("mu"), "score_clip": ps.get("score_clip", 8.0),
           "score_noise": ps.get("score_noise", 2.0), "score_records_per_person": ps.get("score_records_per_person", 8)}
    per = out["score_records_per_person"]
    if isinstance(per, bool) or not isinstance(per, int) or per < 1:
        raise VeilError(f"{p}: private_selection.score_records_per_person: {per!r} is not an integer ≥ 1")
    for k in ("eta", "gamma", "mu", "score_clip", "score_noise"):
        v = out[k]
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            raise VeilError(f"{p}: private_selection.{k}: {v!r} is not a number")
    for k in ("score_clip", "score_noise"):
        if not out[k] > 0:
            raise VeilError(f"{p}: private_selection.{k}: must be > 0, got {out[k]!r}")
    try:
        expected_trials(out["distribution"], eta=out["eta"], gamma=out["gamma"], mu=out["mu"])
    except VeilError as e:
        raise VeilError(f"{p}: {e}") from None
    return out


def point_policy(base_policy: str | Path, point: Point, training: dict, out_path: Path) -> Path:
    """Write the policy POINT trains under: the base policy with the point's mechanism, ε, selection,
    k and LoRA/full and the grid's training overrides. A non-private point plans as ULS at the base
    policy's ε (the same people are trained and evaluated); its training then drops noise and clipping."""
    src = Path(base_policy)
    doc = yaml.safe_load(src.read_bytes())
    spec = copy.deepcopy(doc.get("spec") or {})
    mech = point.mechanism
    spec["mechanism"] = NON_PRIVATE_PLAN if mech == NON_PRIVATE else mech
    spec["privacy_unit"] = get_mechanism(spec["mechanism"]).privacy_unit
    if point.epsilon is not None:
        tgt = dict(spec.get("target") or {})
        tgt["epsilon"] = float(point.epsilon)
        tgt.setdefault("delta", 1e-5)
        spec["target"] = tgt
        life = spec.get("lifetime_budget")
        if life and float(life.get("epsilon", 0)) < float(point.epsilon):
            spec.pop("lifetime_budget")  # a study point is not a release: no lifetime budget applies
    contrib = dict(spec.get("contribution") or {})
    if point.selection is not None:
        contrib["selection"] = point.selection
    if point.k is not None:
        contrib["max_records_per_user"] = int(point.k)
    if contrib.get("selection") == "random-chunk" and not get_mechanism(spec["mechanism"]).per_user_clip:
        contrib["selection"] = "random"
    spec["contribution"] = contrib
    tr = dict(spec.get("training") or {})
    over = dict(training)
    lora_r = over.pop("lora_r", None)
    for k in ("steps", "expected_batch_size", "seq_len", "micro_batch_size", "seed"):
        if k in over:
            over[k] = int(over[k])
    tr.update(over)
    if not point.lora:
        tr["lora"] = None
    else:
        lora = dict(tr.get("lora") or {"r": 8, "alpha": 16})
        if lora_r is not None:
            # α/r fixed: the update's scale does not change with the rank
            scale = float(lora.get("alpha", 16)) / float(lora.get("r", 8))
            lora["r"], lora["alpha"] = int(lora_r), float(scale * int(lora_r))
        tr["lora"] = lora
    spec["training"] = tr
    doc["spec"] = spec
    meta = dict(doc.get("metadata") or {})
    meta["name"] = (str(meta.get("name", "study")) + "-" + point.key)[:63].rstrip("-_.").lower()
    meta["name"] = re.sub(r"[^a-z0-9_-]", "-", meta["name"])
    doc["metadata"] = meta
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        load_policy(out_path)
    except VeilError as e:
        raise VeilError(f"grid point {point.key}: {e}") from None
    return out_path


def grid_summary(grid: Grid) -> str:
    return json.dumps([p.to_dict() for p in grid.points])
