"""Who is a person: a policy's `spec.people` applied to a snapshot's records.

    records, report = apply_people(snap.records, policy.people())

- **exclude** — accounts that are not people (bots, service users) are dropped, with their records:
  globs on the account id (`user_id`) and on the author's name (`metadata.author_name` for git,
  `metadata.from_name` for mail), case-insensitive, where only `*` and `?` are special, so
  `*[bot]@*` means a literal "[bot]" (GitHub's bot addresses: `49699333+dependabot[bot]@users.noreply…`).
- **aliases** — each list is one person's identities; every record of any of them gets the first
  one as `user_id`, so a per-user bound covers the person, not each address. `record_id` is kept
  (it names the record's content, and spans point at it).

The report holds counts only (accounts, records, per pattern) — it is published with plans and
certificates, and which accounts were excluded or merged would say who is in the data. Each decision
depends on that account alone (its id and its name).

`likely_same_person(records)` lists names that appear under several account ids — what an operator
should look at before writing `aliases`; it names people, so it goes to `settings.private_dir`.
"""
from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from components.core.errors import VeilError

_NAME_SQL = ("coalesce(json_extract_string(metadata, '$.author_name'), "
             "json_extract_string(metadata, '$.from_name'))")


def _glob(pattern: str) -> re.Pattern:
    """`*` any run, `?` one character, everything else literal (brackets included); case-insensitive."""
    out = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern.strip())
    return re.compile(out, re.IGNORECASE | re.DOTALL)


def _people(people) -> dict:
    if people is None:
        return {"exclude": [], "aliases": [], "ownership": "author", "multi_owner_order": "fewest-owners"}
    if hasattr(people, "model_dump"):
        people = people.model_dump()
    return {"exclude": list(people.get("exclude") or []), "aliases": [list(a) for a in people.get("aliases") or []],
            "ownership": people.get("ownership", "author"),
            "multi_owner_order": people.get("multi_owner_order", "fewest-owners")}


def _accounts(records: pa.Table) -> list[tuple[str, list[str]]]:
    """(user_id, its distinct author names) for every account in `records`."""
    con = duckdb.connect()
    try:
        con.register("r", records.select(["user_id", "metadata"]))
        rows = con.sql(f"SELECT user_id, list(DISTINCT {_NAME_SQL}) FILTER (WHERE {_NAME_SQL} IS NOT NULL) "
                       "FROM r GROUP BY user_id ORDER BY user_id").fetchall()
    finally:
        con.close()
    return [(u, [n for n in (names or []) if n]) for u, names in rows]


def plan_accounts(records: pa.Table, people) -> tuple[dict[str, str | None], dict]:
    """user_id → the person's id (None: excluded), and the counts report."""
    p = _people(people)
    pats = [(x, _glob(x)) for x in p["exclude"]]
    alias = {}
    for group in p["aliases"]:
        canon = group[0].strip().lower()
        for a in group:
            alias[a.strip().lower()] = canon
    mapping: dict[str, str | None] = {}
    per_pattern = {x: 0 for x, _ in pats}
    for user, names in _accounts(records):
        hit = next((x for x, rx in pats if rx.fullmatch(user) or any(rx.fullmatch(n) for n in names)), None)
        if hit is not None:
            mapping[user] = None
            per_pattern[hit] += 1
        else:
            mapping[user] = alias.get(user.strip().lower(), user)
    report = {
        "accounts": len(mapping),
        "excluded_accounts": sum(1 for v in mapping.values() if v is None),
        "excluded_accounts_by_pattern": per_pattern,
        "merged_accounts": sum(1 for u, v in mapping.items() if v is not None and v != u),
        "people": len({v for v in mapping.values() if v is not None}),
        "ownership": p["ownership"],
    }
    return mapping, report


def _person_of(pid: str, pats, alias) -> str | None:
    """An identity that wrote nothing (a recipient): excluded by its id, else its alias or itself."""
    if any(rx.fullmatch(pid) for _, rx in pats):
        return None
    return alias.get(pid.strip().lower(), pid.strip().lower())


def owners_column(records: pa.Table, user_ids: pa.Array, people) -> tuple[pa.Array, dict]:
    """Each record's owners: its writer first, then (ownership 'all-participants') every To/Cc
    recipient in `metadata`, each mapped through aliases and exclusions like a writer. Bcc never
    reaches the catalog, so it never owns. Rows with a null writer (excluded) get null."""
    p = _people(people)
    authors = user_ids.to_pylist()
    if p["ownership"] != "all-participants":
        return pa.array([None if a is None else [a] for a in authors], pa.list_(pa.string())), \
            {"records_with_several_owners": 0}
    pats = [(x, _glob(x)) for x in p["exclude"]]
    alias = {a.strip().lower(): g[0].strip().lower() for g in p["aliases"] for a in g}
    con = duckdb.connect()
    try:
        con.register("r", pa.table({"i": pa.array(range(len(records)), pa.int64()),
                                    "metadata": records.column("metadata")}))
        rows = con.sql("""SELECT i, list_concat(
                coalesce(TRY_CAST(json_extract(metadata, '$.to') AS VARCHAR[]), []),
                coalesce(TRY_CAST(json_extract(metadata, '$.cc') AS VARCHAR[]), [])) AS who
            FROM r WHERE json_exists(metadata, '$.to') OR json_exists(metadata, '$.cc')""").fetchall()
    finally:
        con.close()
    owners: list = [None if a is None else [a] for a in authors]
    cache: dict[str, str | None] = {}
    several = 0
    for i, who in rows:
        if authors[i] is None or not who:
            continue
        extra = []
        for w in who:
            if w not in cache:
                cache[w] = _person_of(w, pats, alias)
            q = cache[w]
            if q is not None and q != authors[i] and q not in extra:
                extra.append(q)
        if extra:
            owners[i] = [authors[i]] + sorted(extra)
            several += 1
    return pa.array(owners, pa.list_(pa.string())), {"records_with_several_owners": several}


def apply_people(records: pa.Table, people) -> tuple[pa.Table, dict]:
    """`records` without excluded accounts and with aliases merged, an `owners` column (the writer,
    plus every To/Cc participant under ownership 'all-participants'), and a counts-only report
    (`excluded_records`, `excluded_accounts`, per pattern, `merged_accounts`, `people`,
    `records_with_several_owners`)."""
    mapping, report = plan_accounts(records, people)
    users = records.column("user_id")
    keys = pa.array(list(mapping.keys()), pa.string())
    vals = pa.array(list(mapping.values()), pa.string())
    idx = pc.index_in(users, value_set=keys)
    new_users = pc.take(vals, idx)
    keep = pc.is_valid(new_users)
    report["excluded_records"] = len(records) - (pc.sum(keep).as_py() or 0)
    report["records"] = len(records) - report["excluded_records"]
    new_users = new_users.cast(pa.string())
    owners, orep = owners_column(records, new_users.combine_chunks() if isinstance(new_users, pa.ChunkedArray)
                                 else new_users, people)
    report.update(orep)
    out = records.set_column(records.schema.get_field_index("user_id"), records.schema.field("user_id"), new_users)
    out = out.append_column("owners", owners).filter(keep)
    return out, report


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
