"""What a certificate promises, in plain language (`veil verify`): who is protected, by how much, and
what the audit found. Every value comes from the certificate itself (public by construction) and the
ε/γ that verification recomputed; nothing here is a new number."""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any
from components.mechanisms.base import population_epsilon
from components.mechanisms import get as get_mechanism

_UNIT = {
    "user": "each person (everything one person contributed, all of their records together)",
    "record": "each single record (a message or document) — not a whole person: someone with many records is "
              "protected less than the figure says",
    "secret": "each tagged secret (a credential, address or codename), per class — not the people who wrote them",
    "owner": "the content of every record a person is on (sent or received)",
}
_RELATION = {
    "add_remove_user": "adding or removing one person's data",
    "replace_one_user": "replacing one person's data with anyone else's",
    "add_remove_record": "adding or removing one record",
    "secret_substitution": "replacing one secret by another candidate of its class",
}


def promises(cert: Mapping[str, Any], *, epsilon: float | None = None,
             gamma: Mapping[str, float] | None = None) -> list[str]:
    """Plain sentences, most important first. `epsilon`/`gamma`: the values verification recomputed
    (preferred over the certificate's own statement)."""

    lines: list[str] = []
    unit = cert.get("privacy_unit")
    relation = cert.get("neighbouring")
    mech = cert.get("mechanism")
    if unit == "record" and relation == "none" or mech == "nonprivate":
        return ["This model has no privacy guarantee: it was not trained with differential privacy."]
    who = _UNIT.get(str(unit), f"each {unit}")
    lines.append(f"Who is protected: {who}.")
    eps = epsilon if epsilon is not None else cert.get("epsilon")
    delta = cert.get("delta")
    if eps is not None and delta is not None:
        change = _RELATION.get(str(relation), f"a change under the relation {relation!r}")
        odds = math.exp(float(eps))
        lines.append(
            f"How much: ε = {float(eps):.4g}, δ = {float(delta):g}. Whatever anyone does with the model, "
            f"{change} changes the probability of any outcome by a factor of at most e^ε ≈ {odds:.3g}, "
            f"plus at most δ.")
        if unit == "user":
            lines.append("In practice: someone who sees the model (and anything else) can be only so sure whether a "
                         "given person's data was used to train it; the smaller ε, the closer to a coin toss.")
    if gamma:
        kappas = {c: s.get("kappa") for c, s in (cert.get("secrets") or {}).items() if isinstance(s, Mapping)}
        for cls, g in sorted(gamma.items()):
            prior = f" from a prior of at most κ = {float(kappas[cls]):g}" if kappas.get(cls) is not None else ""
            lines.append(f"Secrets of class {cls}: an attacker who sees the model reconstructs one with probability "
                         f"at most γ = {float(g):.3g}{prior}.")
    try:
        coverage = get_mechanism(mech).coverage(cert) if mech else None
    except Exception:  # noqa: BLE001 - an unknown mechanism is reported by verification itself
        coverage = None
    if coverage:
        lines.append(f"Coverage: {coverage}.")

    if population_epsilon(cert):
        lines.append("The number of people trained is itself private: ε includes the noisy count's share.")
    aud = cert.get("audit")
    if aud:
        verdict = aud.get("verdict") or ("passed" if aud.get("passed") else "failed")
        what = {"passed": "found no more leakage than the guarantee allows",
                "failed": "found more leakage than the policy accepts",
                "inconclusive": "could not decide (too few people or candidates to measure)"}.get(str(verdict).lower(),
                                                                                               str(verdict))
        lines.append(f"Audit: {str(verdict).upper()} — an attack on the released model {what}. "
                     "The audit is evidence, not part of the guarantee.")
    else:
        lines.append("Audit: none recorded on this certificate.")
    return lines
