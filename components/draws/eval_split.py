"""Reserve evaluation people before training: who the fine-tuned model is judged on (`veil evaluate`).

The same rule as the audit's holdout (components.draws.audit_split), and for the same reason —
every decision about one unit depends on that unit alone (docs/privacy/threat-model.md, neighbour
stability): a person is an *evaluation person* when an independent keyed draw
PRF(key, "evaluation", seed, user) falls below the policy's public `evaluation.fraction`. Their
records are never trained on and never audited; nothing else about anybody changes. The draw uses
its own PRF label, so it is independent of the holdout draw, and it runs before the audit split, so
evaluation people are disjoint from the audit's held-out people (and carry no attacker samples,
whose member/non-member labels would otherwise be wrong).

Per unit:
* **user units** (uls, els, group, filtered): the draw above, on the user id.
* **record units**: the same per-person draw. It keys on the user id alone — never on how many
  records the person has — so adding or removing a record moves only that record (into evaluation if
  its person is an evaluation person, else wherever the audit split puts it). Evaluating on unseen
  *people* also measures what a record-level model is for: text from people it never saw.
* **secret units**: the same per-person draw; a secret substitution changes no user id, so no
  decision moves. Evaluation people's records are deduplicated on the masked content.

Records are deduplicated by content within a person (a repeated message would weigh twice). The
evaluation people and their records are private: they live in the plan's annex only; the public
plan states the fraction and the rule.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from components.core.errors import VeilError
from components.draws.annex import prf_uniform, prf_uniform_column
from components.draws.columns import Texts, codes, sorted_strings, take, texts

EVAL_SCHEMA = pa.schema([("record_id", pa.string()), ("user_id", pa.string())])
RULE = ("per person: an independent keyed draw reserves each person for evaluation with probability "
        "`fraction`, before (and disjoint from) the audit's holdout; their records are never trained on")


@dataclass(frozen=True)
class EvalReservation:
    users: list[str]          # evaluation people, sorted
    records: pa.Table         # record_id, user_id: one per distinct content of each evaluation person


def is_evaluation_person(key: bytes, seed: int, user: str, fraction: float) -> bool:
    """The person's own evaluation draw: independent of every other person and of the holdout draw."""

    return fraction > 0 and prf_uniform(key, "evaluation", int(seed), user) < fraction


def check_fraction(fraction: float) -> float:
    f = float(fraction)
    if not 0 <= f < 1:
        raise VeilError(f"evaluation.fraction: {fraction!r} is not a probability below 1 (each person is drawn "
                        "into evaluation independently)")
    return f


def evaluation_draws(key: bytes, seed: int, people, fraction: float) -> np.ndarray:
    """`is_evaluation_person` for every id of `people` (an Arrow string array) at once: one keyed
    draw per person, exactly as the scalar function (annex.prf_uniform_column)."""
    if fraction <= 0 or len(people) == 0:
        return np.zeros(len(people), bool)
    return prf_uniform_column(key, "evaluation", int(seed), people) < fraction


def reservation_of(drawn: np.ndarray, people: pa.Array, pairs: Texts, record_id) -> EvalReservation:
    """The reservation of the people `drawn` (one flag per person code): one row per distinct content
    of each, named by its smallest record id, sorted by (record_id, user_id)."""
    g = np.flatnonzero(drawn[pairs.person])
    if len(g) == 0:
        return empty_reservation()
    table = pa.table([pairs.rep(record_id, g), take(people, pairs.person[g])], schema=EVAL_SCHEMA)
    table = table.sort_by([("record_id", "ascending"), ("user_id", "ascending")])
    return EvalReservation(users=sorted_strings(take(people, np.unique(pairs.person[g]))), records=table)


def reserve_evaluation(records: pa.Table, *, fraction: float, seed: int, key: bytes,
                       content: Sequence[str] | pa.Array | None = None) -> tuple[EvalReservation, np.ndarray]:
    """(the evaluation reservation, the row indices of `records` left for everything else, ascending).

    `records` has record_id, user_id (and text); `content` is what duplicates are judged by (default
    the text; masked texts for secret units). Columnar: one keyed draw per distinct person, the rows
    grouped by integer codes (components.draws.columns)."""
    fraction = check_fraction(fraction)
    person, people = codes(records.column("user_id"))
    pairs = texts(person, content if content is not None else records.column("text"), records.column("record_id"))
    drawn = evaluation_draws(key, seed, people, fraction)
    return reservation_of(drawn, people, pairs, records.column("record_id")), np.flatnonzero(~drawn[person])


def empty_reservation() -> EvalReservation:
    return EvalReservation(users=[], records=EVAL_SCHEMA.empty_table())


def evaluation_sections(fraction: float, reservation: EvalReservation, write) -> tuple[dict, dict]:
    """(public plan section, annex fields). `write(table, stem) -> (file name, sha256)` stores the
    evaluation records file beside the plan's other private files."""
    public = {"fraction": float(fraction), "split": RULE,
              "caveat": "metrics on evaluation people use their private text: they are not covered by the "
                        "certificate; publish them only with that caveat"}
    if not reservation.users:
        return public, {}
    name, sha = write(reservation.records, "eval")
    return public, {"eval_users": list(reservation.users), "eval_records_file": name, "eval_records_sha256": sha,
                    "evaluation_counts": {"n_eval_users": len(reservation.users),
                                          "n_eval_records": int(reservation.records.num_rows)}}
