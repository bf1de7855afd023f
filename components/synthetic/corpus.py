"""A synthetic corpus on disk: its files, its certificate section and seal, and the offline checks.

A corpus folder holds

    records.jsonl            one canonical JSON object per line: {"control_code", "index", "text"}
    records.parquet          the same rows (columns index, control_code, text)
    certificate.json         veil.certificate.synthetic/v1 (self-hashed, below)
    seal.json                veil.seal.synthetic/v1: Ed25519 over the certificate's sha256 and the
                             sha256 of both corpus files, of the model certificate and seal, of the prompts
    model_certificate.json   the model release's certificate the corpus inherits (as verified when
    model_seal.json          generating) and its seal: a consumer re-checks the whole chain offline

The certificate states no guarantee of its own: a corpus sampled from a DP model with public prompts
and public settings is post-processing of the model's release, so it carries that release's ε, δ and
privacy unit (`inherits`, copied from the model certificate and checked against it) and nothing else
is charged. Every file is 0600: VEIL_HOME is private whatever the corpus' own status.

A corpus drawn through a PMixED ensemble (`source: pmixed`, components/synthetic/pmixed.py) is part of
the transcript of private tokens that ensemble's certificate covers ("whoever asks"): it inherits that
certificate's ε, δ and unit, states the tokens it charged to the ensemble's budget, and sits beside the
PMixED certificate (`model_certificate.json`). That certificate is self-hashed, not signed, so there is no
`model_seal.json`: the corpus seal binds the PMixED certificate's sha256, and the check recomputes its ε
from its own parameters (`pmixed_epsilon`, independently of components.prediction).
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
from pathlib import Path
from typing import Any, Mapping

from components.certificate.document import verify_certificate
from components.certificate.seal import check_seal, make_seal
import numpy as np

from components.accounting.prediction import rdp_to_epsilon
from components.core.errors import VeilError
from components.core.hashing import canonical_json, sha256_file, sha256_json
from components.publication import publish
from components.certificate.verify import Verification, recheck_guarantee

CERT_SCHEMA = "veil.certificate.synthetic/v1"
FILES = {"jsonl": "records.jsonl", "parquet": "records.parquet", "certificate": "certificate.json",
         "seal": "seal.json", "model_certificate": "model_certificate.json", "model_seal": "model_seal.json"}
REQUIRED = ("schema", "created_at", "code_version", "model", "inherits", "generation", "corpus", "statement",
            "sha256")
PMIXED_SCHEMA = "veil.certificate.pmixed/v1"
PMIXED_STATEMENT = ("Every record was drawn through PMixED ensemble {name} version {version} (certificate {cert}…, "
                    "ensemble {eid}…) from public prompts{prompted}: {tokens} private tokens, each charged to the "
                    "ensemble's token budget before it was drawn. The corpus is part of the transcript that "
                    "release's guarantee covers ({unit}-level, {guarantee} over all {budget} private tokens the "
                    "ensemble may ever serve, whoever asks) and is post-processing of it; the ledger charged that "
                    "whole budget when the ensemble was built, and nothing more.")
STATEMENT = ("Every record was sampled from model {name} version {version} (certificate {cert}…) with public "
             "settings{prompted}, reading no private data: the corpus is post-processing of that release and "
             "inherits its guarantee ({unit}-level, {guarantee}). It is charged nothing more in the ledger.")


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def jsonl_bytes(records: list[dict]) -> bytes:
    return b"".join(canonical_json({"index": int(r["index"]), "control_code": r["control_code"],
                                    "text": r["text"]}) + b"\n" for r in records)


def records_table(records: list[dict]):
    import pyarrow as pa

    return pa.table({"index": pa.array([int(r["index"]) for r in records], pa.int64()),
                     "control_code": pa.array([r["control_code"] for r in records], pa.string()),
                     "text": pa.array([r["text"] for r in records], pa.string())})


def write_records(records: list[dict], out: Path) -> dict:
    """Write both corpus files (0600); return their sha256 and the record count."""
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    os.chmod(out, 0o700)
    _write_private(out / FILES["jsonl"], jsonl_bytes(records))
    pq_path = out / FILES["parquet"]
    _write_private(pq_path, b"")   # created 0600 before pyarrow writes into it
    pq.write_table(records_table(records), pq_path, compression="zstd")
    os.chmod(pq_path, 0o600)
    return {"sha256": sha256_file(out / FILES["jsonl"]), "parquet_sha256": sha256_file(pq_path),
            "records": len(records)}


def inherited(model_cert: Mapping[str, Any]) -> dict:
    """What a corpus inherits from the model certificate: its unit, relation, mechanism and guarantee."""
    out = {k: model_cert.get(k) for k in ("privacy_unit", "neighbouring", "mechanism", "epsilon", "delta")}
    secrets = {cls: {"max_gamma": c.get("max_gamma"), "kappa": c.get("kappa")}
               for cls, c in (model_cert.get("secrets") or {}).items()}
    if secrets:
        out["secrets"] = secrets
    return out


def _guarantee(inh: Mapping[str, Any]) -> str:
    if inh.get("epsilon") is not None:
        return f"ε={float(inh['epsilon']):.4g}, δ={float(inh['delta']):.3g}"
    return "per-class posterior bounds γ: " + ", ".join(f"{c} {float(v['max_gamma']):.4g}"
                                                        for c, v in sorted((inh.get("secrets") or {}).items()))


def build_certificate(*, model: Mapping[str, Any], model_cert: Mapping[str, Any], generation: Mapping[str, Any],
                      corpus: Mapping[str, Any], code_version: str, created_at: str | None = None) -> dict:
    """The corpus' certificate section (self-hashed). `model`: name, version, run_id, uri, ledger release."""
    inh = inherited(model_cert)
    prompted = generation.get("prompts") is not None
    body = {
        "schema": CERT_SCHEMA,
        "created_at": created_at or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "code_version": code_version,
        "model": {**dict(model), "certificate_sha256": model_cert["sha256"],
                  "certificate_schema": model_cert["schema"]},
        "inherits": inh,
        "generation": dict(generation),
        "corpus": {**dict(corpus), "format": ["jsonl", "parquet"], "columns": ["index", "control_code", "text"]},
        "statement": STATEMENT.format(name=model["name"], version=model["version"], cert=model_cert["sha256"][:12],
                                      prompted=" and public control codes" if prompted else " (unconditional)",
                                      unit=inh["privacy_unit"], guarantee=_guarantee(inh)),
    }
    return publish("synthetic.certificate", {**body, "sha256": sha256_json(body)})


def build_pmixed_certificate(*, model: Mapping[str, Any], pmixed_cert: Mapping[str, Any],
                             generation: Mapping[str, Any], corpus: Mapping[str, Any], tokens_charged: int,
                             code_version: str, created_at: str | None = None) -> dict:
    """The certificate of a corpus drawn through a PMixED ensemble. `model`: name, version, run_id, uri, the
    ledger release of the ensemble's build; `tokens_charged`: private tokens this corpus took from its budget."""

    if pmixed_cert.get("schema") != PMIXED_SCHEMA:
        raise VeilError(f"synthesize --pmixed: {model.get('uri')} is not a PMixED ensemble")
    inh = inherited(pmixed_cert)
    body = {
        "schema": CERT_SCHEMA,
        "source": "pmixed",
        "created_at": created_at or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "code_version": code_version,
        "model": {**dict(model), "ensemble_id": pmixed_cert["ensemble_id"],
                  "certificate_sha256": pmixed_cert["sha256"], "certificate_schema": pmixed_cert["schema"]},
        "inherits": inh,
        "tokens": {"charged": int(tokens_charged), "token_budget": int(pmixed_cert["token_budget"]),
                   "charging": "each private token durably counted in the ensemble's token budget before it was "
                               "drawn (the serving endpoint's counter); the records hold exactly the tokens charged"},
        "generation": dict(generation),
        "corpus": {**dict(corpus), "format": ["jsonl", "parquet"], "columns": ["index", "control_code", "text"]},
        "statement": PMIXED_STATEMENT.format(
            name=model["name"], version=model["version"], cert=pmixed_cert["sha256"][:12],
            eid=pmixed_cert["ensemble_id"][:12], tokens=int(tokens_charged),
            prompted=" and public control codes" if generation.get("prompts") is not None else " (unconditional)",
            unit=inh["privacy_unit"], guarantee=_guarantee(inh), budget=int(pmixed_cert["token_budget"])),
    }
    return publish("synthetic.pmixed.certificate", {**body, "sha256": sha256_json(body)})


def pmixed_epsilon(cert: Mapping[str, Any]) -> float:
    """ε of a PMixED certificate recomputed from its own parameters — written here apart from
    components.prediction.mechanism (a test checks the two agree): one token is pure-ε_tok-DP with
    ε_tok = log(1 − q + q(1 + e^{2r})/2) − log(1 − q + q e^{−r}); T tokens compose in RDP as
    T·min(ε_tok, α ε_tok²/2) on the certificate's orders; then the Balle et al. 2020 conversion at δ."""
    e = cert["ensemble"]
    q, r, t = float(e["subsample_rate"]), float(e["radius"]), int(cert["token_budget"])
    if not (0 < q <= 1) or not (r >= 0 and math.isfinite(r)) or t < 0:
        raise VeilError("PMixED certificate: subsample rate, radius or token budget out of range")
    if t == 0:
        return 0.0
    tok = math.log(1 - q + q * (1 + math.exp(2 * r)) / 2) - math.log(1 - q + q * math.exp(-r))
    orders = np.asarray(cert["per_token"]["orders"], dtype=float)
    return float(rdp_to_epsilon(orders, t * np.minimum(tok, orders * tok * tok / 2), float(cert["delta"]))[0])


def check_certificate(doc: Any) -> dict:
    if not isinstance(doc, Mapping) or doc.get("schema") != CERT_SCHEMA:
        raise VeilError(f"corpus certificate: not a {CERT_SCHEMA} document")
    missing = [k for k in REQUIRED if k not in doc]
    if missing:
        raise VeilError(f"corpus certificate: missing field(s) {', '.join(missing)}")
    actual = sha256_json({k: v for k, v in doc.items() if k != "sha256"})
    if actual != doc["sha256"]:
        raise VeilError(f"corpus certificate: sha256 mismatch (document says {str(doc['sha256'])[:12]}…, content "
                        f"hashes to {actual[:12]}…)")
    return dict(doc)


def bindings(corpus: Mapping[str, Any], model_cert: Mapping[str, Any], model_seal: Mapping[str, Any] | None,
             prompts_sha256: str | None) -> dict:
    """What the corpus seal signs beside its certificate. `model_seal` None: a PMixED source (self-hashed
    certificate, no seal of its own)."""
    return {"corpus_jsonl": corpus["sha256"], "corpus_parquet": corpus["parquet_sha256"],
            "model_certificate": model_cert["sha256"],
            "model_seal": None if model_seal is None else sha256_json(dict(model_seal)), "prompts": prompts_sha256}


def seal_corpus(out: Path, cert: Mapping[str, Any], model_cert: Mapping[str, Any],
                model_seal: Mapping[str, Any] | None, signing_key) -> dict:
    """Sign the certificate with the corpus files and the model release; write the four documents (0600;
    three for a PMixED source, whose certificate has no seal)."""
    prompts = (cert["generation"].get("prompts") or {}).get("sha256")
    seal = make_seal(cert, bindings(cert["corpus"], model_cert, model_seal, prompts), signing_key, kind="synthetic")
    for name, doc in (("certificate", cert), ("seal", seal), ("model_certificate", model_cert),
                      ("model_seal", model_seal)):
        if doc is not None:
            _write_private(out / FILES[name], json.dumps(doc, indent=2, sort_keys=True).encode())
    return seal


def corpus_files(root: Path) -> list[str]:
    """The corpus folder's files that exist (a PMixED-sourced corpus has no model_seal.json)."""
    return [n for n in FILES.values() if (Path(root) / n).is_file()]


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise VeilError(f"{what}: unreadable ({type(e).__name__})") from None


def _check_files(root: Path, cert: Mapping[str, Any], seal_b: Mapping[str, Any]):
    import pyarrow.parquet as pq

    c = cert["corpus"]
    jl, pqp = root / FILES["jsonl"], root / FILES["parquet"]
    for p in (jl, pqp):
        if not p.is_file():
            raise VeilError(f"{p.name}: missing")
    got_j, got_p = sha256_file(jl), sha256_file(pqp)
    if not (got_j == c.get("sha256") == seal_b.get("corpus_jsonl")):
        raise VeilError(f"{jl.name} hashes to {got_j[:12]}…, the sealed certificate says {str(c.get('sha256'))[:12]}…")
    if not (got_p == c.get("parquet_sha256") == seal_b.get("corpus_parquet")):
        raise VeilError(f"{pqp.name} hashes to {got_p[:12]}…, the sealed certificate says "
                        f"{str(c.get('parquet_sha256'))[:12]}…")
    try:
        table = pq.read_table(pqp, memory_map=False)
    except Exception as e:  # noqa: BLE001 - a garbled Parquet file is a failed check, named
        raise VeilError(f"{pqp.name}: unreadable Parquet ({type(e).__name__})") from None
    if jsonl_bytes(table.to_pylist()) != jl.read_bytes():
        raise VeilError(f"{pqp.name} and {jl.name} hold different records")
    if table.num_rows != c.get("records"):
        raise VeilError(f"the corpus has {table.num_rows} records, its certificate says {c.get('records')}")
    return table


def _check_model(root: Path, cert: Mapping[str, Any], seal_b: Mapping[str, Any], trusted) -> dict:
    mc = verify_certificate(_read_json(root / FILES["model_certificate"], "model certificate")).to_dict()
    ms = _read_json(root / FILES["model_seal"], "model seal")
    check_seal(ms, trusted)
    if ms.get("certificate_sha256") != mc["sha256"]:
        raise VeilError("the model seal is for another certificate than the model certificate beside it")
    if not (mc["sha256"] == cert["model"].get("certificate_sha256") == seal_b.get("model_certificate")):
        raise VeilError(f"the model certificate {mc['sha256'][:12]}… is not the one the corpus is sealed with")
    if sha256_json(ms) != seal_b.get("model_seal"):
        raise VeilError("the model seal beside the corpus is not the one it is sealed with")
    return mc


def _check_pmixed(root: Path, cert: Mapping[str, Any], seal_b: Mapping[str, Any]) -> dict:
    """The PMixED certificate beside the corpus: self-hash, schema, its ε recomputed, the one sealed; and the
    corpus' token facts consistent with it."""
    mc = _read_json(root / FILES["model_certificate"], "PMixED certificate")
    if not isinstance(mc, Mapping) or mc.get("schema") != PMIXED_SCHEMA:
        raise VeilError(f"the certificate beside the corpus is not a {PMIXED_SCHEMA} document")
    if sha256_json({k: v for k, v in mc.items() if k != "sha256"}) != mc.get("sha256"):
        raise VeilError("the PMixED certificate's sha256 does not match its contents")
    if (root / FILES["model_seal"]).exists() or seal_b.get("model_seal") is not None:
        raise VeilError("a PMixED-sourced corpus has no model seal; one is present or sealed")
    if not (mc["sha256"] == cert["model"].get("certificate_sha256") == seal_b.get("model_certificate")):
        raise VeilError(f"the PMixED certificate {mc['sha256'][:12]}… is not the one the corpus is sealed with")
    if mc.get("ensemble_id") != cert["model"].get("ensemble_id"):
        raise VeilError("the corpus names another ensemble than its PMixED certificate")
    tk = cert.get("tokens") or {}
    if tk.get("token_budget") != mc.get("token_budget") or not 0 <= int(tk.get("charged", -1)) <= int(mc["token_budget"]):
        raise VeilError("the corpus' token facts do not fit its PMixED certificate's budget")
    return dict(mc)


def _recheck_pmixed(mc: Mapping[str, Any]) -> tuple[float, None]:
    eps = pmixed_epsilon(mc)
    if abs(eps - float(mc["epsilon"])) > 1e-9 * max(1.0, eps):
        raise VeilError(f"the PMixED certificate says ε={float(mc['epsilon']):.9g}, its parameters give ε={eps:.9g}")
    return float(mc["epsilon"]), None


def verify_corpus_dir(root: str | Path, trusted: Mapping[str, Any]):
    """Every offline check of a corpus folder: (Verification, certificate or None, Arrow table or None).

    Named checks: `hash` (the corpus certificate's self-hash), `signature` (its seal, with a trusted key,
    for that certificate), `corpus` (both files hash to the sealed values and hold the same rows),
    `model_certificate` (the model certificate and seal beside it verify and are the sealed ones),
    `epsilon_recomputed` (the model's ε or γ recomputed from its own parameters), `inherits` (the
    corpus states exactly the model's guarantee), `prompts` (the sealed prompts hash is the stated one)."""

    root = Path(root)
    v = Verification()
    if not root.is_dir():
        v.record("hash", False, f"{root}: no such corpus folder")
        return v, None, None
    cert = v.run("hash", lambda: check_certificate(_read_json(root / FILES["certificate"], "corpus certificate")))
    seal = v.run("signature", _read_json, root / FILES["seal"], "corpus seal")
    if seal is not None:
        v.key_fingerprint = v.run("signature", check_seal, seal, trusted, kind="synthetic")
        if cert is not None:
            v.record("signature", seal.get("certificate_sha256") == cert["sha256"],
                     "the corpus seal is for another certificate")
    if cert is None or seal is None:
        for name in ("corpus", "model_certificate", "epsilon_recomputed", "inherits"):
            v.record(name, False, "no verified corpus certificate and seal to check against")
        return v, None, None
    b = seal.get("bindings") or {}
    table = v.run("corpus", _check_files, root, cert, b)
    pmixed = cert.get("source") == "pmixed"
    if cert.get("source", "model") not in ("model", "pmixed"):
        v.record("model_certificate", False, f"unknown corpus source {cert.get('source')!r}")
        mc = None
    elif pmixed:
        mc = v.run("model_certificate", _check_pmixed, root, cert, b)
    else:
        mc = v.run("model_certificate", _check_model, root, cert, b, trusted)
    if mc is not None:
        got = v.run("epsilon_recomputed", _recheck_pmixed if pmixed else recheck_guarantee, mc)
        if got is not None:
            v.epsilon, v.gamma = got
        v.record("inherits", cert.get("inherits") == inherited(mc),
                 "the corpus certificate's inherited guarantee is not the model certificate's")
    else:
        v.record("epsilon_recomputed", False, "no verified model certificate")
        v.record("inherits", False, "no verified model certificate")
    v.record("prompts", ((cert["generation"].get("prompts") or {}).get("sha256")) == b.get("prompts"),
             "the sealed prompts hash is not the certificate's")
    v.certificate_sha256 = cert["sha256"]
    v.certificate = cert
    return v, cert, table
