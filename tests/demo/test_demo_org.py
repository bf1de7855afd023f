"""The demo organization: deterministic, heavy-tailed, stylised, with its secrets where truth.json says."""
from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from catalog.demo import CODENAMES, TEAMS, write_demo_org
from components.core.errors import VeilError
from components.core.hashing import sha256_file

# Independent of the generator's own patterns: written from the contract text.
CONTRACT_PATTERNS = {
    "credential": r"AKIA[0-9A-Z]{16}|acme_live_[0-9a-f]{24}",
    "email": r"[A-Za-z0-9._%+-]+@acme-corp\.example",
    "phone": r"\+1-555-\d{3}-\d{4}",
}


@pytest.fixture(scope="module")
def org(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    demo = write_demo_org(out, seed=0)
    msgs = [json.loads(line) for line in demo.messages_path.read_text(encoding="utf-8").splitlines()]
    corpus = [json.loads(line) for line in demo.corpus_path.read_text(encoding="utf-8").splitlines()]
    truth = json.loads(demo.truth_path.read_text(encoding="utf-8"))
    return demo, msgs, corpus, truth


def test_same_seed_same_bytes_other_seed_other_data(tmp_path, org):
    demo = org[0]
    again = write_demo_org(tmp_path / "again", seed=0)
    other = write_demo_org(tmp_path / "other", seed=1)
    for a, b, c in [(demo.messages_path, again.messages_path, other.messages_path),
                    (demo.corpus_path, again.corpus_path, other.corpus_path),
                    (demo.truth_path, again.truth_path, other.truth_path)]:
        assert sha256_file(a) == sha256_file(b)
        assert sha256_file(a) != sha256_file(c)


def test_fields_and_sizes(org):
    demo, msgs, corpus, _ = org
    assert demo.n_messages == len(msgs) and 8_000 <= len(msgs) <= 15_000
    assert 3_000 <= len(corpus) <= 6_000 and all(set(r) == {"text"} for r in corpus)
    ids = [m["id"] for m in msgs]
    assert len(set(ids)) == len(ids)
    for m in msgs:
        assert set(m) == ({"id", "user", "text", "source", "ts", "team", "path"} if m["source"] == "code"
                          else {"id", "user", "text", "source", "ts", "team"})
        assert m["source"] in ("mail", "chat", "ticket", "code")
        assert re.fullmatch(r"[a-z]+\.[a-z]+@acme-corp\.example", m["user"])
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", m["ts"])
        assert m["team"] in TEAMS
        assert 100 <= len(m["text"]) <= 400, m
        if m["source"] == "code":
            assert m["path"].startswith(f"teams/{m['team']}/") and m["path"].endswith(".py")
    assert Counter(m["source"] for m in msgs).keys() == {"mail", "chat", "ticket", "code"}


def test_users_teams_and_heavy_tail(org):
    demo, msgs, _, truth = org
    per_user = Counter(m["user"] for m in msgs)
    assert len(per_user) == demo.n_users == 240
    assert len({m["team"] for m in msgs}) == 12
    counts = sorted(per_user.values(), reverse=True)
    top = counts[: round(0.05 * len(counts))]
    share = sum(top) / sum(counts)
    assert share >= 0.25 and abs(share - demo.top5_share) < 1e-12
    median = counts[len(counts) // 2]
    assert 5 <= median <= 20 and 200 <= counts[0] <= 500 and counts[-1] >= 3
    # each person writes for one team only
    teams = {}
    for m in msgs:
        assert teams.setdefault(m["user"], m["team"]) == m["team"]
    assert {u["user"]: u["n_messages"] for u in truth["users"]} == dict(per_user)


def test_every_planted_secret_is_where_truth_says(org):
    _, msgs, _, truth = org
    by_id = {m["id"]: m for m in msgs}
    secrets = truth["secrets"]
    classes = Counter(s["class"] for s in secrets)
    assert classes["codename"] == 12 and classes["credential"] >= 12 and classes["email"] >= 100
    assert classes["phone"] >= 50
    for s in secrets:
        assert s["secret_id"] == f"{s['class']}:{s['value']}"
        hits = [by_id[i] for i in s["message_ids"]]
        assert hits and s["n_messages"] == len(hits)
        assert all(s["value"] in m["text"] for m in hits)
        assert sorted({m["user"] for m in hits}) == s["authors"]
        assert any(s["context"] + s["value"] in m["text"] for m in hits)  # context immediately precedes it
        assert s["owner_users"] and s["owner_teams"]
    # Complete: every match of the contract patterns in the messages is a listed secret occurrence.
    listed = {(s["value"], i) for s in secrets for i in s["message_ids"]}
    for m in msgs:
        for cls, pat in CONTRACT_PATTERNS.items():
            for v in re.findall(pat, m["text"]):
                assert (v, m["id"]) in listed, (cls, v, m["id"])
        for c in CODENAMES:
            if c in m["text"]:
                assert (c, m["id"]) in listed


def test_secret_semantics(org):
    _, msgs, _, truth = org
    team_of = {u["user"]: u["team"] for u in truth["users"]}
    by_id = {m["id"]: m for m in msgs}
    creds = [s for s in truth["secrets"] if s["class"] == "credential"]
    assert any(s["n_messages"] >= 4 for s in creds)  # some pasted repeatedly by the same person
    for s in creds:
        assert len(s["authors"]) == 1 and s["owner_users"] == s["authors"]
    for s in truth["secrets"]:
        if s["class"] == "codename":
            team = s["value"].lower()
            assert s["owner_teams"] == [team]
            assert all(team_of[a] == team for a in s["authors"])  # only the team says its codename
            assert len(s["authors"]) >= 3  # shared by several people: user-level DP alone won't hide it
            assert s["path_glob"] == f"teams/{team}/**"
        if s["class"] in ("email", "phone"):
            owner = s["owner_users"][0]
            assert owner in team_of
            if s["class"] == "phone":
                assert next(u for u in truth["users"] if u["user"] == owner)["phone"] == s["value"]
    # addresses appear in signatures of their owner and in cc lines of others
    emails = [s for s in truth["secrets"] if s["class"] == "email"]
    assert any(s["owner_users"][0] in s["authors"] for s in emails)
    assert any(set(s["authors"]) - set(s["owner_users"]) for s in emails)
    assert all(any("cc: " + s["value"] in by_id[i]["text"] or "| " + s["value"] in by_id[i]["text"]
                   or "(" + s["value"] + ")" in by_id[i]["text"] for i in s["message_ids"]) for s in emails)


def test_public_corpus_has_no_secret(org):
    _, msgs, corpus, truth = org
    text = "\n".join(r["text"] for r in corpus)
    for pat in CONTRACT_PATTERNS.values():
        assert not re.search(pat, text)
    assert "acme-corp" not in text and "AKIA" not in text and "acme_live" not in text and "+1-555" not in text
    # fictional people's contact details only: other domains, the +44 20 7946 drama range
    assert re.search(r"@[a-z]+\.example", text) and set(re.findall(r"@([a-z.]+)", text)) <= {
        "northwind.example", "globex.example", "initech.example", "contoso.example"}
    low = text.lower()
    for c in CODENAMES:
        assert c.lower() not in low
    for s in truth["secrets"]:
        assert s["value"].lower() not in low
    for u in truth["users"]:  # no one's name or handle either (names of fictional people only)
        first, last = u["user"].split("@")[0].split(".")
        assert not re.search(rf"\b{u['name']}\b", text)  # (Clara Abebe may appear; Lara Abebe may not)
        assert not re.search(rf"\b{first[0]}{last}\b", text)
        assert not re.search(rf"\b{first}\.{last}@", text)


def test_each_user_has_recognisable_style(org):
    _, msgs, _, truth = org
    by_user: dict[str, list[dict]] = {}
    for m in msgs:
        by_user.setdefault(m["user"], []).append(m)
    keys = set()
    n_marked = 0
    for u in truth["users"]:
        st = u["style"]
        key = (st["greeting"], st["signoff"], tuple(st["pet_phrases"]))
        assert key not in keys
        keys.add(key)
        mine = by_user[u["user"]]
        pets = [p.lower() for p in st["pet_phrases"]]
        marked = [m for m in mine if any(p in m["text"].lower() for p in pets)]
        n_marked += len(marked)
        if len(mine) >= 10:
            assert len(marked) >= 0.5 * len(mine), u["user"]
        for m in mine:
            if m["source"] == "mail":
                assert m["text"].startswith(st["greeting"] + "\n") and ("\n" + st["signoff"]) in m["text"]
            if m["source"] == "code":
                assert m["text"].startswith(st["code_tag"])
        if st["signature"] == "full" and any(m["source"] == "mail" for m in mine) and len(mine) >= 20:
            assert any(u["phone"] in m["text"] for m in mine)
    assert n_marked >= 0.75 * len(msgs)
    # a personal motto, unique per person, under many of their messages
    mottos = [u["style"]["motto"] for u in truth["users"]]
    assert len(set(mottos)) == len(mottos)
    with_motto = 0
    for u in truth["users"]:
        mine = by_user[u["user"]]
        hits = sum(u["style"]["motto"].lower() in m["text"].lower() for m in mine)
        with_motto += hits
        if len(mine) >= 20:
            assert hits >= 0.15 * len(mine), u["user"]
    assert with_motto >= 0.35 * len(msgs)
    # markers identify people: a message's pet phrases + greeting point to a small set including its author
    index: dict[tuple, set] = {}
    for u in truth["users"]:
        index[(u["style"]["greeting"], tuple(u["style"]["pet_phrases"]))] = u["user"]
    mails = [m for m in msgs if m["source"] == "mail"]
    hits = 0
    for m in mails:
        cands = [usr for (g, pets), usr in index.items()
                 if m["text"].startswith(g + "\n") and any(p.lower() in m["text"].lower() for p in pets)]
        hits += cands == [m["user"]]
    assert hits >= 0.5 * len(mails)
    # typo habits show up
    typo_users = [u for u in truth["users"] if "teh" in u["style"]["typos"]]
    assert typo_users and any(" teh " in m["text"] for u in typo_users for m in by_user[u["user"]])


def test_bad_size_is_a_clear_error(tmp_path):
    with pytest.raises(VeilError, match="n_users"):
        write_demo_org(tmp_path, n_users=5)
