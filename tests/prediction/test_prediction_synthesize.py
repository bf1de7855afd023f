"""`veil synthesize MODEL_URI --pmixed` (issue 25): a synthetic corpus drawn through a PMixED ensemble.

Every token is charged to the ensemble's token budget before it is drawn (the budget goes down by exactly
the tokens in the corpus); a corpus the budget cannot hold is refused up front in one line; a budget spent
mid-way by concurrent serving stops the corpus cleanly, keeping what was drawn; the corpus is certified as
part of the ensemble's release, sealed, registered with lineage, loaded verified, and refused when tampered.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from components.core.errors import VeilError

POLICY = """apiVersion: veil.dev/v1
kind: PredictionPolicy
metadata: {name: tiny-synth, owner: tests}
spec:
  target: {epsilon: 4.0, delta: 1.0e-5}
  shards: 3
  subsample_rate: 0.5
  token_budget: 40
  when_exhausted: public_only
  max_tokens_per_request: 8
  training: {epochs: 1, learning_rate: 1.0e-2, seq_len: 32, batch_size: 4, lora: {r: 2, alpha: 8.0}, seed: 0}
"""


def _build(settings, tiny_base, tiny_people, tmp_path) -> dict:
    from catalog.ingest import ingest_source
    from flows.pmixed import build

    src = tmp_path / "people.jsonl"
    with src.open("w") as f:
        for i, (u, t) in enumerate(zip(tiny_people.column("user_id").to_pylist(),
                                       tiny_people.column("text").to_pylist())):
            f.write(json.dumps({"id": f"r{i}", "user": u, "text": t}) + "\n")
    ingest_source(src, "jsonl", settings=settings, id_field="id")
    pol = tmp_path / "p.yaml"
    pol.write_text(POLICY)
    return build(settings, pol, base_dir=tiny_base, use_prefect=False)


def _cli(home, *args):
    from flows.cli import app

    return CliRunner().invoke(app, list(args), env={"VEIL_HOME": str(home), "VEIL_PROGRESS": "0"})


def test_pmixed_corpus_charges_exactly_what_it_draws(settings, veil_home, tiny_base, tiny_people, tmp_path,
                                                     monkeypatch):
    from components.core.hashing import sha256_json
    from components.ledger import Ledger
    from components.prediction.budget import TokenBudget
    from components.registry import load_synthetic
    from components.synthetic.corpus import pmixed_epsilon
    from flows.synthetic import synthesize_pmixed

    built = _build(settings, tiny_base, tiny_people, tmp_path)
    uri, pcert = built["model_uri"], built["certificate"]
    eid = pcert["ensemble_id"]
    # the corpus' independent ε recomputation agrees with components.prediction's
    assert abs(pmixed_epsilon(pcert) - pcert["epsilon"]) < 1e-9

    tb = TokenBudget.open(settings)
    try:
        assert tb.spent(eid) == 0
        res = synthesize_pmixed(settings, uri, records=4, max_new_tokens=3, progress=False)
        doc = res["public"]
        per = res["private"]["tokens_per_record"]
        # exactly the tokens drawn: the budget's decrease = the tokens charged = the tokens in the records
        assert tb.spent(eid) == doc["tokens_charged"] == sum(per)
        assert len(per) == doc["records_kept"] == 4 and all(1 <= n <= 3 for n in per)
        assert doc["stopped_by_budget"] is False and doc["source"] == "pmixed"
        charged_first = doc["tokens_charged"]

        # one documented call loads it verified; its certificate names the PMixED release it is part of
        corpus = load_synthetic(doc["uri"], settings)
        c = corpus.certificate
        assert corpus.table.num_rows == 4 and corpus.verification["valid"]
        assert corpus.verification["checks"]["registry"] and corpus.verification["checks"]["epsilon_recomputed"]
        assert c["source"] == "pmixed" and c["model"]["ensemble_id"] == eid
        assert c["model"]["certificate_sha256"] == pcert["sha256"]
        assert c["inherits"]["epsilon"] == pcert["epsilon"] and c["inherits"]["privacy_unit"] == "user"
        assert c["tokens"] == {**c["tokens"], "charged": charged_first, "token_budget": 40}
        assert "part of the transcript" in c["statement"] and f"{charged_first} private tokens" in c["statement"]
        assert not (Path(doc["corpus_dir"]) / "model_seal.json").exists()
        # lineage: the ensemble's version points at the corpus run; the ledger shows it post-processing the build
        from mlflow import MlflowClient

        mv = MlflowClient(settings.mlflow_tracking_uri).get_model_version("tiny-synth", uri.rsplit("/", 1)[1])
        assert mv.tags[f"synthetic.corpus.{c['sha256'][:12]}"] == doc["run_id"]
        led = Ledger.open(settings)
        try:
            pp = led.post_processing_releases()
            assert [(r["kind"], r["of_release"], r["tokens_charged"]) for r in pp] == \
                [("synthetic", pcert["ledger"]["ledger_release_id"], charged_first)]
        finally:
            led.dispose()
        r = _cli(veil_home, "ledger", "--json")        # every field the ledger view shows passes the gate
        assert r.exit_code == 0, r.output
        row = json.loads(r.stdout)["post_processing_releases"][0]
        assert (row["source"], row["tokens_charged"], row["records_kept"]) == ("pmixed", charged_first, 4)
        from flows.cli.synthetic_cmds import summary_line
        assert summary_line(doc).startswith(f"4 records (unconditional) drawn through PMixED, {charged_first} private "
                                            "tokens charged; covered by its user-level ε=")

        # tampering: the PMixED certificate beside the corpus (ε halved, re-hashed), or a record
        copy = tmp_path / "copy"
        shutil.copytree(doc["corpus_dir"], copy)
        assert load_synthetic(copy, settings).table.num_rows == 4
        mc = json.loads((copy / "model_certificate.json").read_text())
        mc["epsilon"] = mc["epsilon"] / 2
        mc["sha256"] = sha256_json({k: v for k, v in mc.items() if k != "sha256"})
        (copy / "model_certificate.json").write_text(json.dumps(mc))
        with pytest.raises(VeilError, match=r"refused: .*model_certificate: the PMixED certificate "):
            load_synthetic(copy, settings)
        shutil.copy(Path(doc["corpus_dir"]) / "model_certificate.json", copy / "model_certificate.json")
        jl = copy / "records.jsonl"
        jl.write_bytes(jl.read_bytes().replace(b'"index":3', b'"index":9', 1))
        with pytest.raises(VeilError, match=r"refused: corpus: records\.jsonl hashes to"):
            load_synthetic(copy, settings)

        # refused up front, one line, saying how many records fit; nothing charged
        left = 40 - charged_first
        r = _cli(veil_home, "synthesize", uri, "--pmixed", "--records", "100", "--max-new-tokens", "8")
        assert r.exit_code == 2, r.output
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and f"has {left} left: at most {left // 8} records of 8 tokens fit" in lines[0], r.stderr
        r = _cli(veil_home, "synthesize", uri, "--pmixed", "--records", "2", "--seed", "3")
        assert r.exit_code == 2 and "--seed: not with --pmixed" in r.stderr, r.output
        r = _cli(veil_home, "synthesize", uri, "--records", "2")         # never spent by default
        assert r.exit_code == 2 and r.stderr.strip() == (f"error: {uri} is a PMixED ensemble: pass --pmixed to draw "
                                                         "the corpus through it (every token is charged to its token "
                                                         "budget)"), r.output
        assert tb.spent(eid) == charged_first

        # concurrent serving spends the rest after this corpus' 2nd token: it stops, keeps what it drew
        real_charge = TokenBudget.charge
        calls = {"n": 0}

        def charge_then_drain(self, ensemble_id, tokens=1):
            ok = real_charge(self, ensemble_id, tokens)
            calls["n"] += 1
            if calls["n"] == 2:
                self.charge_upto(ensemble_id, 10_000)     # another server drains the budget
            return ok
        monkeypatch.setattr(TokenBudget, "charge", charge_then_drain)
        res = synthesize_pmixed(settings, uri, records=3, max_new_tokens=5, progress=False)
        monkeypatch.setattr(TokenBudget, "charge", real_charge)
        doc2 = res["public"]
        assert doc2["stopped_by_budget"] is True and doc2["tokens_charged"] == 2
        assert doc2["records_kept"] == len(res["private"]["tokens_per_record"]) >= 1
        assert sum(res["private"]["tokens_per_record"]) == 2 and doc2["records"] == 3
        assert tb.spent(eid) == 40
        got = load_synthetic(doc2["uri"], settings)
        assert got.table.num_rows == doc2["records_kept"] and got.certificate["tokens"]["charged"] == 2
        assert "stopped: the token budget ran out after" in summary_line(doc2)
    finally:
        tb.dispose()
