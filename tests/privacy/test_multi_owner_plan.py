"""Multi-owner records (`people.ownership: all-participants`) from policy to plan, certificate and
ledger: every owner — recipients included — is bounded, kept out when reserved, certified under the
fixed-graph replace relation and charged (docs/privacy/multi-owner.md).

Attacks this file pins:
* a recipient who never writes was charged nothing although mails about them were trained;
* a mail to an evaluation or held-out person was trained (its recipient was not out);
* changing the content of one person's mails moved other people's selected records;
* a forged δ (or group δ) on a multi-owner certificate was accepted."""
from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import dp_accounting
import numpy as np
import pyarrow as pa
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import RdpAccountant

from components.core.errors import VeilError
from components.core.hashing import sha256_bytes
from components.renyi import rdp as _rdp
from components.ledger.release import release_costs
from components.mechanisms import get
from components.planning import make_plan
from components.draws.annex import load_annex, plan_key
from components.draws.audit_split import held_out
from components.draws.data import train_rows
from components.draws.eval_split import is_evaluation_person
from components.policy import load_policy

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "planning"))
from _planning_fixtures import FakeSnapshot  # noqa: E402

DEMO = (ROOT / "policies" / "demo.yaml").read_text()
K = 2


def _policy(tmp_path: Path, *, mechanism: str = "els", extra: str = "") -> object:
    text = (DEMO.replace("mechanism: uls", f"mechanism: {mechanism}")
            .replace(re.search(r"    steps: \d+", DEMO).group(0), "    steps: 30")
            .replace(re.search(r"expected_batch_size: \d+", DEMO).group(0), "expected_batch_size: 8"))
    text = text.rstrip("\n") + "\n  people:\n    ownership: all-participants\n" + extra
    p = tmp_path / "owners.yaml"
    p.write_text(text)
    return load_policy(p)


def _mail_snapshot(n_people: int = 60, seed: int = 0, *, change: str | None = None) -> FakeSnapshot:
    """Mails among n people (writer + 1–3 recipients), and 6 people who only ever receive. `change`:
    rewrite the text of every mail that person is on (sender or recipient) — a fixed-graph neighbour."""
    rng = np.random.default_rng(seed)
    people = [f"p{i:03d}@corp.example" for i in range(n_people)]
    readers = [f"reader{i}@corp.example" for i in range(6)]
    rows = []
    for i in range(n_people * 4):
        w = people[int(rng.integers(n_people))]
        to = sorted({x for x in rng.choice(people + readers, size=int(rng.integers(1, 4))) if x != w})
        text = f"mail {i} from {w} about " + " ".join(rng.choice(["budget", "launch", "review", "deploy"], size=5))
        if change is not None and change in (w, *to):
            text = "REWRITTEN " + text[::-1]
        rows.append({"record_id": sha256_bytes(f"{w}\x1f{text}".encode()), "user_id": w, "text": text,
                     "owners": [w, *to]})
    records = pa.Table.from_pylist(rows, schema=pa.schema([("record_id", pa.string()), ("user_id", pa.string()),
                                                           ("text", pa.string()), ("owners", pa.list_(pa.string()))]))
    spans = pa.table({"record_id": pa.array([], pa.string()), "secret_id": pa.array([], pa.string()),
                      "secret_class": pa.array([], pa.string())})
    digest = sha256_bytes("".join(r["record_id"] for r in rows).encode())
    return FakeSnapshot(f"snap-{digest[:8]}", digest, records, spans)


def _plan(tmp_path, snap, private=None):
    private = private or tmp_path / "private"
    plan = make_plan(_policy(tmp_path), snap, private_dir=private, created_at="2026-01-01T00:00:00+00:00").to_dict()
    return plan, train_rows(load_annex(private, plan)), private


def test_every_owner_is_bounded_and_reserved_owners_are_never_trained(tmp_path):
    snap = _mail_snapshot()
    plan, rows, private = _plan(tmp_path, snap)
    assert plan["mechanism"] == "els-owners" and plan["neighbouring"] == "replace_owned_records_fixed_graph"
    assert plan["ownership"]["k"] == K and plan["ownership"]["graph_protected"] is False
    assert plan["data"]["population"]["mechanism"] == "none" and plan["data"]["population"]["epsilon"] == 0.0
    assert "owners" in rows.column_names
    per = {}
    for o in rows["owners"].to_pylist():
        assert len(set(o)) == len(o)
        for p in o:
            per[p] = per.get(p, 0) + 1
    assert max(per.values()) <= K
    assert any(p.startswith("reader") for p in per), "recipients who never write own trained records"
    key, pol = plan_key(private), _policy(tmp_path)
    seed = pol.spec.training.seed
    for o in rows["owners"].to_pylist():
        for p in o:
            assert not held_out(key, seed, p, pol.spec.audit.holdout_users)
            assert not is_evaluation_person(key, seed, p, pol.spec.evaluation.fraction)
    # q is B over the exact (public under the relation) count of selected records
    assert plan["sampling_rate"] == pytest.approx(8 / rows.num_rows)


def _independent_els_epsilon(q, sigma, steps, k, delta):
    """ELS's group-of-k ε by dp_accounting directly: Binomial(k, q) mixture of Gaussians."""
    probs = [math.comb(k, j) * q ** j * (1 - q) ** (k - j) for j in range(k + 1)]
    ev = dp_event.MixtureOfGaussiansDpEvent(sigma, list(range(k + 1)), probs)
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(ev, steps)
    return acc.get_epsilon(delta)


def test_guarantee_is_twice_the_group_epsilon_and_within_target(tmp_path):
    plan, _, _ = _plan(tmp_path, _mail_snapshot())
    acc = plan["accounting"]
    eps_k, delta_k = acc["epsilon_group"], acc["delta_group"]
    assert delta_k == pytest.approx(1e-5 / (1 + math.exp(4.0)))
    ref = _independent_els_epsilon(plan["sampling_rate"], plan["noise_multiplier"], plan["steps"], K, delta_k)
    assert eps_k == pytest.approx(ref, rel=0.02) and eps_k >= ref * (1 - 0.02)
    assert acc["epsilon"] == pytest.approx(2 * eps_k) and acc["epsilon"] <= 8.0 + 1e-9
    assert acc["delta"] == pytest.approx((1 + math.exp(eps_k)) * delta_k) and acc["delta"] <= 1e-5 * (1 + 1e-9)


def test_fixed_graph_neighbours_move_only_that_persons_records(tmp_path):
    """Changing the content of every mail u is on (sent or received) keeps the graph; the trained
    records that differ are u's, at most k on each side, and q, σ and N are the same."""
    private = tmp_path / "private"
    a, ra, _ = _plan(tmp_path, _mail_snapshot(), private)
    u = "p007@corp.example"
    b, rb, _ = _plan(tmp_path, _mail_snapshot(change=u), private)
    for f in ("sampling_rate", "noise_multiplier", "steps", "accounting"):
        assert a[f] == b[f]
    assert a["data"]["population"] == b["data"]["population"]
    sa = {(r, tuple(o)) for r, o in zip(ra["record_id"].to_pylist(), ra["owners"].to_pylist())}
    sb = {(r, tuple(o)) for r, o in zip(rb["record_id"].to_pylist(), rb["owners"].to_pylist())}
    assert all(u in o for _, o in sa - sb) and all(u in o for _, o in sb - sa)
    assert len(sa - sb) <= K and len(sb - sa) <= K


def test_recipients_are_charged_under_the_replace_relation(tmp_path):
    plan, rows, _ = _plan(tmp_path, _mail_snapshot())
    plan = {**plan, "sha256": "x"}
    costs = release_costs(plan, rows)
    readers = [p for p in costs if p.startswith("reader")]
    assert readers, "a recipient who never writes must be charged"
    q, sigma, steps = plan["sampling_rate"], plan["noise_multiplier"], plan["steps"]
    orders = np.asarray(_rdp.ORDERS)
    # one trained record each: there the ledger's mixture bound and the shift bound coincide, so the
    # shift bound below is the exact reference (with more rows the mixture is tighter, also valid)
    single = [p for p in readers if costs[p].rows == 1]
    assert single
    for p in single[:2]:
        n = costs[p].rows
        # independent: weak triangle with dp_accounting's RDP of PoissonSampled(q', Gaussian(σ/n))
        q_any = 1 - (1 - q) ** n

        def rdp(at):
            acc = RdpAccountant(list(at))
            acc.compose(dp_event.PoissonSampledDpEvent(q_any, dp_event.GaussianDpEvent(sigma / n)), steps)
            return np.asarray(acc._rdp)

        want = (orders - 0.5) / (orders - 1) * rdp(2 * orders) + rdp(2 * orders - 1)
        np.testing.assert_allclose(costs[p].rdp, want, rtol=1e-9)
        assert np.all(costs[p].rdp >= _rdp.rows_rdp([q] * n, sigma, steps))    # replace costs more than add/remove


def test_add_remove_spend_read_under_the_replace_relation_is_an_upper_bound():
    orders = np.asarray(_rdp.ORDERS)
    q, sigma, steps = 0.05, 1.2, 200
    spend = _rdp.rows_rdp([q, q], sigma, steps)
    conv = _rdp.replace_of_add_remove(spend)
    exact = _rdp.replace_rows_rdp([q, q], sigma, steps)
    usable = np.isfinite(conv)
    assert usable.sum() >= 10 and np.all(~usable[orders * 2 > orders.max()])
    assert np.all(conv[usable] >= exact[usable] * (1 - 1e-12))
    assert np.all(_rdp.replace_of_add_remove(np.zeros(len(orders))) == 0)


def test_ledger_reads_a_person_under_replace_once_on_a_multi_owner_release(settings, tmp_path):
    from components.ledger import Ledger, reserve_release

    plan, rows, _ = _plan(tmp_path, _mail_snapshot())
    big = {"epsilon": 1000.0, "delta": 1e-4}             # a filter nobody hits: every charge lands
    plan = {**plan, "lifetime_budget": big}
    led = Ledger.open(settings)
    try:
        uls = {"mechanism": "uls", "privacy_unit": "user", "sampling_rate": 0.01, "noise_multiplier": 1.0,
               "steps": 100, "sha256": "a" * 64, "lifetime_budget": big}
        writer = rows["owners"].to_pylist()[0][0]
        reserve_release(settings, uls, {writer: 1}, ledger=led)
        before = led.spend([writer])[writer]
        np.testing.assert_allclose(before, _rdp.sampled_gaussian_rdp(0.01, 1.0, 100))
        reserve_release(settings, {**plan, "sha256": "b" * 64}, rows, ledger=led)
        after = led.spend([writer])[writer]
        mine = release_costs(plan, rows)[writer].rdp
        want = mine + _rdp.replace_of_add_remove(before)
        np.testing.assert_allclose(after, want)
        row = [r for r in led.person_rows() if r["person_key"] == led.person_key(writer)][0]
        assert row["epsilon"] == pytest.approx(float(_rdp.epsilon_of_spend(want, 1e-4, led.orders, led.conversion,
                                                                           led.order_weights)))
    finally:
        led.dispose()


def test_certificate_verifies_and_forgeries_are_refused(tmp_path):
    from components.certificate import build_certificate
    from components.certificate.verify import recheck_guarantee

    import importlib.util
    spec = importlib.util.spec_from_file_location("bound_run", ROOT / "tests" / "bound_run.py")
    bound_run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bound_run)

    plan, _, _ = _plan(tmp_path, _mail_snapshot())
    result = {"steps_run": plan["steps"], "steps_attempted": plan["steps"], "mechanism": plan["mechanism"],
              "noise_multiplier": plan["noise_multiplier"], "sampling_rate": plan["sampling_rate"],
              "clip_norm": plan["clip_norm"], "private_seed_source": "os_entropy",
              **bound_run.binding(plan, weights_dir=tmp_path / "w")}
    cert = build_certificate(plan, result, version="test").to_dict()
    assert cert["neighbouring"] == "replace_owned_records_fixed_graph" and cert["within_target"]
    # the plan's ε_k is the calibration's rounded up to 6 digits (components.core.canonical): ≤ 1e-5 above
    assert cert["epsilon"] == pytest.approx(plan["accounting"]["epsilon"], rel=2e-5)
    assert cert["epsilon"] <= plan["accounting"]["epsilon"]
    assert any("attribution" in c for c in cert["caveats"])
    assert get("els-owners").user_pld(cert) is None
    eps, _ = recheck_guarantee(cert)
    assert eps == pytest.approx(cert["epsilon"])
    forged = json.loads(json.dumps(cert))
    forged["delta"] = cert["delta"] / 10
    with pytest.raises(VeilError, match="δ"):
        recheck_guarantee(forged)
    forged = json.loads(json.dumps(cert))
    forged["group_guarantee"]["delta_group"] *= 10          # a looser δ_k gives a smaller ε_k
    with pytest.raises(VeilError):
        recheck_guarantee(forged)


def test_policy_refuses_all_participants_without_an_owners_variant(tmp_path):
    with pytest.raises(VeilError, match="all-participants"):
        _policy(tmp_path, mechanism="uls")
    with pytest.raises(VeilError, match="all-participants"):
        _policy(tmp_path, mechanism="group")



def test_auto_takes_the_multi_owner_variant_from_the_policy_alone(tmp_path):
    pol = _policy(tmp_path, mechanism="auto")
    plan = make_plan(pol, _mail_snapshot(), private_dir=tmp_path / "private").to_dict()
    assert plan["mechanism"] == "els-owners" and "all-participants" in plan["decision"]["reason"]


def test_canaries_keep_their_own_split_under_multi_owner(tmp_path):
    """A trained canary (the canary split's keyed half) keeps its records: the owners' draws apply to
    recipients only, never overriding the audit split's decision about a record's writer."""
    pol = _policy(tmp_path)
    text = Path(pol.path).read_text().replace("    canaries:\n      users: 0\n",
                                              "    canaries:\n      users: 8\n      records_per_user: 6\n")
    Path(pol.path).write_text(text)
    pol = load_policy(pol.path)
    private = tmp_path / "private"
    plan = make_plan(pol, _mail_snapshot(), private_dir=private).to_dict()
    annex = load_annex(private, plan)
    trained = set(annex["canary_users"]) - set(annex["held_out_users"])
    assert len(trained) == 4
    rows = train_rows(annex)
    assert trained <= set(rows["user_id"].to_pylist())


def test_the_unit_is_owner_and_the_certificate_says_what_is_not_protected(tmp_path):
    """Issue 22, case 6: a multi-owner certificate said `privacy_unit: user`, which reads as add/remove
    user-level DP, though a person's presence and the attribution graph are not protected. The unit is
    now 'owner'; the certificate, its one-line description and `veil verify`'s notes say what is and
    is not protected; a certificate edited back to 'user' is refused."""
    from components.certificate import build_certificate
    from components.certificate.verify import recheck_guarantee

    import importlib.util
    spec = importlib.util.spec_from_file_location("bound_run", ROOT / "tests" / "bound_run.py")
    bound_run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bound_run)

    plan, _, _ = _plan(tmp_path, _mail_snapshot())
    assert plan["privacy_unit"] == "owner"
    from components.certificate.verify import _coverage    # what `veil verify` notes (added with the fix)
    result = {"steps_run": plan["steps"], "steps_attempted": plan["steps"], "mechanism": plan["mechanism"],
              "noise_multiplier": plan["noise_multiplier"], "sampling_rate": plan["sampling_rate"],
              "clip_norm": plan["clip_norm"], "private_seed_source": "os_entropy",
              **bound_run.binding(plan, weights_dir=tmp_path / "w")}
    cert = build_certificate(plan, result, version="test").to_dict()
    assert cert["privacy_unit"] == "owner"
    for said in (cert["coverage"], _coverage(cert), get("els-owners").describe(cert)):
        assert "presence" in said and "graph" in said
    assert "user-level" not in get("els-owners").describe(cert)
    assert "not add/remove" in cert["coverage"]
    forged = json.loads(json.dumps(cert))
    forged["privacy_unit"] = "user"
    with pytest.raises(VeilError, match="privacy unit"):
        recheck_guarantee(forged)

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_audit_members_are_people_the_model_trained_on(tmp_path, seed):
    """Issue 22, case 7: the audit split labels a person a member when they were not held out, but the
    per-owner bound runs after it and can leave such a person with no trained record (a co-owner
    reserved, or k reached through other mails): 1 of 38 multi-owner "members" had none, so the audit
    scored a non-member as a member. A member now owns at least one trained record; a non-member owns
    none."""
    import pyarrow.parquet as pq

    from components.audit.inputs import audit_reservations

    plan, rows, private = _plan(tmp_path, _mail_snapshot(seed=seed))
    res = audit_reservations(plan, load_annex(private, plan))
    att = pq.read_table(res.attacker_records_file)
    trained = {p for o in rows["owners"].to_pylist() for p in o} | set(rows["user_id"].to_pylist())
    labels = dict(zip(att["user_id"].to_pylist(), att["member"].to_pylist()))
    members = {u for u, m in labels.items() if m}
    assert members and members <= trained, sorted(members - trained)
    assert not {u for u, m in labels.items() if not m} & trained


def test_evaluation_scores_only_what_a_person_owns_alone(tmp_path):
    """The DP evaluation release (issue 22, case 4) sums per-person clipped means, calibrated for one
    person moving their own mean. With multi-owner mails, a mail u wrote to v is v's data too: scored
    as u's, changing v's content moved u's figures as well (one person, many people's means). The
    evaluation keeps only records a person owns alone, so a fixed-graph neighbour (v's content
    rewritten) changes v's evaluation texts and nobody else's."""
    from components.draws.data import evaluation_records

    snap = _mail_snapshot()
    (tmp_path / "d").mkdir()
    (tmp_path / "d2").mkdir()
    plan, _, private = _plan(tmp_path / "d", snap)
    annex = load_annex(private, plan)
    assert annex.get("eval_users"), "the fixture must reserve evaluation people"

    def texts(p, a, s, single):
        t = evaluation_records(p, a, s.records, single_owner=single)
        out = {}
        for u, x in zip(t["user_id"].to_pylist(), t["text"].to_pylist()):
            out.setdefault(u, set()).add(x)
        return out

    # a recipient of an evaluation person's mail: the person whose content used to move someone else's
    ev = set(annex["eval_users"])
    v = next(o for w, os_ in zip(snap.records["user_id"].to_pylist(), snap.records["owners"].to_pylist())
             if w in ev for o in os_[1:])
    changed = _mail_snapshot(change=v)
    plan2, _, private2 = _plan(tmp_path / "d2", changed)
    annex2 = load_annex(private2, plan2)
    assert set(annex2["eval_users"]) == ev
    before, after = texts(plan, annex, snap, True), texts(plan2, annex2, changed, True)
    assert {u for u in set(before) | set(after) if before.get(u) != after.get(u)} <= {v}
    # what the filter prevents: unfiltered, the writer of a mail to v moves too
    moved = {u for u in ev if texts(plan, annex, snap, False).get(u) != texts(plan2, annex2, changed, False).get(u)}
    assert moved - {v}
