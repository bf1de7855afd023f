"""The one identity rule: which id strings are the same person (docs/privacy/identity.md).

    person_id("  Alice Smith <ALICE@Example.org>") == person_id("alice@example.org")

Ingest stores every record's `user_id` as `person_id(the source's user field)`; the planner maps every
account (and every To/Cc recipient, and every `people.aliases` entry) through it before aliases are
merged; the ledger's pseudonym is an HMAC of it; PMixED's partition hashes it. So the catalog, the
planner and the ledger count the same people: before this rule each had its own (the catalog none, the
planner `strip().lower()` on aliases only, the ledger NFKC + casefold), and a name written in two
capitalisations was two people to the planner and one to the ledger, which refused the release.

The rule depends on the id string alone and is deterministic (no locale, no table that changes):

1. the ledger's earlier rule, `legacy_person_id`: Unicode NFKC (full-width 'Ａ' → 'A', the ligature
   'ﬁ' → 'fi', a non-breaking space → a space), surrounding whitespace trimmed, Unicode case folding
   ('ß' and 'SS' → 'ss', 'Σ'/'ς'/'σ' → 'σ');
2. then, until nothing changes (a few rounds at most): NFKC; format characters removed (Unicode
   category Cf: zero-width space/joiners, the BOM, soft hyphens, bidirectional controls — invisible,
   so two ids that differ only by them look identical to every person reading them); case folding;
   every run of whitespace made one space, none at either end; an RFC 5322 angle address
   `Display Name <a@b>` (or a bare `<a@b>`) becomes its address; `mailto:a@b` becomes `a@b`.

What it never does: drop dots or `+tags` from an e-mail's local part, map one domain to another, or
guess from display names — those can make two different people one (`j.smith@` and `jsmith@` are
often two people). Merges of that kind are the governance team's, written as `people.aliases`.

Because step 2 starts from step 1's output, two ids the earlier rule made one person are one person
under this rule too (it only merges more, never splits), and an id that was already in its plain form
(a bare, lower-case address, as every built-in connector writes) keeps exactly its earlier form — so
its ledger pseudonym is unchanged. An id whose form does change (a display name around an address, a
doubled space, a zero-width character) is linked in the ledger to its earlier pseudonym before any
charge (`Ledger.link_identities`): a rule change never gives anyone a fresh budget.
"""
from __future__ import annotations

import re
import unicodedata

from components.core.errors import VeilError

RULE = "veil.identity/v2"
# A record's display name (git author, mail sender, Debian maintainer), for the exclusion globs and the
# likely-duplicates report; SQL over the catalog's `metadata` JSON. Here, not in the planner's package,
# so that ingest can read it without importing the planner.
NAME_SQL = ("coalesce(json_extract_string(metadata, '$.author_name'), "
            "json_extract_string(metadata, '$.from_name'))")
# Every code point (alone, doubled, between letters) settles after one changing round (checked once over
# all of Unicode; tests/core/test_identity.py checks a sample): a bound, not a tuning.
_ROUNDS = 8

# `Display Name <local@domain>` / `<local@domain>`: the whole id, an address with one '@' and no
# whitespace or brackets inside the angle brackets. Anything else (two addresses, text after '>') stays.
_ANGLE = re.compile(r"^[^<>]*<\s*([^<>\s@]+@[^<>\s@]+)\s*>$")
_MAILTO = re.compile(r"^mailto:([^<>\s@?]+@[^<>\s@?]+)$")


def legacy_person_id(raw) -> str:
    """The ledger's rule before `RULE` (NFKC, trimmed, case-folded): kept to find pseudonyms charged
    under it (components.ledger.keys.legacy_person_key) and as step 1 of `person_id`."""
    if raw is None:
        raise VeilError("a person id is missing (None)")
    return unicodedata.normalize("NFKC", str(raw)).strip().casefold()


def _round(s: str) -> str:
    if not s.isascii():     # ASCII is NFKC already and holds no format character: skip both (speed only)
        s = unicodedata.normalize("NFKC", s)
        s = "".join(c for c in s if unicodedata.category(c) != "Cf")
    s = " ".join(s.casefold().split())
    m = _ANGLE.match(s)
    if m:
        s = m.group(1)
    m = _MAILTO.match(s)
    if m:
        s = m.group(1)
    return s


# Printable ASCII without space, '<' or '>': NFKC leaves it alone, it has no format character, no
# whitespace to trim or fold and no angle address, so the rule only lower-cases it (ASCII case folding) —
# unless it is a `mailto:` form. The fast path of `person_id_or_empty` (speed only: a ledger prices 10⁶
# ids per release; tests/core/test_identity.py checks it against the full rule).
_PLAIN = re.compile(r"[!-;=?-~]+\Z")


def person_id_or_empty(raw) -> str:
    """`person_id`, or '' for an id that is nothing once the rule has run (blank, or only invisible
    characters): ingest quarantines those as a missing user."""
    if type(raw) is str and _PLAIN.match(raw):
        s = raw.lower()
        if not s.startswith("mailto:"):
            return s
    s = legacy_person_id(raw)
    for _ in range(_ROUNDS):
        t = _round(s)
        if t == s:
            break
        s = t
    return s


def person_id(raw) -> str:
    """The person an id string names, under `RULE` (the module docstring). Idempotent."""
    s = person_id_or_empty(raw)
    if not s:
        raise VeilError(f"person id {str(raw)[:60]!r} is empty once case, spacing and invisible characters "
                        "are normalised")
    return s


def same_person(a, b) -> bool:
    return person_id_or_empty(a) == person_id_or_empty(b) != ""
