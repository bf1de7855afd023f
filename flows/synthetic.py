"""`veil synthesize`: a synthetic corpus from a registered model — generate, scan, certify, record, register.

Generation is `components.synthetic` (model + public prompts + public settings; it reads no data). The
secret scan needs the catalog's detectors, which `components` may not import, so it lives here: every
record passes the same RE2 detectors ingest tags with (`catalog.tagging.Tagger`: the built-in detectors,
or a policy's tagging rules with `--policy`); matches are counted per class — published: a function of
the corpus, itself post-processing of the DP release — and the matched records (index, class, detector,
span) are written only to `VEIL_HOME/private/synthetic/<id>/scan.jsonl` (0600).
"""
from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from catalog.tagging import Tagger
from components.certificate import code_version
from components.certificate.seal import load_signing_key
from components.core.errors import VeilError
from components.core.progress import progress as bar, step
from components.core.settings import Settings
from components.publication import publish
from components.synthetic import generate_records, load_prompts, Sampling
from components.synthetic.corpus import build_certificate, seal_corpus, write_records, FILES, build_pmixed_certificate
from components.audit.echo import echo_audit, echo_canaries, private_json, public_section
from components.audit.inputs import audit_reservations
from components.audit.run import canary_records_table, resolve_thresholds
from components.draws.annex import load_annex
from components.planning.plan import load_plan
from components.policy import load_policy
from components.prediction.release import open_ensemble, resolve
from components.registry.mlflow_registry import _client, _resolve_version
from components.registry.synthetic import load_synthetic, model_release, record_echo_audit, register_synthetic
from components.synthetic.pmixed import SAMPLER, check_budget, generate_pmixed_records

# Every detector the catalog ships, each its own class, except `high_entropy` (opt-in at ingest too:
# its false positives on ordinary text would drown the count).
SCAN_RULES = [
    {"secret_class": "credential", "kind": "detector", "patterns": ["credentials"], "case_sensitive": True},
    {"secret_class": "email", "kind": "detector", "patterns": ["email"], "case_sensitive": False},
    {"secret_class": "phone", "kind": "detector", "patterns": ["phone"], "case_sensitive": True},
    {"secret_class": "payment_card", "kind": "detector", "patterns": ["payment_card"], "case_sensitive": True},
    {"secret_class": "iban", "kind": "detector", "patterns": ["iban"], "case_sensitive": True},
    {"secret_class": "national_id", "kind": "detector", "patterns": ["national_id"], "case_sensitive": True},
]


def scan_records(records: list[dict], rules: Any = None, *, tagger=None) -> tuple[dict[str, int], list[dict]]:
    """(records matched per class — every class of the rules, zeros included —, the private match list).

    `rules`: tagging rules (a policy path or a list), default SCAN_RULES. A record counts once per class
    however many spans of that class it holds."""
    import pyarrow as pa

    tagger = tagger or Tagger(SCAN_RULES if rules is None else rules)
    classes = sorted({r["secret_class"] for r in tagger.rules})
    spans = tagger.tag(pa.array([r["text"] for r in records], pa.string())) if records else []
    hit: dict[str, set[int]] = {c: set() for c in classes}
    matches = []
    for s in spans:
        hit.setdefault(s.secret_class, set()).add(s.row)
        matches.append({"index": int(records[s.row]["index"]), "secret_class": s.secret_class,
                        "detector": s.detector, "start": int(s.start), "end": int(s.end),
                        "match": records[s.row]["text"][s.start:s.end]})
    return {c: len(rows) for c, rows in hit.items()}, matches


def _move_into_place(tmp: Path, root: Path, cert: dict) -> Path:
    """The sealed corpus folder, renamed from its staging folder to its id (the certificate's sha256
    prefix); a folder of the same id — the same corpus sealed again — is replaced."""
    final = root / cert["sha256"][:16]
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    return final


def _write_private_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n")


def synthesize(settings: Settings, model_uri: str, *, records: int, prompts_path: str | Path | None = None,
               seed: int = 0, max_new_tokens: int = 64, temperature: float = 1.0, top_p: float = 1.0,
               policy: str | Path | None = None, register: bool = True, progress: bool = True) -> dict:
    """Generate, scan, certify and seal, record in the ledger, register. Returns the operator's document
    (`public`: what `--json` prints, through the gate; `private`: the scan file's path)."""

    # Every input is checked before the model is loaded (one line, exit 2): prompts, settings, rules.
    prompts = load_prompts(prompts_path) if prompts_path else None
    sampling = Sampling(records=records, seed=seed, max_new_tokens=max_new_tokens, temperature=temperature,
                        top_p=top_p)
    sampling.check()
    if policy is not None and not Path(policy).is_file():
        raise VeilError(f"--policy {policy}: no such policy file")

    tagger = Tagger(SCAN_RULES if policy is None else str(policy))

    _refuse_pmixed_without_flag(settings, model_uri)
    with step(f"loading and verifying {model_uri}", on=progress):
        loaded, model_seal = model_release(settings, model_uri)
    with bar("synthesize", records, on=progress) as advance:
        done = [0]

        def tick(n: int) -> None:
            advance(n - done[0])
            done[0] = n
        recs = generate_records(loaded.model, loaded.tokenizer, sampling, prompts, progress=tick)
    counts, matches = scan_records(recs, tagger=tagger)
    # the records leave (corpus files, MLflow artifacts): each leaf is declared (post-processing of the weights)
    publish("synthetic.records", {"records": recs})

    root = Path(settings.home) / "synthetic"
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    tmp = root / f".tmp-{uuid.uuid4().hex}"
    try:
        corpus = write_records(recs, tmp)
        generation = {"conditioning": "public-control-codes" if prompts else "unconditional",
                      "start": "the model's document boundary (BOS, else EOS), then the prompt's text",
                      "reads_private_data": False, "sampling": sampling.public(),
                      "prompts": None if prompts is None else {
                          "sha256": prompts.sha256, **prompts.public(),
                          "records_per_code": dict(zip([p.code for p in prompts.prompts],
                                                       prompts.allot(records)))}}
        tags = _model_run_tags(settings, loaded.run_id)
        of_release = tags.get("privacy.ledger_release_id")
        model = {"name": loaded.name, "version": str(loaded.version), "run_id": loaded.run_id,
                 "uri": model_uri, "ledger_release_id": None if of_release is None else int(of_release),
                 "seal_key_fingerprint": (model_seal.get("public_key") or {}).get("fingerprint")}
        cert = build_certificate(model=model, model_cert=loaded.certificate, generation=generation,
                                 corpus=corpus, code_version=code_version())
        seal_corpus(tmp, cert, loaded.certificate, model_seal, load_signing_key(settings))
        final = _move_into_place(tmp, root, cert)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    scan_path, release_id, reg = _record_corpus(
        settings, final, cert, model, matches, counts, register=register, progress=progress,
        params={"model": loaded.name, "model_version": str(loaded.version), "records": records,
                "certificate_sha256": cert["sha256"], "corpus_sha256": corpus["sha256"]})
    public = publish("cli.synthesize", {
        "model_uri": model_uri, "records": records, "corpus_dir": str(final),
        "uri": None if reg is None else reg["uri"], "run_id": None if reg is None else reg["run_id"],
        "certificate_sha256": cert["sha256"], "corpus_sha256": corpus["sha256"],
        "parquet_sha256": corpus["parquet_sha256"], "ledger_release_id": release_id,
        "inherits": cert["inherits"], "conditioning": generation["conditioning"],
        "sampling": sampling.public(), "scan": counts, "statement": cert["statement"]})
    return {"public": public, "private": {"scan_matches": str(scan_path), "matched_records":
                                          len({m["index"] for m in matches})}}


def _record_corpus(settings: Settings, final: Path, cert: dict, model: dict, matches: list, counts: dict, *,
                   params: dict, register: bool, progress: bool):
    """What both corpus sources do once the sealed corpus is in place: the scan's matches to the private
    area, the release event in the ledger (post-processing: no charge), and the registration.
    Returns (scan_path, ledger release id, registration or None)."""
    from components.ledger import Ledger  # startup

    scan_path = Path(settings.private_dir) / "synthetic" / final.name / "scan.jsonl"
    _write_private_jsonl(scan_path, matches)
    led = Ledger.open(settings)
    try:
        release_id = led.record_post_processing(
            kind="synthetic", release_key=cert["sha256"], of_release=model["ledger_release_id"],
            params=params, detail={"certificate_sha256": cert["sha256"]})
    finally:
        led.dispose()
    reg = None
    if register:
        with step("registering the corpus", on=progress):
            reg = register_synthetic(settings, final, scan=counts, ledger_release_id=release_id)
    return scan_path, release_id, reg


def _model_run_tags(settings: Settings, run_id: str) -> dict:
    return dict(_client(settings).get_run(run_id).data.tags)


# --- the canary echo audit (`veil audit-synthetic`) ----------------------------------------------------------
ECHO_FILE = "echo-audit.json"


def corpus_folder(settings: Settings, corpus: str | Path) -> Path:
    """A corpus folder: a path, or a corpus id (the folder name under VEIL_HOME/synthetic/, or a unique
    prefix of it)."""
    p = Path(corpus)
    if p.is_dir():
        return p
    root = Path(settings.home) / "synthetic"
    text = str(corpus)
    hits = sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")
                  and d.name.startswith(text)) if root.is_dir() and text and "/" not in text else []
    if len(hits) != 1:
        raise VeilError(f"corpus {text!r}: " + ("no such corpus folder or id under " + str(root) if not hits else
                                                f"{len(hits)} corpora start with it; give more of the id"))
    return hits[0]


def audit_synthetic(settings: Settings, corpus: str | Path, *, policy: str | Path | None = None,
                    bootstrap: int = 100, record: bool = True) -> dict:
    """The canary echo audit of a corpus (components/audit/echo.py): the corpus (verified) against the plan's
    canaries, member vs held out. Reads the corpus and the plan's private canary split — never the model.
    Returns {"public": the section (through the gate), "private": the private report's path, "verdict"}."""

    folder = corpus_folder(settings, corpus)
    thresholds_src = None
    if policy is not None:
        thresholds_src = load_policy(policy).spec.audit
    syn = load_synthetic(folder, settings)       # every check: seal, files, the model's certificate and seal
    model_cert = json.loads((folder / FILES["model_certificate"]).read_text())
    plan_path = Path(settings.plans_dir) / f"{model_cert.get('plan_sha256')}.json"
    if not plan_path.is_file():
        raise VeilError(f"corpus {folder.name}: the model's plan {str(model_cert.get('plan_sha256'))[:12]}… is not in "
                        f"{settings.plans_dir} (the echo audit runs on the Veil home that trained the model)")
    plan = load_plan(plan_path).to_dict()
    annex = load_annex(settings.private_dir, plan) if plan.get("annex") else None
    res = audit_reservations(plan, annex)
    recs = canary_records_table(res, settings)
    if recs is None or recs.num_rows == 0:
        raise VeilError(f"corpus {folder.name}: the model's plan has no canaries, so there is nothing to echo; set "
                        "audit.canaries.users and audit.canaries.prefixes in the policy of the next release")
    conf = (plan.get("audit") or {}).get("canaries") or {}
    canaries = echo_canaries(recs, res.held_out_users)
    threshold = resolve_thresholds(thresholds_src, plan)["max_canary_auroc"]
    seed = int((plan.get("training") or {}).get("seed", 0))
    private = echo_audit(syn.texts, canaries, model_cert, threshold=threshold, bootstrap=bootstrap, seed=seed)
    cert = syn.certificate
    section = public_section(private, corpus={"certificate_sha256": cert["sha256"], "records": cert["corpus"]["records"]},
                             model={"name": cert["model"]["name"], "version": cert["model"]["version"],
                                    "certificate_sha256": model_cert["sha256"]})
    section["canary_kind"] = "echo" if conf.get("prefixes") else "inserted"
    if not conf.get("prefixes"):
        section["reasons"].append("the plan's canaries carry their substring inside filler text, not after an "
                                  "in-distribution prefix (audit.canaries.prefixes): the sampler seldom reaches "
                                  "them, so a pass here is weak evidence")
    private_dir = Path(settings.private_dir) / "synthetic" / folder.name
    private_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(private_dir, 0o700)
    path = private_dir / ECHO_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private_json({**private, "corpus": folder.name}))
    public = publish("cli.audit_synthetic", {**section, "private_report": str(path)})
    if record:
        record_echo_audit(settings, cert["sha256"], public)
    return {"public": public, "private": str(path), "verdict": public["verdict"]}


def synthesize_pmixed(settings: Settings, model_uri: str, *, records: int, prompts_path: str | Path | None = None,
                      max_new_tokens: int = 64, policy: str | Path | None = None, register: bool = True,
                      progress: bool = True, device: str = "cpu") -> dict:
    """`veil synthesize MODEL_URI --pmixed`: draw the corpus through a registered PMixED ensemble, each token
    charged to its token budget before it is drawn. Refused up front when records × max_new_tokens exceed
    the tokens left; stopped cleanly (what was drawn kept) if concurrent serving spends the budget first.
    Certified as part of that release's transcript, sealed, scanned, recorded, registered like `synthesize`."""
    from components.prediction.budget import TokenBudget  # startup

    prompts = load_prompts(prompts_path) if prompts_path else None
    if not 1 <= records <= 10_000_000:
        raise VeilError(f"--records {records}: must be between 1 and 10000000")
    if not 1 <= max_new_tokens <= 4096:
        raise VeilError(f"--max-new-tokens {max_new_tokens}: must be between 1 and 4096")
    if policy is not None and not Path(policy).is_file():
        raise VeilError(f"--policy {policy}: no such policy file")

    tagger = Tagger(SCAN_RULES if policy is None else str(policy))
    with step(f"loading and verifying {model_uri}", on=progress):
        resolved = resolve(settings, model_uri)           # certificate hash, ε recomputed, the registered one
    pcert = resolved["certificate"]
    eid = pcert["ensemble_id"]
    tb = TokenBudget.open(settings)
    try:
        check_budget(records, max_new_tokens, tb.remaining(eid), eid)   # before the adapters are even loaded
        ens = open_ensemble(settings, resolved, device=device)          # each adapter against its commitment

        def charge() -> bool:
            return tb.charge(eid, 1)      # one durable row per token, committed before the token is drawn

        with bar("synthesize (PMixED)", records, on=progress) as advance:
            done = [0]

            def tick(n: int) -> None:
                advance(n - done[0])
                done[0] = n
            recs, facts = generate_pmixed_records(ens, records, max_new_tokens, charge, prompts, progress=tick)
    finally:
        tb.dispose()
    if not recs:
        raise VeilError(f"synthesize --pmixed: the budget of ensemble {eid[:12]}… was spent before the first token "
                        "(concurrent serving): no corpus")
    counts, matches = scan_records(recs, tagger=tagger)
    publish("synthetic.pmixed.records", {"records": recs})

    root = Path(settings.home) / "synthetic"
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    tmp = root / f".tmp-{uuid.uuid4().hex}"
    client_tags = _model_run_tags_for(settings, model_uri)
    ledger_of = (pcert.get("ledger") or {}).get("ledger_release_id")
    try:
        corpus = write_records(recs, tmp)
        generation = {"conditioning": "public-control-codes" if prompts else "unconditional",
                      "start": "the ensemble's document boundary (BOS), then the prompt's text",
                      "reads_private_data": False, "sampler": SAMPLER,
                      "sampling": {"records": records, "max_new_tokens": max_new_tokens,
                                   "temperature": pcert["ensemble"]["temperature"]},
                      "prompts": None if prompts is None else {
                          "sha256": prompts.sha256, **prompts.public(),
                          "records_per_code": dict(zip([p.code for p in prompts.prompts], prompts.allot(records)))}}
        model = {"name": client_tags["name"], "version": client_tags["version"], "run_id": client_tags["run_id"],
                 "uri": model_uri, "ledger_release_id": None if ledger_of is None else int(ledger_of)}
        cert = build_pmixed_certificate(model=model, pmixed_cert=pcert, generation=generation, corpus=corpus,
                                        tokens_charged=facts["tokens_charged"], code_version=code_version())
        seal_corpus(tmp, cert, pcert, None, load_signing_key(settings))
        final = _move_into_place(tmp, root, cert)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    scan_path, release_id, reg = _record_corpus(
        settings, final, cert, model, matches, counts, register=register, progress=progress,
        params={"model": model["name"], "model_version": str(model["version"]), "records": records,
                "records_kept": len(recs), "source": "pmixed", "tokens_charged": facts["tokens_charged"],
                "certificate_sha256": cert["sha256"], "corpus_sha256": corpus["sha256"]})
    public = publish("cli.synthesize", {
        "model_uri": model_uri, "source": "pmixed", "records": records, "records_kept": len(recs),
        "tokens_charged": facts["tokens_charged"], "stopped_by_budget": facts["stopped_by_budget"],
        "ensemble_id": eid, "corpus_dir": str(final),
        "uri": None if reg is None else reg["uri"], "run_id": None if reg is None else reg["run_id"],
        "certificate_sha256": cert["sha256"], "corpus_sha256": corpus["sha256"],
        "parquet_sha256": corpus["parquet_sha256"], "ledger_release_id": release_id,
        "inherits": cert["inherits"], "conditioning": generation["conditioning"],
        "sampling": {"records": records, "max_new_tokens": max_new_tokens}, "scan": counts,
        "statement": cert["statement"]})
    return {"public": public, "private": {"scan_matches": str(scan_path),
                                          "matched_records": len({m["index"] for m in matches}),
                                          "tokens_per_record": facts["tokens_per_record"]}}


def _model_run_tags_for(settings: Settings, model_uri: str) -> dict:
    """The registered version a URI names: its name, version and run id (lineage of the corpus)."""

    mv = _resolve_version(_client(settings), model_uri)
    return {"name": mv.name, "version": str(mv.version), "run_id": mv.run_id}


def _refuse_pmixed_without_flag(settings: Settings, model_uri: str) -> None:
    """A PMixED ensemble's URI without --pmixed: say so in one line (drawing through it spends its budget, so
    it is never the default), instead of failing the DP model checks it was never meant to pass."""

    try:
        mv = _resolve_version(_client(settings), model_uri)
    except Exception:  # noqa: BLE001 - an unknown URI is load_model's to refuse, in its own words
        return
    if (mv.tags or {}).get("privacy.schema") == "veil.certificate.pmixed/v1":
        raise VeilError(f"{model_uri} is a PMixED ensemble: pass --pmixed to draw the corpus through it (every "
                        "token is charged to its token budget)")
