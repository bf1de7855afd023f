"""Filtered ULS (Asi & Liu, Alg. 3) end to end (no Prefect): policy → plan (σ at ε/2, full batch,
refused below the user count the bound needs) → every user every step → certificate → registry."""
import pytest
import yaml

from components.core.errors import VeilError
from components.core.settings import load_settings
from flows import stages

pytestmark = pytest.mark.slow

FILTERED_POLICY = stages.DEMO_POLICY.parent / "filtered-research.yaml"


def test_filtered_uls_pipeline(veil_home, tmp_path):
    import json

    from catalog.demo import write_demo_org
    from components.accounting.filtered import min_users
    from components.modeling import build_base_model
    from components.registry import list_models
    from flows.cli.core_cmds import run_stages

    settings = load_settings(veil_home).ensure()
    org = write_demo_org(tmp_path / "org", seed=0, n_users=1000)
    texts = [json.loads(line)["text"] for line in open(org.corpus_path)][:300]
    base = build_base_model(texts, tmp_path / "base", vocab_size=384, n_layer=1, n_embd=32, n_head=2,
                            n_positions=64, steps=3, seq_len=64, batch_size=8, progress=False)
    doc = yaml.safe_load(FILTERED_POLICY.read_text())
    doc["spec"]["training"].update({"steps": 1, "seq_len": 64, "micro_batch_size": 64})
    doc["spec"]["contribution"]["max_records_per_user"] = 2
    doc["spec"]["filter"]["tau"] = 1.0e6          # every pair concentrated: the test passes
    doc["spec"]["audit"] = {"holdout_users": 0.2}
    policy = tmp_path / "filtered.yaml"
    policy.write_text(yaml.safe_dump(doc, sort_keys=False))

    result = run_stages(settings, str(policy), org.messages_path, "jsonl", base_model_dir=str(base),
                        model_name="filtered", mapping=stages.DEMO_MAPPING, audit=False)
    cert, train = result["certificate"], result["train"]
    pop = result["plan"]["data"]["population"]          # replace-one: the user count is public
    assert pop["mechanism"] == "none"
    n_users = pop["exact"]
    assert n_users >= min_users(8.0, 1e-5, 1)
    assert cert["mechanism"] == "uls-filtered" and cert["neighbouring"] == "replace_one_user"
    assert cert["within_target"] and cert["epsilon"] <= 8.0 and cert["delta"] <= 1e-5
    assert cert["filter"]["gaussian_steps"] == 1 and cert["filter"]["halted_at_step"] is None
    assert train["extra"]["kept_users_mean"] == pytest.approx(n_users)   # everyone kept with weight 1
    assert "batch_mean" not in train                                       # realised batches stay private
    rows = [r for r in list_models(settings) if r["name"] == "filtered"]
    assert rows and rows[0]["certificate"]["sha256"] == cert["sha256"]

    # the same policy on the 240-user demo org is refused at plan time, in one line
    small = tmp_path / "small"
    small_settings = load_settings(small).ensure()
    org2 = write_demo_org(tmp_path / "org2", seed=0)
    stages.ingest(small_settings, org2.messages_path, "jsonl", policy=stages.DEMO_POLICY)
    with pytest.raises(VeilError, match="too few for a certified filtered run"):
        stages.plan(small_settings, policy)
