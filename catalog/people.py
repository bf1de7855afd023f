"""Who is a person, catalog side: `likely_same_person(records)` lists names that appear under several
account ids — what an operator should look at before writing a policy's `people.aliases` — and
`identity_merges(records)` the people whose records came under several spellings that the one identity
rule (components.core.identity) made one id. Both name people, so they go to `settings.private_dir`
(people/likely-duplicates.json, 0600); ingest's summary shows only their counts, to the operator.

Applying `spec.people` (exclude, aliases, owners) is pure and lives in `components.bounding.people`,
which planning uses; it is re-exported here for the catalog's callers.
"""
from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path

import duckdb
import pyarrow as pa

from components.core.errors import VeilError
from components.core.identity import RULE, person_id_or_empty, NAME_SQL as _NAME_SQL
from components.policy import load_policy
from components.bounding import people as _planning_people
from components.bounding.people import _alias_map, _glob, _people, _person_or_self

# The pure part lives in components (planning applies it); re-exported for the catalog's callers, on
# first use: importing the planner's package costs seconds (scipy), which ingest — the likely-duplicates
# report below — has no need of.
_REEXPORTED = ("_people", "apply_people", "owners_column", "people_sections", "plan_accounts")


def __getattr__(name: str):
    if name in _REEXPORTED:
        return getattr(_planning_people, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# A display name: the author's or sender's (git, mail, Debian), else the one in the source's own
# spelling of the user (`metadata.account`, kept by ingest), e.g. "Ann Lee" of `"Ann Lee" <ann@x>`.
_ANY_NAME_SQL = (f"coalesce({_NAME_SQL}, nullif(trim(regexp_extract(json_extract_string(metadata, '$.account'), "
                 "'^([^<>]*)<', 1), ' \"'), ''))")


def _name_key(name: str) -> str:
    s = unicodedata.normalize("NFKD", name)
    s = "".join(c for c in s if not unicodedata.combining(c))
    return " ".join(re.sub(r"[^a-z0-9]+", " ", s.lower()).split())


def _rows(records: pa.Table | str | Path) -> list[tuple]:
    """Distinct (user_id, the source's spelling of it, display name) of a records table or parquet path:
    one scan for both reports."""
    con = duckdb.connect()
    try:
        if isinstance(records, pa.Table):
            con.register("r", records.select(["user_id", "metadata"]))
            src = "r"
        else:
            src = "read_parquet('" + str(records).replace("'", "''") + "')"
        # JSON is parsed only where a substring test says the key may be there (most records: no key)
        return con.sql(f"""SELECT DISTINCT user_id,
            CASE WHEN metadata LIKE '%"account"%'
                 THEN coalesce(json_extract_string(metadata, '$.account'), user_id) ELSE user_id END,
            CASE WHEN metadata LIKE '%_name"%' OR metadata LIKE '%"account"%' THEN {_ANY_NAME_SQL} END
            FROM {src}""").fetchall()
    finally:
        con.close()


def _persons(rows: list[tuple]) -> dict[str, str]:
    return {u: person_id_or_empty(u) or u for u in {r[0] for r in rows}}


def likely_same_person(records: pa.Table | str | Path, *, _scanned: list[tuple] | None = None,
                       _person: dict[str, str] | None = None) -> list[dict]:
    """Names (author / sender display names, or the display name of a `Name <address>` user field) that
    appear under several account ids: likely one person with several addresses. One-word names
    ("root", "admin") are left out: too common to mean one person. Ids are compared as persons (the
    identity rule): ids the rule already made one are not listed. Input: a records table or a
    records.parquet path."""
    rows = _rows(records) if _scanned is None else _scanned
    person = _persons(rows) if _person is None else _person
    groups: dict[str, set[str]] = {}
    for user, _spelling, name in rows:
        if name is None:
            continue
        key = _name_key(name)
        if len(key.split()) >= 2:
            groups.setdefault(key, set()).add(person[user])
    return [{"name": k, "user_ids": sorted(v)} for k, v in sorted(groups.items()) if len(v) > 1]


def identity_merges(records: pa.Table | str | Path, *, _scanned: list[tuple] | None = None,
                    _person: dict[str, str] | None = None) -> list[dict]:
    """People whose records came under two or more spellings that the identity rule made one id: the
    source's own spelling (ingest keeps it in `metadata.account` where the rule changed it) or, in a
    catalog holding records ingested before the rule, user ids that are one person under it. Not a
    problem to fix — one person, one budget — but a merge the operator should be able to see (e.g.
    'Straße@…' and 'strasse@…' are one id). Input: a records table or a records.parquet path."""
    rows = _rows(records) if _scanned is None else _scanned
    person = _persons(rows) if _person is None else _person
    groups: dict[str, set[str]] = {}
    for user, spelling, _name in rows:
        groups.setdefault(person[user], set()).add(spelling)
    return [{"person_id": k, "spellings": sorted(v)} for k, v in sorted(groups.items()) if len(v) > 1]


def likely_duplicates(records: pa.Table | str | Path) -> tuple[list[dict], list[dict]]:
    """(likely_same_person, identity_merges) from one scan of `records`."""
    rows = _rows(records)
    person = _persons(rows)
    return (likely_same_person(records, _scanned=rows, _person=person),
            identity_merges(records, _scanned=rows, _person=person))


def unsettled_by_policy(found: list[dict], people) -> list[dict]:
    """`found` (likely_same_person) less the names the policy's `people` section already settles: ids that
    its aliases make one person, or that it excludes (exclusion globs on ids only here; names are matched
    when planning). Ingest under a policy that merged them must not ask the operator to merge them again."""

    p = load_people(people)
    alias = _alias_map(p)
    pats = [_glob(x) for x in p["exclude"]]
    out = []
    for g in found:
        persons = {alias.get(_person_or_self(u), _person_or_self(u)) for u in g["user_ids"]
                   if not any(rx.fullmatch(u) for rx in pats)}
        if len(persons) > 1:
            out.append(g)
    return out


def write_likely_duplicates(private_dir: Path, found: list[dict], source: str,
                            merged: list[dict] | None = None) -> Path | None:
    """people/likely-duplicates.json (0600): names under several ids (`found`, for the operator to decide
    on with `people.aliases`) and spellings the identity rule merged (`merged`, informational)."""
    if not found and not merged:
        return None
    d = Path(private_dir) / "people"
    d.mkdir(parents=True, exist_ok=True)
    p = d / "likely-duplicates.json"
    doc = {"source": source, "likely_same_person": found, "merged_by_identity_rule": merged or [],
           "identity_rule": RULE,
           "what_to_do": "names under several ids: if one person, list their ids as one entry of the policy's "
                         "spec.people.aliases; spellings merged by the identity rule are one person already"}
    p.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    try:
        p.chmod(0o600)
    except OSError:  # pragma: no cover - filesystems without modes
        pass
    return p


def load_people(policy) -> dict:
    """The people section of a policy (a Policy, a path, or None)."""

    if policy is None:
        return _people(None)
    if isinstance(policy, (str, Path)):
        policy = load_policy(policy)
    if not hasattr(policy, "spec"):
        raise VeilError("people: expected a policy")
    return _people(policy.spec.people)
