"""Privacy mechanisms as registered objects: one module per mechanism, one interface (`base.Mechanism`).

    from components.mechanisms import get
    mech = get(plan["mechanism"])          # uls, els, els-owners, group, record, secret, uls-filtered, nonprivate
    mech.bound(ctx, train) / mech.calibrate(ctx, bounded)        planning
    mech.unit_rates(...) / mech.batch_mode(spec) / mech.make_step(...)   the engine
    mech.certify(plan, result, ...) / mech.recompute_epsilon(doc)      the certificate
    mech.user_pld(cert)                                               the audit's ceiling
    mech.ledger_costs(plan, rates, orders)                            the lifetime ledger

`auto` (components.mechanisms.auto) chooses among the registered user-level mechanisms.
"""
from components.mechanisms.base import (
    Bounded,
    Calibrated,
    Mechanism,
    PlainStep,
    PlanContext,
    get,
    names,
    register,
    unregister,
)

# The built-in mechanisms register themselves on import, in this order (the policy schema lists
# them so).
from components.mechanisms import uls, uls_filtered, els, els_owners, group, record, secret, nonprivate, pmixed  # noqa: E402,F401,I001

__all__ = ["Bounded", "Calibrated", "Mechanism", "PlainStep", "PlanContext", "get", "names", "register",
           "unregister"]
