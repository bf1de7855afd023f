"""Privacy accounting: a mechanism becomes (ε, δ), a target becomes σ.

    epsilon(mechanism, *, sampling_rate, noise_multiplier, steps, delta, k=1) -> EpsilonResult
    calibrate(mechanism, *, epsilon, delta, sampling_rate, steps, k=1, cache_dir=None) -> Calibration
    dp_event(mechanism, *, sampling_rate, noise_multiplier, steps, k=1) -> dp_accounting DpEvent

Mechanisms: record, uls, els, group-naive, group-tight (see `events`). Secrets (KL → posterior bound γ)
live in `components.accounting.secrets`; the slot for private prediction (PMixED) in `prediction`.
"""
from components.accounting.accountant import (
    DISCRETIZATIONS,
    LIBRARY_VERSION,
    REFERENCE_DISCRETIZATION,
    Calibration,
    EpsilonResult,
    calibrate,
    composed_pld,
    epsilon,
)
from components.accounting.events import MECHANISMS, dp_event, event_from_dict, event_to_dict

__all__ = [
    "epsilon",
    "calibrate",
    "composed_pld",
    "dp_event",
    "event_to_dict",
    "event_from_dict",
    "EpsilonResult",
    "Calibration",
    "MECHANISMS",
    "DISCRETIZATIONS",
    "REFERENCE_DISCRETIZATION",
    "LIBRARY_VERSION",
]
