"""The same plan on every machine (issue 28): a plan's identity may not depend on the last bits of the
numerics behind it (dp-accounting's FFTs, numpy's SIMD reductions, libm), which differ between CPUs.

Another CPU is simulated by perturbing the calibration's last bits: every ε the accountant computes
(and every per-step KL of the secret accountant) gets a relative error of ~1e-12 with a sign that
varies from call to call, and the σ a bisection returns is moved by a factor 1 ± 1e-12. The plans
must come out byte for byte the same; the published σ is never below the computed one, the plan's
ε never below the ε recomputed at the published σ, and never above the target.
"""
from __future__ import annotations

import importlib
import itertools
import json
import re
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from components.accounting import epsilon as account
from components.core import canonical
from components.core.canonical import ceil_sig, epsilon_up, round_sig, sigma_up, sum_up
from components.planning import make_plan
from components.policy import load_policy

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "planning"))
from _planning_fixtures import make_snapshot  # noqa: E402

WHEN = "2026-01-01T00:00:00+00:00"
DEMO = (ROOT / "policies" / "demo.yaml").read_text()


def _policy(tmp: Path, mech: str):
    if mech == "secret":
        text = re.sub(r"expected_batch_size: \d+", "expected_batch_size: 16",
                      re.sub(r"    steps: \d+", "    steps: 20", (ROOT / "policies" / "code-team-secrets.yaml").read_text()))
    elif mech == "uls-filtered":
        text = (ROOT / "policies" / "filtered-research.yaml").read_text()
    else:
        text = re.sub(r"    steps: \d+", "    steps: 20", DEMO)
        if mech == "els":
            text = text.replace("mechanism: uls", "mechanism: els")
            text = re.sub(r"expected_batch_size: \d+", "expected_batch_size: 16", text)
    p = tmp / "policies" / f"{mech}.yaml"      # the same path for every variant: the plan records it
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return load_policy(p)


def _perturb(monkeypatch, sign: int) -> None:
    """Last-bit noise in every ε and KL the accountants compute, and in every σ a bisection returns."""
    acc = importlib.import_module("components.accounting.accountant")
    sec = importlib.import_module("components.accounting.secrets")
    flips = itertools.cycle([1, -1, 1, 1, -1])
    real_eps, real_bisect, real_kl, real_sigma_for = acc._epsilon_at, acc.bisect_sigma, sec.mixture_kl, sec._sigma_for

    def eps_at(*a, **k):
        e = real_eps(*a, **k)
        return e * (1 + sign * next(flips) * 1e-12)

    def bisect(*a, **k):
        lo, hi = real_bisect(*a, **k)
        return lo, hi * (1 + sign * 1e-12)

    def kl(*a, **k):
        r, s = real_kl(*a, **k)
        return r * (1 + sign * next(flips) * 1e-13), s * (1 - sign * 1e-13)

    def sigma_for(*a, **k):
        return real_sigma_for(*a, **k) * (1 + sign * 1e-12)

    monkeypatch.setattr(acc, "_epsilon_at", eps_at)
    monkeypatch.setattr(acc, "bisect_sigma", bisect)
    monkeypatch.setattr(sec, "mixture_kl", kl)
    monkeypatch.setattr(sec, "_sigma_for", sigma_for)


def _plan_bytes(tmp: Path, mech: str, tag: str) -> tuple[bytes, dict]:
    snap = make_snapshot(1150, seed=2) if mech == "uls-filtered" else make_snapshot(60, seed=1, secrets_per_record=2)
    plan = make_plan(_policy(tmp, mech), snap, private_dir=tmp / f"private-{tag}", created_at=WHEN).to_dict()
    return json.dumps(plan, sort_keys=True).encode(), plan


@pytest.mark.parametrize("mech", ["uls", "els", "secret", "uls-filtered"])
def test_last_bit_differences_in_the_numerics_do_not_change_the_plan(tmp_path, monkeypatch, mech):
    seen: list[tuple[float, float]] = []
    real_up = canonical.sigma_up
    acc = importlib.import_module("components.accounting.accountant")
    sec = importlib.import_module("components.accounting.secrets")

    def spy(s):      # every σ that is published passes here: record (computed, published)
        out = real_up(s)
        seen.append((s, out))
        return out

    monkeypatch.setattr(acc, "sigma_up", spy)
    monkeypatch.setattr(sec, "sigma_up", spy)        # the secret calibration rounds σ there
    monkeypatch.setattr(canonical, "sigma_up", spy)
    base, plan = _plan_bytes(tmp_path, mech, "base")
    for sign in (1, -1):
        with monkeypatch.context() as m:
            _perturb(m, sign)
            other, _ = _plan_bytes(tmp_path, mech, f"perturbed{sign:+d}")
        assert other == base, f"{mech}: a 1e-12 change in the numerics changed the plan"

    # the published σ is the computed one rounded UP (more noise), and what the plan trains with
    assert seen and all(out >= s for s, out in seen)
    sigma = plan["noise_multiplier"]
    assert sigma == sigma_up(sigma) and len(Decimal(repr(sigma)).as_tuple().digits) <= canonical.SIGMA_DIGITS
    acc_section = plan["accounting"]
    if mech == "secret":
        for cls, c in acc_section["by_class"].items():
            assert c["max_gamma"] <= plan["target"]["secrets"][cls]["gamma"]
        return
    # the plan's ε is never below the ε recomputed at the published σ, and never above the target
    part = "epsilon_gaussian" if mech == "uls-filtered" else "epsilon_dp_sgd"
    if mech == "uls-filtered":
        kw = dict(sampling_rate=1.0, delta=plan["target"]["delta"] / 2)
        model = "record"
    else:
        kw = dict(sampling_rate=plan["sampling_rate"], delta=plan["target"]["delta"])
        model = {"uls": "uls", "els": "els"}[mech]
    k = plan.get("records_per_user") if mech == "els" else 1
    recomputed = account(model, noise_multiplier=sigma, steps=plan["steps"], k=k, **kw).epsilon
    assert recomputed <= acc_section[part] <= recomputed * (1 + 1e-5)
    assert acc_section[part] == epsilon_up(acc_section[part])
    assert acc_section["epsilon"] <= plan["target"]["epsilon"]


def test_rounding_is_exact_and_never_below():
    assert ceil_sig(1.4612873274295506, 6) == 1.46129
    assert ceil_sig(1.4612873274278622, 6) == 1.46129          # the two CPUs of issue 28
    assert ceil_sig(2.0, 6) == 2.0 and ceil_sig(1.46129, 6) == 1.46129   # already on the grid: unchanged
    assert ceil_sig(0.1, 1) == 0.1                                # 0.1's double is just above 1/10
    assert ceil_sig(0.30000000000000004, 6) == 0.300001           # above 0.3: up to the next digit
    assert round_sig(35.59004635110104) == 35.59004635
    assert epsilon_up(float("inf")) == float("inf")
    # the float sum of two floats may round below their exact sum; the published sum may not
    tiny = 2.0 ** -60
    assert 1.0 + tiny == 1.0 and sum_up(1.0, tiny) > 1.0
    assert Decimal(sum_up(0.16, 7.83983)) >= Decimal(0.16) + Decimal(7.83983)
    for x in (1e-300, 3.3e-11, 0.7, 7.999999999999999, 12345.678901234):
        for d in (1, 6, 10, 17):
            assert Decimal(ceil_sig(x, d)) >= Decimal(x)
