"""Verify a sealed release: named checks over the certificate, its seal and the files it speaks for.

Every load path runs these (the pyfunc's `load_context`, `registry.load_model`, `veil verify`,
`veil models`); a release is valid only when every check it ran passes. Checks:

| check | passes when |
|---|---|
| `hash` | each certificate's content hashes to its `sha256` (and the registry points at that hash) |
| `signature` | each seal verifies with a key in the trust store and names that certificate's sha256 |
| `epsilon_recomputed` | ε (or every class' γ) recomputed from the certificate's own parameters with the project's accountant matches the certificate within the accountant's tolerance |
| `weights` / `base_model` / `tokenizer` | the canonical directory hashes of the files that will be loaded equal the sealed ones |
| `plan` | the plan file hashes to the sealed hash, is self-consistent, and is the certificate's plan (its audit thresholds are inside) |
| `policy` | seal, certificate and plan name the same policy sha256 |
| `code` | the package's `code/components` is the sealed copy and `python_model.pkl` names only the pyfunc class |
| `embedded_matches_registered` | the registered certificate is the model's embedded one, or that one plus exactly an audit section with `supersedes` = its hash |
| `tags` / `metrics` | the registry's `privacy.*`/`audit.*` tags and privacy metrics say what the certificate says |

Only pure functions over documents and paths live here; reading MLflow is `components.registry`.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from components.core.errors import VeilError
from components.core.hashing import model_dir_hashes, not_cache, sha256_dir, sha256_json

# Relative tolerance on a recomputed ε: the accountant's documented agreement between its two finest
# discretization grids (components.accounting.accountant.AGREEMENT). The accountant is deterministic,
# so on the same library version the recomputation matches exactly; the tolerance absorbs a
# different dp-accounting build, never a different mechanism, σ, q or step count.
from components.accounting.accountant import AGREEMENT as EPSILON_RTOL  # noqa: E402

GAMMA_RTOL = 1e-9   # γ = gamma_from_kl(T · KL_step, κ) is closed-form up to bisection round-off
# A certificate's ε, KL and γ are the accountant's rounded UP to canonical.EPSILON_DIGITS significant
# digits (components.core.canonical: the same figures on every CPU). So a stated figure may exceed
# the recomputed one by that rounding (at most one unit in its last digit, PUBLISHED_RTOL), or for ε by
# the grids' agreement on another dp-accounting build; it may fall BELOW the recomputed one only by
# the last-bit differences between CPUs (LAST_BITS_RTOL — inside the accountant's own 1e-7 allowance
# already added to every ε). Anything lower states less privacy loss than the parameters give.
from components.core.canonical import EPSILON_DIGITS  # noqa: E402
from components.accounting.secrets import gamma_from_kl
from components.certificate.document import recompute_epsilon, verify_certificate
from components.certificate.seal import check_seal
from components.mechanisms import get as get_mechanism

PUBLISHED_RTOL = 10.0 ** (1 - EPSILON_DIGITS)
LAST_BITS_RTOL = 1e-9


class ReleaseInvalid(VeilError):
    """A release failed verification: refused with one line naming the check and why."""


@dataclass
class Verification:
    """Named checks (True = passed), why each failure failed, and the recomputed guarantee."""

    checks: dict[str, bool] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    epsilon: float | None = None
    gamma: dict[str, float] | None = None
    certificate_sha256: str | None = None
    key_fingerprint: str | None = None
    notes: list[str] = field(default_factory=list)
    certificate: dict | None = field(default=None, repr=False)   # the registered (or embedded) document checked

    def record(self, name: str, ok: bool, reason: str | None = None) -> bool:
        # A check run twice (embedded and registered) passes only if both runs pass.
        self.checks[name] = self.checks.get(name, True) and bool(ok)
        if not ok and name not in self.reasons:
            self.reasons[name] = reason or f"{name} check failed"
        return bool(ok)

    def run(self, name: str, fn, *args, **kwargs) -> Any:
        """Run `fn`; a VeilError it raises fails `name` with its message."""
        try:
            out = fn(*args, **kwargs)
        except VeilError as e:
            self.record(name, False, str(e))
            return None
        self.record(name, True)
        return out

    @property
    def valid(self) -> bool:
        return bool(self.checks) and all(self.checks.values())

    @property
    def reason(self) -> str | None:
        if self.valid:
            return None
        name = next((n for n, ok in self.checks.items() if not ok), None)
        return f"{name}: {self.reasons.get(name, 'failed')}" if name else "no checks ran"

    def to_dict(self) -> dict:
        return {"valid": self.valid, "checks": dict(self.checks), "epsilon": self.epsilon, "gamma": self.gamma,
                "reason": self.reason, "certificate_sha256": self.certificate_sha256,
                "key_fingerprint": self.key_fingerprint, "notes": list(self.notes)}

    def raise_if_invalid(self, what: str) -> None:
        if not self.valid:
            raise ReleaseInvalid(f"{what} refused: {self.reason}")


# --- the guarantee, recomputed ---------------------------------------------------------------------

def recheck_guarantee(cert: Mapping[str, Any]) -> tuple[float | None, dict | None]:
    """Recompute ε (or each secret class' γ) from the certificate's own parameters; raise on a mismatch.

    Returns (ε, None) or (None, {class: γ}): the certificate's ε once checked against the recomputed
    one; each class' recomputed γ. A certificate whose stated numbers are not what its
    mechanism, σ, q and steps give — ε edited, or steps edited beside an unchanged ε — is refused.
    """

    mech = get_mechanism(cert.get("mechanism"))
    if cert.get("privacy_unit") != mech.privacy_unit or cert.get("neighbouring") != mech.neighbouring:
        raise VeilError(f"certificate says privacy unit {cert.get('privacy_unit')!r} under "
                        f"{cert.get('neighbouring')!r}, but mechanism {mech.name!r} protects "
                        f"{mech.privacy_unit!r} under {mech.neighbouring!r}")
    if not mech.has_epsilon:
        return None, _recheck_secrets(cert)
    try:
        eps = _cached_epsilon(cert, recompute_epsilon)
    except (KeyError, TypeError, ValueError) as e:
        raise VeilError(f"certificate parameters are incomplete or malformed ({type(e).__name__}: {e})") from None
    stated = cert.get("epsilon")
    if not isinstance(stated, (int, float)) or not math.isfinite(float(stated)):
        raise VeilError(f"certificate ε={stated!r} is not a number")
    if float(stated) < eps * (1 - LAST_BITS_RTOL) - 1e-12:
        raise VeilError(f"certificate says ε={float(stated):.9g}, below what its parameters (σ={cert['noise_multiplier']}, "
                        f"q={cert['sampling_rate']}, steps={cert['steps']}, δ={cert['delta']}) give ε={eps:.9g}: "
                        "an understatement")
    if float(stated) > eps * (1 + EPSILON_RTOL + PUBLISHED_RTOL) + 1e-9:
        raise VeilError(f"certificate says ε={float(stated):.6g} but its parameters (σ={cert['noise_multiplier']}, "
                        f"q={cert['sampling_rate']}, steps={cert['steps']}, δ={cert['delta']}) give ε={eps:.6g}")
    target = (cert.get("target") or {}).get("epsilon")
    expect = mech.within_target(cert, float(stated))
    if expect is not None and "within_target" in cert:
        if bool(cert["within_target"]) != expect:
            raise VeilError(f"certificate says within_target={cert['within_target']} for ε={float(stated):.6g} "
                            f"against target ε={target}")
    # the certificate's own figure, now checked not to understate the recomputed one (it is that one
    # rounded up): the number a reader of the certificate sees
    return float(stated), None


def _coverage(cert: Mapping[str, Any]) -> str | None:
    """What the certificate's guarantee covers, from its mechanism (not from the document: a forged
    sentence would otherwise be repeated as verified)."""

    try:
        return get_mechanism(cert.get("mechanism")).coverage(cert)
    except VeilError:
        return None


_EPSILON_CACHE: dict[str, float] = {}
_ACCOUNTED = ("mechanism", "privacy_unit", "accountant", "sampling_rate", "noise_multiplier", "steps", "delta",
              "contribution_bound", "filter", "group_guarantee")


def _cached_epsilon(cert: Mapping[str, Any], compute) -> float:
    """ε for the certificate's accounting parameters, memoised in this process (one load path runs
    the check on the embedded and the registered certificate: the same parameters)."""
    key = sha256_json({k: cert.get(k) for k in _ACCOUNTED})
    if key not in _EPSILON_CACHE:
        if len(_EPSILON_CACHE) > 1024:
            _EPSILON_CACHE.clear()
        _EPSILON_CACHE[key] = compute(cert)
    return _EPSILON_CACHE[key]


def _recheck_secrets(cert: Mapping[str, Any]) -> dict[str, float]:
    steps = int(cert["steps"])
    out = {}
    for cls, c in (cert.get("secrets") or {}).items():
        if "max_kl_per_step" not in c:
            raise VeilError(f"secret class {cls}: certificate has no per-step KL, so γ cannot be recomputed "
                            "from its steps (certificate predates sealing)")
        kl = steps * float(c["max_kl_per_step"])
        if abs(kl - float(c["max_kl"])) > 1e-9 * max(kl, 1e-300):
            raise VeilError(f"secret class {cls}: max_kl={c['max_kl']} is not steps × per-step KL = {kl:.6g}")
        gamma = gamma_from_kl(kl, float(c["kappa"]))
        stated_gamma = float(c["max_gamma"])
        if stated_gamma < gamma * (1 - GAMMA_RTOL) or stated_gamma > gamma * (1 + PUBLISHED_RTOL) + 1e-300:
            raise VeilError(f"secret class {cls}: certificate says γ={c['max_gamma']} but KL {kl:.6g} at "
                            f"κ={c['kappa']} gives γ={gamma:.6g}")
        if bool(c.get("all_within_target")) and gamma > float(c["gamma_target"]) * (1 + GAMMA_RTOL):
            raise VeilError(f"secret class {cls}: γ={gamma:.6g} is above its target {c['gamma_target']} "
                            "but the certificate says it is within")
        out[cls] = stated_gamma     # checked: never below the recomputed γ (the certificate's figure)
    if not out:
        raise VeilError("secret certificate lists no secret classes")
    return out


# --- artifacts -------------------------------------------------------------------------------------

def artifact_bindings(*, weights_dir: str | Path | None, base_model_dir: str | Path, plan: Mapping[str, Any],
                      ledger_entry: str | None = None, code_dir: str | Path | None = None) -> dict:
    """What a seal binds, computed from the files being released (see components.core.hashing).

    `code_dir` is the `components/` package that travels in the model as MLflow `code_paths`."""
    base = model_dir_hashes(base_model_dir)
    return {"weights": sha256_dir(weights_dir) if weights_dir else None,
            "base_model": base["model"], "tokenizer": base["tokenizer"],
            "plan": sha256_json(dict(plan)), "policy": (plan.get("policy") or {}).get("sha256"),
            "ledger_entry": ledger_entry, "code": sha256_dir(code_dir, include=not_cache) if code_dir else None}


# The only classes a Veil model's python_model.pkl may name: the pyfunc itself and MLflow's type-hint
# holder. Anything else (a REDUCE, another global) is code a registry writer slipped in.
PICKLE_GLOBALS = {("components.registry.pyfunc_model", "VeilCausalLM"), ("mlflow.models.signature", "_TypeHints")}
_PICKLE_FORBIDDEN = {"REDUCE", "INST", "OBJ", "NEWOBJ_EX", "EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID",
                     "GET", "BINGET", "LONG_BINGET", "DUP"}
_PICKLE_STRINGS = {"SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8", "STRING", "BINSTRING",
                   "SHORT_BINSTRING"}


def check_package_code(root: Path, sealed: str | None) -> None:
    """The package's code is the sealed `components/` and its pickle names only the pyfunc class.

    Meaningful when run by an installed Veil before loading (`veil verify`, `load_model`): code
    inside a package cannot vouch for itself once it runs.
    """
    import pickletools

    import yaml

    try:
        flavor = (yaml.safe_load((root / "MLmodel").read_text()) or {})["flavors"]["python_function"]
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        raise VeilError("MLmodel has no python_function flavor") from None
    # What MLflow runs on load: its own loader, our pickle, and the code folder added to sys.path.
    if flavor.get("loader_module") != "mlflow.pyfunc.model" or flavor.get("python_model") != "python_model.pkl":
        raise VeilError(f"MLmodel loads through {flavor.get('loader_module')!r}/{flavor.get('python_model')!r}, "
                        "not MLflow's PythonModel loader")
    extra = sorted(p.name for p in (root / "code").iterdir() if p.name != "components") \
        if (root / "code").is_dir() else []
    if flavor.get("code") not in ("code", None) or extra:
        raise VeilError(f"the package carries code besides the sealed components/: {', '.join(extra) or flavor.get('code')}")
    code = root / "code" / "components"
    actual = sha256_dir(code, include=not_cache) if code.is_dir() else None
    if actual != sealed:
        raise VeilError(f"the package's code/components hashes to {str(actual)[:12]}…, the seal says {str(sealed)[:12]}…")
    pkl = root / "python_model.pkl"
    # The two operations right before STACK_GLOBAL must push the (module, name) strings themselves,
    # so what the check reads is what the unpickler would import (memo tricks cannot swap them).
    recent: list[tuple[str, Any]] = []
    try:
        for op, arg, _ in pickletools.genops(pkl.read_bytes()):
            if op.name in _PICKLE_FORBIDDEN:
                raise VeilError(f"python_model.pkl uses {op.name}: not a Veil model pickle")
            if op.name in ("MEMOIZE", "FRAME", "PROTO"):
                continue
            if op.name in ("STACK_GLOBAL", "GLOBAL"):
                if op.name == "GLOBAL":
                    name = tuple(str(arg).split(" ", 1))
                elif len(recent) >= 2 and all(k in _PICKLE_STRINGS for k, _ in recent[-2:]):
                    name = (str(recent[-2][1]), str(recent[-1][1]))
                else:
                    name = ("<computed>", "<computed>")
                if name not in PICKLE_GLOBALS:
                    raise VeilError(f"python_model.pkl imports {'.'.join(name)}: not a Veil model pickle")
            recent.append((op.name, arg))
    except (OSError, ValueError) as e:
        raise VeilError(f"python_model.pkl unreadable ({type(e).__name__})") from None


def certified_artifacts_mismatch(cert: Mapping[str, Any], bindings: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Where the certificate's own `run` section (the hashes training recorded) names other
    weights, base model or tokenizer than the seal binds: [(check, why)]."""
    run = cert.get("run") or {}
    out = []
    for name in ("weights", "base_model", "tokenizer"):
        certified = (run.get(name) or {}).get("sha256") if isinstance(run.get(name), Mapping) else None
        if certified is not None and certified != bindings.get(name):
            out.append((name, f"the certificate was issued for {name} {certified[:12]}…, the seal binds "
                              f"{str(bindings.get(name))[:12]}…"))
    return out


def check_plan(plan: Any, cert: Mapping[str, Any], sealed: str | None) -> None:
    if not isinstance(plan, Mapping):
        raise VeilError("the plan is not a JSON object")
    if sha256_json(dict(plan)) != sealed:
        raise VeilError("the plan file is not the sealed one (edited after sealing: e.g. its audit thresholds)")
    body = {k: v for k, v in plan.items() if k != "sha256"}
    if sha256_json(body) != plan.get("sha256"):
        raise VeilError("the plan's content does not hash to its sha256")
    if plan.get("sha256") != cert.get("plan_sha256"):
        raise VeilError("not the plan the certificate was issued for")


def check_policy(plan: Mapping[str, Any] | None, cert: Mapping[str, Any], sealed: str | None) -> None:
    names = {"seal": sealed, "certificate": (cert.get("policy") or {}).get("sha256")}
    if plan is not None:
        names["plan"] = (plan.get("policy") or {}).get("sha256")
    if len(set(names.values())) != 1 or sealed is None:
        raise VeilError("policy sha256 differs between " + ", ".join(f"{k} {str(v)[:12]}" for k, v in names.items()))


def check_amendment(registered: Mapping[str, Any], embedded: Mapping[str, Any]) -> None:
    """The registered certificate is the embedded one, or that one with an audit section added.

    An audit amends a release after its model package was written (and the package is immutable), so
    the registry may point at a newer certificate: it must say `supersedes` = the embedded hash and
    differ from it in nothing but `audit`, `supersedes` and its own hash.
    """
    if registered.get("sha256") == embedded.get("sha256"):
        return
    if registered.get("supersedes") != embedded.get("sha256"):
        raise VeilError(f"registered certificate {str(registered.get('sha256'))[:12]}… neither is nor supersedes "
                        f"the model's embedded {str(embedded.get('sha256'))[:12]}…")
    if embedded.get("audit") is not None or "supersedes" in embedded:
        raise VeilError("the model's embedded certificate must be the pre-audit one")
    amend = {"sha256", "audit", "supersedes"}
    a = {k: v for k, v in registered.items() if k not in amend}
    b = {k: v for k, v in embedded.items() if k not in amend}
    diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    if diff:
        raise VeilError(f"registered certificate differs from the embedded one beyond its audit: {', '.join(diff)}")
    if not isinstance(registered.get("audit"), Mapping):
        raise VeilError("registered certificate supersedes the embedded one without an audit section")


def _hash_check(v: Verification, name: str, sealed: str | None, actual: str | None, what: str) -> None:
    v.record(name, sealed == actual, f"{what} hashes to {str(actual)[:12]}…, the seal says {str(sealed)[:12]}…")


def _read_json(path: str | Path, what: str) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise VeilError(f"{what}: unreadable ({type(e).__name__})") from None


def verify_package(artifacts: Mapping[str, str], trusted: Mapping[str, Any],
                   v: Verification | None = None) -> tuple[Verification, dict | None, dict | None]:
    """Check a model package's files: embedded certificate, seal, weights, base, tokenizer, plan.

    `artifacts` maps the pyfunc's artifact names to local paths (`certificate`, `seal`, `plan`,
    `base_model`, and `adapter` or `model` for fine-tuned weights). Returns (verification, certificate, seal).
    """

    v = v or Verification()
    cert = seal = None
    if "certificate" not in artifacts:
        v.record("hash", False, "the model package lists no certificate artifact")
        return v, None, None
    doc = v.run("hash", lambda: verify_certificate(_read_json(artifacts["certificate"], "embedded certificate")))
    if doc is not None:
        cert = doc.to_dict()
    if "seal" not in artifacts:
        v.record("signature", False, "the model package has no seal (registered before sealing)")
    else:
        seal = v.run("signature", lambda: _read_json(artifacts["seal"], "embedded seal"))
        if seal is not None:
            v.key_fingerprint = v.run("signature", check_seal, seal, trusted)
            if cert is not None:
                v.record("signature", seal.get("certificate_sha256") == cert["sha256"],
                         "the embedded seal is for another certificate")
    missing = [k for k in ("certificate", "plan", "base_model") if k not in artifacts]
    if missing:   # an MLmodel edited to drop artifacts: nothing else can be checked
        for name in ("hash", "plan", "base_model"):
            v.record(name, False, f"the model package lists no {', '.join(missing)} artifact")
        return v, None, None
    b = (seal or {}).get("bindings") or {}
    weights = artifacts.get("adapter") or artifacts.get("model")
    _hash_check(v, "weights", b.get("weights"), sha256_dir(weights) if weights else None, "the adapter/model weights")
    base = model_dir_hashes(artifacts["base_model"])
    _hash_check(v, "base_model", b.get("base_model"), base["model"], "the base model")
    _hash_check(v, "tokenizer", b.get("tokenizer"), base["tokenizer"], "the tokenizer")
    if cert is not None:
        for name, why in certified_artifacts_mismatch(cert, b):
            v.record(name, False, why)
    root = Path(artifacts["certificate"]).parent.parent   # MLflow copies artifacts to <package>/artifacts/
    if (root / "MLmodel").is_file():
        v.run("code", check_package_code, root, b.get("code"))
    plan = v.run("plan", _read_json, artifacts["plan"], "embedded plan")
    if cert is not None:
        if plan is not None:
            v.run("plan", check_plan, plan, cert, b.get("plan"))
        v.run("policy", check_policy, plan, cert, b.get("policy"))
        got = v.run("epsilon_recomputed", recheck_guarantee, cert)
        if got is not None:
            v.epsilon, v.gamma = got
        said = _coverage(cert)
        if said:
            v.notes.append(f"guarantee: {said}")
        v.certificate_sha256 = cert["sha256"]
        v.certificate = cert
    else:
        for name in ("plan", "policy", "epsilon_recomputed"):
            v.record(name, False, "no verified certificate to check against")
    return v, cert, seal
