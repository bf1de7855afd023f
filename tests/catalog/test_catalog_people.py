"""Who is a person: bots and service accounts excluded by policy, one person's identities merged,
likely duplicates (one name, several addresses) found at ingest and kept out of published output."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from catalog.ingest import ingest_source
from catalog.people import apply_people, likely_same_person
from catalog.snapshots import load_snapshot
from components.policy import PolicyError, parse_policy

DEMO = Path(__file__).resolve().parents[2] / "policies" / "demo.yaml"


def _records(rows):
    return pa.table({"record_id": [f"r{i}" for i in range(len(rows))], "user_id": [u for u, _ in rows],
                     "text": ["t"] * len(rows), "metadata": [json.dumps({"author_name": n}) for _, n in rows]})


PEOPLE = {"exclude": ["*[bot]@*", "pre-commit-ci*", "jenkins@*"],
          "aliases": [["ann@corp.example", "ann.lee@gmail.com"]]}


def test_exclude_and_merge_with_counts_only():
    recs = _records([("49699333+dependabot[bot]@users.noreply.github.com", "dependabot[bot]"),
                     ("66853113+pre-commit-ci[bot]@users.noreply.github.com", "pre-commit-ci[bot]"),
                     ("jenkins@ci.corp.example", "Jenkins"), ("ann@corp.example", "Ann Lee"),
                     ("ann.lee@gmail.com", "Ann Lee"), ("bob@corp.example", "Bob"), ("bob@corp.example", "Bob"),
                     ("b@corp.example", "Bot Builder")])  # '[bot]' is literal: "b" + "ot" is not a bot
    out, rep = apply_people(recs, PEOPLE)
    assert sorted(set(out.column("user_id").to_pylist())) == ["ann@corp.example", "b@corp.example", "bob@corp.example"]
    assert out.column("record_id").to_pylist() == ["r3", "r4", "r5", "r6", "r7"]  # record ids kept
    assert rep["excluded_accounts"] == 3 and rep["excluded_records"] == 3
    assert rep["excluded_accounts_by_pattern"] == {"*[bot]@*": 2, "pre-commit-ci*": 0, "jenkins@*": 1}
    assert rep["merged_accounts"] == 1 and rep["people"] == 3
    assert "ann" not in json.dumps(rep) and "dependabot" not in json.dumps(rep)  # counts, never names


def test_exclusion_matches_names_too():
    out, rep = apply_people(_records([("12345@users.noreply.github.com", "renovate[bot]"), ("a@x", "A")]),
                            {"exclude": ["renovate*"]})
    assert out.column("user_id").to_pylist() == ["a@x"] and rep["excluded_accounts"] == 1


def test_policy_people_section_validates():
    text = DEMO.read_text()
    assert "people:" not in text
    els = text.replace("mechanism: uls", "mechanism: els")
    ok = parse_policy(els.rstrip("\n") + "\n  people:\n    exclude: ['*[bot]@*']\n"
                      "    aliases: [[ann@x.example, ann@y.example]]\n    ownership: all-participants\n")
    assert ok.people()["ownership"] == "all-participants"
    assert ok.people()["multi_owner_order"] == "fewest-owners"
    # uls samples whole users; a record owned by several people has no one user to sample with
    with pytest.raises(PolicyError, match="all-participants"):
        parse_policy(text.rstrip("\n") + "\n  people:\n    ownership: all-participants\n")
    for bad, why in [("    aliases: [[ann@x.example]]\n", "at least two"),
                     ("    aliases: [[a@x, b@x], [b@x, c@x]]\n", "also in alias list"),
                     ("    exclude: ['*']\n", "every account")]:
        with pytest.raises(PolicyError, match=why):
            parse_policy(text.rstrip("\n") + "\n  people:\n" + bad)


def _git(repo, *args, env=None):
    e = {**os.environ, "GIT_COMMITTER_NAME": "c", "GIT_COMMITTER_EMAIL": "c@x.example",
         "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", **(env or {})}
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=e)


def test_ingest_warns_about_one_name_under_several_addresses(settings, tmp_path):
    repo = tmp_path / "r"
    repo.mkdir()
    _git(repo, "init", "-q")
    for i, (name, mail) in enumerate([("Ann Lee", "ann@corp.example"), ("Ann  Lée", "ann.lee@gmail.com"),
                                      ("Bob Stone", "bob@corp.example"), ("root", "root@a"), ("root", "root@b")]):
        (repo / f"f{i}.txt").write_text(f"line {i}\n")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", f"c{i}", env={"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": mail})
    rep = ingest_source(repo, "git", settings=settings)
    assert rep.likely_duplicate_people == 1  # "root" is one word: too common to mean one person
    doc = json.loads((settings.private_dir / "people" / "likely-duplicates.json").read_text())
    assert doc["likely_same_person"] == [{"name": "ann lee", "user_ids": ["ann.lee@gmail.com", "ann@corp.example"]}]
    assert "ann" not in json.dumps(rep.to_dict())
    assert likely_same_person(load_snapshot(settings).records) == doc["likely_same_person"]


def test_ingest_under_a_policy_that_merges_them_does_not_ask_again(settings, tmp_path):
    # issue 26: `veil ingest --policy P` warned "58 names under several ids … merge them with
    # people.aliases" on a policy that already merged every one of them
    p = tmp_path / "a.jsonl"
    rows = [("ann@corp.example", "Ann Lee"), ("ann.lee@gmail.com", "Ann Lee"), ("bob@corp.example", "Bob Stone"),
            ("bob@home.example", "Bob Stone")]
    p.write_text("".join(json.dumps({"user": f"{n} <{u}>", "text": f"t{i}"}) + "\n" for i, (u, n) in enumerate(rows)))
    pol = tmp_path / "p.yaml"
    pol.write_text(DEMO.read_text().rstrip("\n") + "\n  people:\n    aliases: [[Ann@Corp.example, ann.lee@gmail.com]]\n")
    rep = ingest_source(p, "jsonl", settings=settings, rules=pol)
    assert rep.likely_duplicate_people == 1          # Bob is still two ids; Ann is one person under the policy
    doc = json.loads((settings.private_dir / "people" / "likely-duplicates.json").read_text())
    assert [g["name"] for g in doc["likely_same_person"]] == ["bob stone"]
    assert ingest_source(p, "jsonl", settings=settings).likely_duplicate_people == 2   # no policy: both


def test_people_cli_prints_counts(settings, tmp_path, monkeypatch):
    from flows.cli import app

    p = tmp_path / "a.jsonl"
    p.write_text('{"user":"dependabot[bot]@gh","text":"bump x"}\n{"user":"ann@x","text":"hello"}\n')
    ingest_source(p, "jsonl", settings=settings)
    pol = tmp_path / "p.yaml"
    pol.write_text(DEMO.read_text().rstrip("\n") + "\n  people:\n    exclude: ['*[bot]@*']\n")
    res = CliRunner().invoke(app, ["catalog", "people", "--policy", str(pol), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert (d["accounts"], d["excluded_accounts"], d["excluded_records"], d["people"]) == (2, 1, 1, 1)
    assert "dependabot" not in res.stdout


def test_all_participants_own_a_mail(settings, tmp_path):
    mbox = (b"From a@x Mon Jan  2 03:04:05 2006\nFrom: Ann <ann@x.example>\nTo: bob@x.example, dependabot[bot]@gh\n"
            b"Cc: Ann Lee <ann.lee@gmail.com>, carol@x.example\nBcc: secret.watcher@x.example\n\nhello all\n\n"
            b"From b@x Mon Jan  2 03:04:05 2006\nFrom: bob@x.example\n\nno recipients\n")
    p = tmp_path / "m.mbox"
    p.write_bytes(mbox)
    ingest_source(p, "mbox", settings=settings)
    recs = load_snapshot(settings).records
    people = {"exclude": ["*[bot]@*"], "aliases": [["ann.lee@gmail.com", "ann@x.example"]],
              "ownership": "all-participants"}
    out, rep = apply_people(recs, people)
    owners = dict(zip(out.column("user_id").to_pylist(), out.column("owners").to_pylist()))
    # the writer first (merged to the alias's first id); recipients mapped and excluded the same way;
    # the writer's own alias among the recipients is not a second owner; Bcc never owns
    assert owners == {"ann.lee@gmail.com": ["ann.lee@gmail.com", "bob@x.example", "carol@x.example"],
                      "bob@x.example": ["bob@x.example"]}
    assert rep["records_with_several_owners"] == 1
    out2, _ = apply_people(recs, {**people, "ownership": "author"})
    assert [len(o) for o in out2.column("owners").to_pylist()] == [1, 1]
