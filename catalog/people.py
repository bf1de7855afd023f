"""Who is a person, catalog side: `likely_same_person(records)` lists names that appear under several
account ids — what an operator should look at before writing a policy's `people.aliases`; it names
people, so it goes to `settings.private_dir`.

Applying `spec.people` (exclude, aliases, owners) is pure and lives in `components.planning.people`,
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
# The pure part lives in components (planning applies it); re-exported for the catalog's callers.
from components.planning.people import (_NAME_SQL, _people, apply_people, owners_column,  # noqa: F401
                                        people_sections, plan_accounts)

def _name_key(name: str) -> str:
    s = unicodedata.normalize("NFKD", name)
    s = "".join(c for c in s if not unicodedata.combining(c))
    return " ".join(re.sub(r"[^a-z0-9]+", " ", s.lower()).split())


def likely_same_person(records: pa.Table | str | Path) -> list[dict]:
    """Names (author / sender display names) that appear under several account ids: likely one
    person with several addresses. One-word names ("root", "admin") are left out: too common to mean
    one person. Input: a records table or a records.parquet path."""
    con = duckdb.connect()
    try:
        if isinstance(records, pa.Table):
            con.register("r", records.select(["user_id", "metadata"]))
            src = "r"
        else:
            src = "read_parquet('" + str(records).replace("'", "''") + "')"
        rows = con.sql(f"SELECT DISTINCT user_id, {_NAME_SQL} AS name FROM {src} WHERE {_NAME_SQL} IS NOT NULL").fetchall()
    finally:
        con.close()
    groups: dict[str, set[str]] = {}
    for user, name in rows:
        key = _name_key(name)
        if len(key.split()) >= 2:
            groups.setdefault(key, set()).add(user)
    return [{"name": k, "user_ids": sorted(v)} for k, v in sorted(groups.items()) if len(v) > 1]


def write_likely_duplicates(private_dir: Path, found: list[dict], source: str) -> Path | None:
    if not found:
        return None
    d = Path(private_dir) / "people"
    d.mkdir(parents=True, exist_ok=True)
    p = d / "likely-duplicates.json"
    p.write_text(json.dumps({"source": source, "likely_same_person": found}, indent=2, ensure_ascii=False) + "\n")
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
        from components.policy import load_policy

        policy = load_policy(policy)
    if not hasattr(policy, "spec"):
        raise VeilError("people: expected a policy")
    return _people(policy.spec.people)
