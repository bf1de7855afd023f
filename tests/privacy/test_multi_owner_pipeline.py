"""Mail with recipients, end to end under `people.ownership: all-participants`: ingest an mbox,
plan, train, certify, re-check the certificate, and find every owner charged in the ledger — a
person who only ever receives mail included (before, `veil plan` refused the ownership)."""
from __future__ import annotations

import random

import numpy as np
import yaml

from catalog.ingest import ingest_source
from components.certificate.verify import recheck_guarantee
from components.ledger import Ledger
from flows import stages

PEOPLE = [f"p{i:02d}@corp.example" for i in range(24)]
READERS = ["reader.one@corp.example", "reader.two@corp.example"]
TOPICS = "budget launch review deploy invoice roadmap meeting outage hiring travel".split()


def _mbox(path, n=160, seed=3):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        w = rng.choice(PEOPLE)
        to = sorted({x for x in rng.sample(PEOPLE + READERS, rng.randint(1, 3)) if x != w}) or [READERS[0]]
        body = f"Hello, about the {rng.choice(TOPICS)}: " + " ".join(rng.choice(TOPICS) for _ in range(12)) + f" ({i})"
        out.append(f"From {w} Mon Jan  1 00:00:00 2024\nFrom: {w}\nTo: {', '.join(to[:-1] or to)}\n"
                   + (f"Cc: {to[-1]}\n" if len(to) > 1 else "")
                   + f"Subject: note {i}\nDate: Mon, 1 Jan 2024 10:{i % 60:02d}:00 +0000\n\n{body}\n\n")
    path.write_text("".join(out))
    return path


def _policy(tmp_path):
    doc = yaml.safe_load(stages.DEMO_POLICY.read_text())
    doc["spec"]["mechanism"] = "els"
    doc["spec"]["people"] = {"ownership": "all-participants"}
    doc["spec"]["training"].update(steps=3, expected_batch_size=8, seq_len=64, micro_batch_size=8)
    doc["spec"]["audit"].update(attacker_samples_per_user=2, holdout_users=0.1)
    doc["spec"]["audit"]["canaries"]["users"] = 0
    path = tmp_path / "owners.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_mail_with_recipients_from_ingest_to_ledger(settings, tmp_path):
    from components.modeling import build_base_model

    ingest_source(_mbox(tmp_path / "mail.mbox"), "mbox", settings=settings)
    base = build_base_model([f"public text about {t} and {u}" for t in TOPICS for u in TOPICS], tmp_path / "base",
                            vocab_size=300, n_layer=1, n_embd=16, n_head=2, n_positions=64, steps=2, seq_len=64,
                            batch_size=8, progress=False)
    planned = stages.plan(settings, _policy(tmp_path))
    plan = planned["plan"]
    assert plan["mechanism"] == "els-owners" and plan["ownership"]["ownership"] == "all-participants"
    res = stages.train(settings, planned["plan_path"], base, progress=False)
    cert = stages.certify(settings, planned["plan_path"], res)
    assert cert["neighbouring"] == "replace_owned_records_fixed_graph"
    eps, _ = recheck_guarantee(cert)
    assert eps <= 8.0 + 1e-9 and cert["delta"] <= 1e-5
    led = Ledger.open(settings)
    try:
        spend = led.spend(READERS + PEOPLE)
    finally:
        led.dispose()
    charged = {p for p, v in spend.items() if np.any(np.asarray(v) > 0)}
    assert charged & set(READERS), "a person who only receives mail is charged for the mail trained about them"
