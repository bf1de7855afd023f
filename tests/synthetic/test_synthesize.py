"""`veil synthesize` (issue 25): a corpus from a registered, verified DP model, certified, sealed, recorded.

One tiny model is trained for real (ingest → plan → 3 DP steps → certify → register, no audit) so that
the snapshot swap means something: the model saw that snapshot; afterwards the snapshot, the catalog
and the plan's private files are deleted and another organization is ingested — the corpus for the
same seed is byte-identical (generation reads none of it), and a different seed is not.
"""
from __future__ import annotations

import ast
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from components.core.errors import VeilError
from components.core.settings import load_settings
from flows import stages

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    from components.modeling import build_base_model

    tmp = tmp_path_factory.mktemp("synth")
    home = tmp / "home"
    s = load_settings(home).ensure()
    org = stages.demo_data(s)
    texts = [json.loads(line)["text"] for line in open(org["public"])][:200]
    base = build_base_model(texts, tmp / "base", vocab_size=320, n_layer=1, n_embd=16, n_head=2, n_positions=48,
                            steps=2, seq_len=32, batch_size=8, progress=False)
    lines = open(org["messages"]).read().splitlines()
    users = sorted({json.loads(line)["user"] for line in lines})[:80]
    src = tmp / "messages.jsonl"
    src.write_text("".join(line + "\n" for line in lines if json.loads(line)["user"] in users))
    doc = yaml.safe_load(stages.DEMO_POLICY.read_text())
    doc["metadata"]["name"] = "synth-tiny"
    doc["spec"]["training"].update(steps=2, expected_batch_size=8, seq_len=32, micro_batch_size=8)
    doc["spec"]["audit"]["attacker_samples_per_user"] = 2
    # echo canaries (the echo audit below): openings the demo's messages share, then a keyed random suffix
    doc["spec"]["audit"]["canaries"] = {"users": 10, "records_per_user": 4, "substring_words": 6,
                                        "prefixes": ["Good morning all,", "heads up:", "nice work on the",
                                                     "quick question about the", "Status:"]}
    policy = tmp / "tiny.yaml"
    policy.write_text(yaml.safe_dump(doc, sort_keys=False))
    old = os.environ.get("VEIL_HOME")
    os.environ["VEIL_HOME"] = str(home)
    try:
        # the pipeline's stages up to registration (no audit, no evaluation: not what is tested here)
        ing = stages.ingest(s, str(src), "jsonl", policy=str(policy), **stages.DEMO_MAPPING)
        planned = stages.plan(s, str(policy), snapshot_id=ing["snapshot_id"], base_dir=str(base))
        trained = stages.train(s, planned["plan_path"], str(base))
        cert = stages.certify(s, planned["plan_path"], trained)
        reg = stages.register(s, name="syn", certificate=cert, plan_path=planned["plan_path"], base_dir=str(base),
                              adapter_dir=trained.get("adapter_dir") or trained.get("model_dir"))
        yield {"home": home, "settings": s, "result": {"certificate": cert, "registration": reg}, "tmp": tmp}
    finally:
        if old is None:
            os.environ.pop("VEIL_HOME", None)
        else:
            os.environ["VEIL_HOME"] = old


def _cli(release, *args):
    from flows.cli import app

    return CliRunner().invoke(app, list(args), env={"VEIL_HOME": str(release["home"]), "VEIL_PROGRESS": "0"})


def _synth(release, *args) -> dict:
    r = _cli(release, "synthesize", "models:/syn/1", "--max-new-tokens", "12", "--json", *args)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _files(doc: dict) -> dict[str, bytes]:
    d = Path(doc["corpus_dir"])
    return {n: (d / n).read_bytes() for n in ("records.jsonl", "records.parquet")}


def test_consumer_load_ledger_and_tampering(release):
    """One documented call loads the corpus with its verified certificate; the ledger shows the release
    (no charge); an edited corpus file, certificate or registry copy is refused in one line."""
    from components.ledger import Ledger
    from components.registry import load_synthetic

    s = release["settings"]
    prompts = release["tmp"] / "prompts.yaml"
    prompts.write_text("prompts:\n  - {code: status, text: 'Status:', weight: 3}\n  - {code: note, text: ''}\n")
    doc = _synth(release, "--records", "12", "--prompts", str(prompts), "--seed", "5")
    corpus = load_synthetic(doc["uri"], s)
    t = corpus.table
    assert t.num_rows == 12 and t.column_names == ["index", "control_code", "text"]
    assert t.column("control_code").to_pylist() == ["status"] * 9 + ["note"] * 3   # 3:1 of 12
    assert all(x.startswith("Status:") for x in corpus.texts[:9])
    cert, model_cert = corpus.certificate, release["result"]["certificate"]
    assert cert["model"]["certificate_sha256"] == model_cert["sha256"]
    assert cert["inherits"]["epsilon"] == model_cert["epsilon"] and cert["inherits"]["delta"] == model_cert["delta"]
    assert cert["inherits"]["privacy_unit"] == "user" and cert["generation"]["reads_private_data"] is False
    assert corpus.verification["valid"] and corpus.verification["checks"]["registry"]
    from flows.cli.synthetic_cmds import summary_line      # the demo summary's row
    line = summary_line(doc)
    assert line.startswith("12 records (public-control-codes), inherits user-level ε=") and doc["uri"] in line
    # files are the owner's only
    for p in Path(doc["corpus_dir"]).iterdir():
        assert p.stat().st_mode & 0o077 == 0, p

    # the ledger: one 'synthetic' release post-processing the model's, and nobody charged for it
    led = Ledger.open(s)
    try:
        pp = led.post_processing_releases()
        assert [(r["kind"], r["of_release"], r["records"]) for r in pp] == \
            [("synthetic", release["result"]["registration"]["lifetime"]["ledger_release_id"], 12)]
        from sqlalchemy import func, select

        from components.ledger import store as st
        with st.read_only(led.engine) as conn:
            assert conn.execute(select(func.count()).select_from(st.charges)
                                .where(st.charges.c.release_id == pp[0]["release_id"])).scalar() == 0
    finally:
        led.dispose()
    r = _cli(release, "ledger", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["post_processing_releases"][0]["corpus_sha256"] == doc["corpus_sha256"]

    # tampering, offline (the corpus folder) and in the registry
    d = Path(doc["corpus_dir"])
    copy = release["tmp"] / "copy"
    shutil.copytree(d, copy)
    assert load_synthetic(copy, s).table.num_rows == 12
    jl = copy / "records.jsonl"
    jl.write_bytes(jl.read_bytes().replace(b"Status:", b"Statos:", 1))
    with pytest.raises(VeilError, match=r"refused: corpus: records\.jsonl hashes to"):
        load_synthetic(copy, s)
    shutil.copy(d / "records.jsonl", jl)
    from components.core.hashing import sha256_json
    c = json.loads((copy / "certificate.json").read_text())
    c["inherits"]["epsilon"] = c["inherits"]["epsilon"] / 2          # a smaller ε, re-hashed: the seal refuses it
    c["sha256"] = sha256_json({k: v for k, v in c.items() if k != "sha256"})
    (copy / "certificate.json").write_text(json.dumps(c))
    with pytest.raises(VeilError, match=r"refused: signature: the corpus seal is for another certificate"):
        load_synthetic(copy, s)
    import mlflow

    client = mlflow.MlflowClient()
    client.log_artifact(doc["run_id"], str(copy / "certificate.json"), artifact_path="synthetic")
    with pytest.raises(VeilError, match=r"synthetic corpus runs:/\S+ refused: signature"):
        load_synthetic(doc["uri"], s)
    with pytest.raises(VeilError, match="expected runs:/RUN_ID or a corpus folder|no such run"):
        load_synthetic("runs:/", s)


def test_echo_audit_of_the_corpus(release):
    """`veil audit-synthetic`: the corpus (verified) against the plan's echo canaries, never the model. Two DP
    steps echo nothing, and 5 + 5 canaries cannot settle: INCONCLUSIVE (exit 3) with the canaries it needs;
    per-canary values only in the private report; the corpus' run tagged; every field through the gate."""
    from components.publication import Kind, recording

    doc = _synth(release, "--records", "40", "--seed", "3")
    cid = Path(doc["corpus_dir"]).name
    with recording() as rec:
        r = _cli(release, "audit-synthetic", cid[:10], "--json", "--bootstrap", "10")
    assert r.exit_code in (0, 3), r.output            # passed cannot be ruled out by chance; failed can
    out = json.loads(r.stdout)
    assert out["verdict"] == ("inconclusive" if r.exit_code == 3 else "passed")
    assert out["canary_kind"] == "echo" and out["canaries_in"] == [0, 10] and out["canaries_out"] == [0, 10]
    assert out["covered_by_certificate"] is False and out["corpus"]["certificate_sha256"] == doc["certificate_sha256"]
    assert out["binding_ceiling"] is not None and out["binding_ceiling"] <= out["auroc_ceiling"]
    if r.exit_code == 3:
        assert isinstance(out["people_needed"], (dict, str)) and "INCONCLUSIVE" in " ".join(out["reasons"])
    priv = Path(out["private_report"])
    assert priv.stat().st_mode & 0o077 == 0 and str(priv).startswith(str(release["settings"].private_dir))
    report = json.loads(priv.read_text())
    assert len(report["rows"]) == 10 and sum(x["member"] for x in report["rows"]) == 5
    for x in report["rows"]:                          # exact per-canary values stay here, not in the output
        assert 0 <= x["echo"] <= 1 and f'"{x["user_id"]}"' not in r.stdout
    kinds = {(p.channel, p.path): p.field.kind for p in rec}
    assert kinds[("cli.audit_synthetic", "verdict")] is Kind.UNCOVERED
    assert kinds[("registry.tag", "synthetic.echo_audit.verdict")] is Kind.UNCOVERED
    import mlflow

    assert mlflow.MlflowClient().get_run(doc["run_id"]).data.tags["synthetic.echo_audit.verdict"] == out["verdict"]
    table = _cli(release, "audit-synthetic", doc["corpus_dir"], "--no-record", "--bootstrap", "10")
    assert table.exit_code == r.exit_code and "Echo audit of corpus" in table.stdout, table.output
    bad = _cli(release, "audit-synthetic", "no-such-corpus")
    assert bad.exit_code == 2 and bad.stderr.strip().startswith("error: corpus 'no-such-corpus': no such corpus")


@pytest.mark.parametrize("body,expect", [
    ("prompts: []\n", "prompts: must be a non-empty list"),
    ("prompts:\n  - {code: Bad Code, text: x}\n", r"prompts\[0\]\.code: 'Bad Code' must match"),
    ("prompts:\n  - {code: a, text: x}\n  - {code: a, text: y}\n", r"prompts\[1\]\.code: 'a' appears twice"),
    ("prompts:\n  - {code: a, text: x, weight: -1}\n", r"prompts\[0\]\.weight: -1 must be a positive number"),
    ("prompts:\n  - {code: a, txt: x}\n", r"prompts\[0\]: unknown key 'txt'"),
    ("prompts: [\n", r"not valid YAML \(line"),
])
def test_bad_prompts_file_is_one_line_exit_2(tmp_path, veil_home, body, expect):
    """Checked before any model is loaded (the URI here names nothing): one line naming the file and entry."""
    import re

    from flows.cli import app

    p = tmp_path / "prompts.yaml"
    p.write_text(body)
    r = CliRunner().invoke(app, ["synthesize", "models:/nothing/1", "--records", "3", "--prompts", str(p)],
                           env={"VEIL_HOME": str(veil_home)})
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {p}") and re.search(expect, lines[0]), r.stderr
    r = CliRunner().invoke(app, ["synthesize", "models:/nothing/1", "--records", "0"], env={"VEIL_HOME": str(veil_home)})
    assert r.exit_code == 2 and r.stderr.strip() == "error: --records 0: must be between 1 and 10000000"


def test_nothing_private_reaches_generation(release):
    """Swap the private snapshot for another organization's after training: the same seed gives the same
    bytes. And generation's code imports nothing that reads data."""
    s = release["settings"]
    before = _synth(release, "--records", "10", "--seed", "11")
    other = _synth(release, "--records", "10", "--seed", "12")
    assert _files(other) != _files(before)      # the seed matters: the comparison below can fail

    home = Path(release["home"])
    for p in [home / "snapshots", home / "catalog.duckdb", Path(s.private_dir) / "plans"]:
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    org2 = stages.demo_data(s, release["tmp"] / "org2", seed=1)
    ing = stages.ingest(s, org2["messages"], "jsonl", **stages.DEMO_MAPPING)
    assert ing["accepted"] > 0
    after = _synth(release, "--records", "10", "--seed", "11")
    assert _files(after) == _files(before)
    assert after["corpus_sha256"] == before["corpus_sha256"]
    assert after["certificate_sha256"] != before["certificate_sha256"]   # a new release event, same records

    # statically: components/synthetic imports no catalog, flows, snapshot, plan annex or training data
    banned = ("catalog", "flows", "components.planning", "components.training", "duckdb")
    for f in (ROOT / "components" / "synthetic").glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad = [n for n in names if n.split(".")[0] in banned or n.startswith(banned)]
            assert not bad, f"{f.name} imports {bad}"


def test_every_published_field_passes_the_gate(release):
    """Everything synthesize publishes goes through the gate, every leaf declared; the records' text and
    the corpus' hashes are declared as post-processing of the DP weights, the scan's counts too."""
    from components.publication import Kind, recording
    from flows.synthetic import synthesize

    with recording() as rec:
        synthesize(release["settings"], "models:/syn/1", records=4, seed=2, max_new_tokens=8, progress=False)
    by = {(p.channel, p.path): p.field for p in rec}
    for ch in ("synthetic.records", "synthetic.certificate", "synthetic.seal", "cli.synthesize", "registry.tag"):
        assert any(c == ch for c, _ in by), ch
    assert by[("synthetic.records", "records.text")].kind is Kind.DP
    assert by[("synthetic.certificate", "inherits.epsilon")].post_processing_of == "certificate:epsilon"
    assert by[("cli.synthesize", "scan.email")].kind is Kind.DP
    assert by[("registry.tag", "synthetic.corpus_sha256")].kind is Kind.DP
    for (ch, path), f in by.items():
        assert f is not None and f.kind in (Kind.PUBLIC, Kind.DP), (ch, path)


def test_scan_counts_and_private_listing(tmp_path):
    """The scan runs the catalog's detectors; counts per class (records, not spans), the list is private."""
    from flows.synthetic import scan_records

    recs = [{"index": 0, "control_code": None, "text": "mail alice@example.com or bob@example.org"},
            {"index": 1, "control_code": None, "text": "nothing here"},
            {"index": 2, "control_code": None, "text": "call +1 415 555 2671 or write carol@example.net"}]
    counts, matches = scan_records(recs)
    assert counts["email"] == 2 and counts["phone"] == 1 and counts["credential"] == 0
    assert {m["index"] for m in matches} == {0, 2} and {m["match"] for m in matches if m["secret_class"] == "email"} \
        == {"alice@example.com", "bob@example.org", "carol@example.net"}
