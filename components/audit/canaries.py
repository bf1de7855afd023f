"""Synthetic canary users (seed 003, App. D.2, Algorithm 1) and their report.

A canary user is an ordinary-looking user whose every record carries the same substring s, inserted at
a random word boundary: the worst realistic case for user inference (a signature, a pet phrase). The
plan splits canaries into injected (trained) and held-out ones like real users and reserves attacker
records for both; the audit reports their user-inference AUROC apart from real users, and each
substring's exposure: prompted with the words before it in an attacker record, how s ranks among random
word sequences of the same length from the same vocabulary.

Here s is drawn from a fixed word list rather than cut from a real user's text (Algorithm 1 does
that): a drawn s has a known candidate space, which is what makes its exposure well defined, and no
real person's text is copied into a synthetic user. The substring is the canary's secret: it is kept in
the records' `metadata` (catalog-private) and never in a report.
"""
from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from components.audit.exposure import Draw, Shape, SecretProbe
from components.core.errors import VeilError
from components.core.hashing import sha256_bytes
from components.draws.annex import prf_seed

CANARY_DOMAIN = "canary.veil.invalid"  # .invalid: can never collide with a real address

# Plain, common words: canary text should not stand out by vocabulary, only by repetition.
VOCAB = tuple("""
able about above across after again against almost along already also always among another answer
anything around away back because become before began begin behind being below better between beyond
black blue body book both bring brought build built busy call came care carry case cause certain change
city clear close cold color come common complete could country course cover cross current dark data
deep different direction doing done door down draw during each early earth east easy enough even
evening every example face fact family far fast field figure final find fine fire first follow food
form forward found free friend front full game garden general give glass good green ground group grow
half hand happen hard head hear heart heavy help here high hold home hope hour house idea inside
island just keep kind king know land large last late later learn leave left letter level light line
list little live long look made main make many mark market matter mean measure middle might mind
minute model moment money month more morning most mountain move much music name near need never next
night north note nothing notice number object ocean office often open order other outside page paper
part pass past pattern people perhaps period person picture piece place plan plant play point power
present problem produce question quick quiet rain reach read ready real reason record region remember
rest river road rock room round rule same school science season second seem sense service several
shape short show side simple since single size small snow soft some sound south space special spring
square stand start state station step still stone story street strong study summer table take talk
than third those though thought three through time today together told toward town tree true turn
under unit until upon usual valley very voice wait walk warm watch water week weight west where while
white whole wide wind window winter without wood word work world year young
""".split())


def canary_shape(words: int) -> Shape:
    return Shape((Draw(VOCAB, words, " "),))


def _insert(text: str, s: str, rng: np.random.Generator) -> str:
    words = text.split(" ")
    at = int(rng.integers(0, len(words) + 1))
    return " ".join(words[:at] + [s] + words[at:])


def _filler(rng: np.random.Generator, n: int) -> str:
    return " ".join(VOCAB[int(i)] for i in rng.integers(len(VOCAB), size=n))


def make_canary_users(n: int, records_per_user: int, seed: int, *, texts: Sequence[str] | None = None,
                      substring_words: int = 10, source: str = "canary", prefixes: Sequence[str] | None = None,
                      key: bytes | None = None) -> pa.Table:
    """Records of `n` canary users with `records_per_user` records each, to inject at plan time.

    Base texts are drawn (without replacement within a user) from `texts` (e.g. the public corpus) or,
    when none are given, generated from the word list. Returns the snapshot record schema: record_id
    (sha256 of user and text), user_id (`canary-NNN@canary.veil.invalid`), text, source, created_at
    (null), metadata (JSON with `canary: true` and the substring — catalog-private).

    `prefixes` (echo canaries, "The Canary's Echo", ICML 2025): public in-distribution openings. Each
    record is then one of them (drawn without replacement within the user) followed by the substring —
    an in-distribution prefix the sampler reaches on its own, then a high-perplexity suffix only
    memorisation can continue. The draws use `key` (the plan's key; required here): with the public
    seed alone anyone could compute the suffixes, and a corpus could carry them without any leak.
    """
    if n < 0 or records_per_user < 1 or substring_words < 1:
        raise VeilError(f"canaries: need n >= 0, records_per_user >= 1, substring_words >= 1; got "
                        f"{n}, {records_per_user}, {substring_words}")
    pool = [t for t in (texts or []) if t and t.strip()]
    if texts is not None and len(pool) < records_per_user:
        raise VeilError(f"canaries: {len(pool)} usable base texts, need at least records_per_user={records_per_user}")
    heads = list(prefixes or [])
    if heads:
        if key is None:
            raise VeilError("canaries: echo canaries (prefixes) are drawn with the plan's key; none was given")
        if len(set(heads)) < records_per_user:
            raise VeilError(f"canaries: {len(set(heads))} distinct prefixes, need at least "
                            f"records_per_user={records_per_user}")
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), *prf_seed(key, "echo-canaries")]))
    else:
        rng = np.random.default_rng([seed, 3])
    shape = canary_shape(substring_words)
    rows = []
    for i in range(n):
        user = f"canary-{i:03d}@{CANARY_DOMAIN}"
        s = shape.sample(rng)
        if heads:
            texts_i = [heads[int(j)].rstrip() + " " + s
                       for j in rng.choice(len(heads), size=records_per_user, replace=False)]
        else:
            if pool:
                base = [pool[int(j)] for j in rng.choice(len(pool), size=records_per_user, replace=False)]
            else:
                base = [_filler(rng, int(rng.integers(12, 40))) for _ in range(records_per_user)]
            texts_i = [_insert(b, s, rng) for b in base]
        for text in texts_i:
            rows.append({"record_id": sha256_bytes(f"{user}\x00{text}".encode()), "user_id": user, "text": text,
                         "source": source, "created_at": None,
                         "metadata": json.dumps({"canary": True, "substring": s}, sort_keys=True)})
    schema = pa.schema([("record_id", pa.string()), ("user_id", pa.string()), ("text", pa.string()),
                        ("source", pa.string()), ("created_at", pa.timestamp("us", tz="UTC")),
                        ("metadata", pa.string())])
    return pa.Table.from_pylist(rows, schema=schema)


def is_canary(user_id: str) -> bool:
    return user_id.endswith("@" + CANARY_DOMAIN)


def canary_substring(metadata: str | None) -> str | None:
    try:
        m = json.loads(metadata) if metadata else {}
    except (TypeError, ValueError):
        return None
    return m.get("substring") if isinstance(m, dict) and m.get("canary") else None


def canary_probes(records: pa.Table, prompt_words: int = 2) -> list[tuple[str, SecretProbe]]:
    """One exposure probe per canary user: prompt = the record's text up to the substring plus the
    substring's first `prompt_words` words; continuation = the rest of the substring."""
    out, seen = [], set()
    meta = records["metadata"].to_pylist() if "metadata" in records.column_names else [None] * records.num_rows
    for rid, user, text, md in zip(records["record_id"].to_pylist(), records["user_id"].to_pylist(),
                                   records["text"].to_pylist(), meta):
        s = canary_substring(md)
        if s is None or user in seen or s not in text:
            continue
        words = s.split(" ")
        k = min(prompt_words, len(words) - 1)
        if k < 1:
            continue
        head, rest = " ".join(words[:k]), " " + " ".join(words[k:])
        ctx = text[:text.index(s)] + head
        seen.add(user)
        shape = Shape((" ", Draw(VOCAB, len(words) - k, " ")))
        out.append((user, SecretProbe(f"canary:{user}", "canary", rest, ctx, shape)))
    return out
