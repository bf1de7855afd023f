"""Who is a person: a policy's `spec.people` applied to a snapshot's records (pure: Arrow in, Arrow out).

    records, report = apply_people(snap.records, policy.people())
    public, annex = people_sections(report)

- **exclude** — accounts that are not people (bots, service users) are dropped, with their records:
  globs on the account id (`user_id`) and on the author's name (`metadata.author_name` for git,
  `metadata.from_name` for mail), case-insensitive, where only `*` and `?` are special, so
  `*[bot]@*` means a literal "[bot]" (GitHub's bot addresses: `49699333+dependabot[bot]@users.noreply…`).
- **identity** — every account id is first mapped through the one identity rule
  (`components.core.identity.person_id`: case, spacing, Unicode form, e-mail address form), the rule
  ingest stores ids under and the ledger keys pseudonyms by: a snapshot cut before ingest applied it
  (whose ids may be `Alice` and `alice`) is planned as the same people as one cut after.
- **aliases** — each list is one person's identities (each entry under the identity rule too); every
  record of any of them gets the first one as `user_id`, so a per-user bound covers the person, not
  each address. `record_id` is kept (it names the record's content, and spans point at it).
- **owners** — an `owners` list column: the writer, plus every To/Cc participant under ownership
  `all-participants` (`components.bounding.owners` bounds each owner's records).

Each decision depends on that account alone (its id and its name). The report holds counts only;
`people_sections` splits it into what a public plan may say and what only the annex may hold
(see its docstring for why).
"""
from __future__ import annotations

import re

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from components.core.identity import NAME_SQL, person_id_or_empty

_NAME_SQL = NAME_SQL


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


def _alias_map(p: dict) -> dict[str, str]:
    """identity-rule form of every alias entry → the person id of its list's first entry."""
    out: dict[str, str] = {}
    for group in p["aliases"]:
        canon = person_id_or_empty(group[0]) or str(group[0])
        for a in group:
            out[person_id_or_empty(a) or str(a)] = canon
    return out


def _person_or_self(user: str) -> str:
    # an id that is nothing under the rule (a snapshot from before ingest quarantined those) keeps its
    # own spelling rather than becoming '' — and the ledger refuses it by name-free message
    return person_id_or_empty(user) or user


def plan_accounts(records: pa.Table, people) -> tuple[dict[str, str | None], dict]:
    """user_id → the person's id (None: excluded), and the counts report. An account's person is its id
    under the identity rule, then its alias list's first entry."""
    p = _people(people)
    pats = [(x, _glob(x)) for x in p["exclude"]]
    alias = _alias_map(p)
    mapping: dict[str, str | None] = {}
    per_pattern = {x: 0 for x, _ in pats}
    for user, names in _accounts(records):
        hit = next((x for x, rx in pats if rx.fullmatch(user) or any(rx.fullmatch(n) for n in names)), None)
        if hit is not None:
            mapping[user] = None
            per_pattern[hit] += 1
        else:
            own = _person_or_self(user)
            mapping[user] = alias.get(own, own)
    report = {
        "accounts": len(mapping),
        "excluded_accounts": sum(1 for v in mapping.values() if v is None),
        "excluded_accounts_by_pattern": per_pattern,
        "merged_accounts": sum(1 for u, v in mapping.items() if v is not None and v != u),
        "people": len({v for v in mapping.values() if v is not None}),
        "ownership": p["ownership"],
        "multi_owner_order": p["multi_owner_order"],
    }
    return mapping, report


def person_accounts(records: pa.Table, people, mapping: dict[str, str | None] | None = None) -> dict[str, list[str]]:
    """person id → every account id that is this person: the records' `user_id`s mapped to them, the
    spellings ingest kept in `metadata.account` (the source's own, before the identity rule), and the
    person's `people.aliases` entries. What the ledger links to the person before charging
    (`Ledger.link_identities`), so that what any of them was charged under an earlier rule still
    counts. Private: it names people."""
    p = _people(people)
    if mapping is None:
        mapping, _ = plan_accounts(records, people)
    out: dict[str, set[str]] = {}
    for user, person in mapping.items():
        if person is not None:
            out.setdefault(person, set()).add(user)
    if "metadata" in records.column_names:
        con = duckdb.connect()
        try:
            con.register("r", records.select(["user_id", "metadata"]))
            rows = con.sql("SELECT DISTINCT user_id, json_extract_string(metadata, '$.account') AS a FROM r "
                           "WHERE json_extract_string(metadata, '$.account') IS NOT NULL").fetchall()
        finally:
            con.close()
        for user, acct in rows:
            person = mapping.get(user)
            if person is not None:
                out.setdefault(person, set()).add(acct)
    alias = _alias_map(p)
    for group in p["aliases"]:
        person = alias[person_id_or_empty(group[0]) or str(group[0])]
        if person in out:
            out[person].update(str(a) for a in group)
    return {k: sorted(v) for k, v in out.items()}


def canonical_records(records: pa.Table) -> pa.Table:
    """`records` with every `user_id` under the identity rule — the same table when nothing changes (a
    snapshot ingest cut under the rule): what planning reads when the policy has no people section."""
    users = records.column("user_id")
    distinct = pc.unique(users).to_pylist()
    changed = {u: _person_or_self(u) for u in distinct if u is not None and _person_or_self(u) != u}
    if not changed:
        return records
    keys = pa.array(list(changed), pa.string())
    vals = pa.array(list(changed.values()), pa.string())
    idx = pc.index_in(users, value_set=keys)
    new = pc.if_else(pc.is_valid(idx), pc.take(vals, pc.fill_null(idx, 0)), users)
    i = records.schema.get_field_index("user_id")
    return records.set_column(i, records.schema.field("user_id"), new)


def _person_of(pid: str, pats, alias) -> str | None:
    """An identity that wrote nothing (a recipient): excluded by its id, else its alias or itself."""
    if any(rx.fullmatch(pid) for _, rx in pats):
        return None
    own = _person_or_self(pid)
    return alias.get(own, own)


def owners_column(records: pa.Table, user_ids: pa.Array, people,
                  mapping: dict[str, str | None] | None = None) -> tuple[pa.Array, dict]:
    """Each record's owners: its writer first, then (ownership 'all-participants') every To/Cc
    recipient in `metadata`, each mapped through aliases and exclusions like a writer. Bcc never
    reaches the catalog, so it never owns. Rows with a null writer (excluded) get null.
    `mapping` (account → person, from `plan_accounts`): a recipient who is also a writer gets the
    writer's person id whatever the case of the address — one person, one budget."""
    p = _people(people)
    authors = user_ids.to_pylist()
    if p["ownership"] != "all-participants":
        return pa.array([None if a is None else [a] for a in authors], pa.list_(pa.string())), \
            {"records_with_several_owners": 0}
    pats = [(x, _glob(x)) for x in p["exclude"]]
    alias = _alias_map(p)
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
    known = {_person_or_self(acct): person for acct, person in (mapping or {}).items()}
    cache: dict[str, str | None] = {}
    several = 0
    for i, who in rows:
        if authors[i] is None or not who:
            continue
        extra = []
        for w in who:
            if w not in cache:
                lw = _person_or_self(w)
                cache[w] = known[lw] if lw in known else _person_of(w, pats, alias)
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
                                 else new_users, people, mapping)
    report.update(orep)
    out = records.set_column(records.schema.get_field_index("user_id"), records.schema.field("user_id"), new_users)
    out = out.append_column("owners", owners).filter(keep)
    return out, report


def people_sections(report: dict) -> tuple[dict, dict]:
    """(public, annex) parts of an `apply_people` report.

    Public — the rule and what it removed of **non-persons**: the number of excluded accounts, per
    pattern, and their records. Each exclusion depends on that account alone and an excluded account
    is, by the policy, not a person: adding or removing a person (an account no pattern matches)
    leaves these counts unchanged, so they carry nothing about any protected unit (sensitivity 0
    under the person-level relation; a test checks it).
    Annex only — everything that counts persons: accounts, people, merged identities (which alias
    ids actually occur says which listed people are in the data), records kept, records with several
    owners. Publishing them would need their own noise and budget; the plan's N̂ already is the one
    noisy count of persons.
    """
    public = {
        "ownership": report.get("ownership", "author"),
        "excluded_accounts": int(report.get("excluded_accounts", 0)),
        "excluded_accounts_by_pattern": {str(k): int(v) for k, v in
                                         (report.get("excluded_accounts_by_pattern") or {}).items()},
        "excluded_records": int(report.get("excluded_records", 0)),
        "not_published": "accounts, people, merged identities and records per person are counts of persons: "
                         "in the private annex only",
    }
    if report.get("ownership") == "all-participants":
        public["multi_owner_order"] = report.get("multi_owner_order", "fewest-owners")
    annex = {
        "n_accounts": int(report.get("accounts", 0)),
        "n_people": int(report.get("people", 0)),
        "n_merged_accounts": int(report.get("merged_accounts", 0)),
        "n_people_records": int(report.get("records", 0)),
        "n_records_several_owners": int(report.get("records_with_several_owners", 0)),
    }
    return public, annex


def people_for_plan(records: pa.Table, people) -> tuple[pa.Table, dict, dict]:
    """What planning reads: `records` with the policy's people section applied (bots out, aliases
    merged into one `user_id` per person), and the report split into its public and annex parts.
    The `owners` column is kept only under ownership 'all-participants'."""
    out, report = apply_people(records, people)
    if report.get("ownership") != "all-participants":
        out = out.drop_columns(["owners"])
    public, annex = people_sections(report)
    return out, public, annex
