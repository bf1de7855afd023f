"""A mechanism defined in this one file, registered, and run from policy to certificate (issue 12).

"one-record": user-level DP-SGD where every person contributes exactly one record, drawn by the
planner's keyed PRF from their own records. One person is then one record: the record-level
Poisson-subsampled Gaussian (sensitivity 1) is a user-level guarantee. Nothing in planning, the
engine, the certificate, the verifier, the audit ceiling or the ledger is edited to run it.
"""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from components.mechanisms import Bounded, PlanContext, register, unregister
from components.mechanisms.gaussian import SubsampledGaussian

ROOT = Path(__file__).resolve().parents[2]


class OneRecord(SubsampledGaussian):
    name = "one-record"
    description = "user-level DP-SGD on one keyed-random record per person"
    privacy_unit = "user"
    neighbouring = "add_remove_user"
    accounting_model = "record"      # one record per person: a person is one Gaussian of sensitivity 1
    contribution_kind = "one record per user (keyed draw)"

    def population_sensitivity(self, k: int):
        return "records", 1, "every person contributes exactly one record"

    def bound(self, ctx: PlanContext, train) -> Bounded:
        from components.draws.selection import select_records

        chosen = select_records(train, 1, "random", seed=ctx.seed, key=ctx.key)
        return Bounded(chosen=chosen, n_units=chosen.num_rows, records_per_user=1)


@pytest.fixture
def toy():
    mech = register(OneRecord)
    yield mech
    unregister(mech.name)


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_registered_toy_mechanism_runs_from_policy_to_certificate(toy, tmp_path):
    from components.audit.ceiling import certificate_pld
    from components.certificate import build_certificate, recompute_epsilon
    from components.certificate.verify import recheck_guarantee
    from components.ledger.release import release_costs
    from components.planning import make_plan
    from components.draws.annex import load_annex
    from components.draws.annex import commitment
    from components.draws.data import training_records
    from components.policy import load_policy
    from components.training import TrainSpec, train

    sys.path.insert(0, str(ROOT / "tests" / "planning"))
    from _planning_fixtures import make_snapshot

    tiny = _load("tiny_lm_training", ROOT / "tests" / "training" / "tiny_lm_training.py")
    demo = (ROOT / "policies" / "demo.yaml").read_text()
    text = (demo.replace("mechanism: uls", "mechanism: one-record")
            .replace(re.search(r"    steps: \d+", demo).group(0), "    steps: 6")
            .replace(re.search(r"expected_batch_size: \d+", demo).group(0), "expected_batch_size: 8"))
    text = re.sub(r"    lora:.*\n", "    lora: {r: 2, alpha: 4.0}\n", text)
    pol = tmp_path / "toy.yaml"
    pol.write_text(text)
    policy = load_policy(pol)                 # the policy model accepts the registered name
    snap = make_snapshot(60, seed=3)
    plan = make_plan(policy, snap, private_dir=tmp_path / "private").to_dict()
    assert (plan["mechanism"], plan["neighbouring"], plan["records_per_user"]) == \
        ("one-record", "add_remove_user", 1)
    annex = load_annex(tmp_path / "private", plan)
    data = training_records(plan, annex, snap.records)
    counts = data.group_by("user_id").aggregate([("text", "count")])["text_count"].to_pylist()
    assert set(counts) == {1}                 # the toy's bound, applied by planning

    spec = TrainSpec.from_plan(plan, private_seed=7, seq_len=32, micro_batch_size=8)
    result = train(spec, data, tiny.make_model(), tiny.make_tokenizer(), tmp_path / "run", progress=False).to_dict()
    result["train_records_commitment"] = commitment(annex["salt"], result["train_records_sha256"])
    cert = build_certificate(plan, result).to_dict()

    # independent computation: T steps of the Poisson-subsampled Gaussian, plus ε_N (basic composition)
    q, sigma, T = plan["sampling_rate"], plan["noise_multiplier"], cert["steps"]
    one = pld_lib.from_gaussian_mechanism(sigma, sensitivity=1.0, sampling_prob=q, value_discretization_interval=1e-4,
                                          pessimistic_estimate=True, use_connect_dots=True)
    eps_sgd = one.self_compose(T).get_epsilon_for_delta(plan["target"]["delta"])
    eps_n = plan["data"]["population"]["epsilon"]
    assert cert["mechanism"] == "one-record" and cert["privacy_unit"] == "user" and T == 6
    assert cert["epsilon"] == pytest.approx(eps_n + eps_sgd, rel=2e-2)
    assert cert["epsilon"] >= eps_n + eps_sgd * (1 - 1e-3)          # never below the finer computation
    assert cert["contribution_bound"]["kind"] == "one record per user (keyed draw)"
    raw = recompute_epsilon(cert)         # the certificate's is rounded up (core.canonical)
    assert raw <= cert["epsilon"] <= raw * (1 + 1e-5)
    assert recheck_guarantee(cert)[0] == pytest.approx(cert["epsilon"], rel=1e-6)
    assert certificate_pld(cert) is not None                        # the audit's ceiling has a PLD
    costs = release_costs(plan, {"alice": 1, "bob": 1})             # the ledger can charge it
    assert np.all(np.asarray(costs["alice"].rdp) > 0)


def test_a_policy_cannot_name_an_unregistered_mechanism(tmp_path):
    from components.core.errors import VeilError
    from components.policy import load_policy

    demo = (ROOT / "policies" / "demo.yaml").read_text()
    p = tmp_path / "p.yaml"
    p.write_text(demo.replace("mechanism: uls", "mechanism: one-record"))
    with pytest.raises(VeilError, match="spec.mechanism"):
        load_policy(p)


def test_no_code_outside_the_mechanisms_package_branches_on_a_mechanism_name():
    """The spine: planning, training, certificate, registry, audit, ledger and flows ask the registry.

    The accounting package keeps its own vocabulary of accounting *models* (record, uls, els,
    group-naive, group-tight: the DpEvent of one step), which mechanisms name; it is excluded."""
    names = ("uls", "els", "group", "record", "secret", "uls-filtered", "nonprivate", "pmixed")
    pattern = re.compile(r"""(==|!=|\bin)\s*\(?["'](%s)["']|["'](%s)["']\s*:\s*\(""" % ("|".join(names), "|".join(names)))
    offenders = []
    for top in ("components", "flows", "catalog"):
        for path in (ROOT / top).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(("components/mechanisms/", "components/accounting/")):
                continue
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line) and "mechanism" in line:
                    offenders.append(f"{rel}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
