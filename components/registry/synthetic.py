"""Synthetic corpora in MLflow: registered with lineage to their model version, loaded only verified.

    register_synthetic(settings, corpus_dir, model_uri=…, scan=…) -> {"run_id", "uri"}
    load_synthetic(uri[, settings]) -> SyntheticCorpus(table, certificate, verification)

A corpus is a run of its own in the experiment `veil-synthetic`: the corpus folder's six files under the
artifact path `synthetic/`, `synthetic.*` tags naming the model version, its run and certificate, and
the corpus' hashes; the model version gets a tag `synthetic.corpus.<certificate sha[:12]>` = the run id,
so lineage reads both ways. `load_synthetic` is the one consumer call: it refuses (ReleaseInvalid, one
line) a corpus, certificate, seal or model certificate that does not verify
(components.synthetic.corpus.verify_corpus_dir), and for a `runs:/` URI also run tags that contradict
the certificate or a model version that is not the certified one.
"""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from components.certificate.seal import trusted_keys
from components.core.errors import VeilError
from components.core.quiet import quiet_third_party
from components.core.settings import Settings, load_settings
from components.publication import publish
from components.registry.artifacts import CERT_ARTIFACT, run_json, SEAL_ARTIFACT
from components.registry.mlflow_registry import _client, _experiment, load_model
from components.synthetic.corpus import FILES, corpus_files, verify_corpus_dir

EXPERIMENT = "veil-synthetic"
ARTIFACT_PATH = "synthetic"


@dataclass
class SyntheticCorpus:
    """A verified corpus: the records as an Arrow table (index, control_code, text) and its certificate."""

    table: Any
    certificate: dict
    verification: dict = field(default_factory=dict)
    uri: str = ""

    @property
    def texts(self) -> list[str]:
        return self.table.column("text").to_pylist()


def model_release(settings: Settings, model_uri: str):
    """The consumer load of a registered model (every check of `load_model`) and the run's seal for the
    certificate it loaded: (LoadedModel, seal). A model that does not verify is refused in one line."""
    loaded = load_model(model_uri, settings)
    seal = run_json(_client(settings), loaded.run_id, SEAL_ARTIFACT)
    if seal.get("certificate_sha256") != loaded.certificate.get("sha256"):
        raise VeilError(f"model {model_uri}: the run's seal is not for the certificate just verified (changed "
                        "while loading?): refused")
    return loaded, seal


def synthetic_tags(cert: Mapping[str, Any]) -> dict[str, str]:
    m, c, g = cert["model"], cert["corpus"], cert["generation"]
    tags = {"synthetic.certificate_sha256": cert["sha256"], "synthetic.corpus_sha256": c["sha256"],
            "synthetic.parquet_sha256": c["parquet_sha256"], "synthetic.records": str(c["records"]),
            "synthetic.model_uri": f"models:/{m['name']}/{m['version']}", "synthetic.model_run_id": m["run_id"],
            "synthetic.model_certificate_sha256": m["certificate_sha256"],
            "synthetic.conditioning": g["conditioning"]}
    if cert.get("source") == "pmixed":
        # drawn through a PMixED ensemble: no seed (OS CSPRNG); the tokens it took from the ensemble's budget
        tags.update({"synthetic.source": "pmixed", "synthetic.tokens_charged": str(cert["tokens"]["charged"]),
                     "synthetic.ensemble_id": m["ensemble_id"]})
    else:
        tags["synthetic.seed"] = str(g["sampling"]["seed"])
    return tags


def register_synthetic(settings: Settings, corpus_dir: str | Path, *, scan: Mapping[str, int] | None = None,
                       ledger_release_id: int | None = None) -> dict:
    """Log a verified corpus folder as a run of `veil-synthetic`, with lineage tags both ways (to the model
    version it was sampled from, or the PMixED ensemble's version it was drawn through).

    `scan`: per detector class, how many records matched (flows.synthetic's scan; a post-processing of
    the corpus, published as `synthetic.scan.<class>` tags). Refuses a folder that does not verify."""
    import mlflow

    v, cert, _ = verify_corpus_dir(corpus_dir, trusted_keys(settings))
    v.raise_if_invalid(f"corpus {corpus_dir}")
    client = _client(settings)
    exp_id = _experiment(settings, EXPERIMENT)
    m = cert["model"]
    tags = synthetic_tags(cert)
    for cls, n in sorted((scan or {}).items()):
        tags[f"synthetic.scan.{cls}"] = str(int(n))
    if ledger_release_id is not None:
        tags["synthetic.ledger_release_id"] = str(int(ledger_release_id))
    files = corpus_files(Path(corpus_dir))
    publish("registry.artifact", {"synthetic": sorted(files)}, subject=cert["sha256"])
    with mlflow.start_run(experiment_id=exp_id, run_name=f"synthetic-{m['name']}-{m['version']}-{cert['sha256'][:8]}") as run:
        mlflow.set_tags(publish("registry.tag", tags, subject=cert["sha256"]))
        for name in files:
            mlflow.log_artifact(str(Path(corpus_dir) / name), artifact_path=ARTIFACT_PATH)
        run_id = run.info.run_id
    key = f"synthetic.corpus.{cert['sha256'][:12]}"
    client.set_model_version_tag(m["name"], str(m["version"]), key, publish("registry.tag", {key: run_id})[key])
    _strip_group_bits(settings)
    return {"run_id": run_id, "uri": f"runs:/{run_id}", "certificate_sha256": cert["sha256"]}


def _strip_group_bits(settings: Settings) -> None:
    """MLflow copies artifacts with the process umask; keep them the owner's only (as register does)."""
    import os

    root = Path(settings.mlflow_artifacts_dir) / EXPERIMENT
    if root.is_dir():
        for p in root.rglob("*"):
            try:
                os.chmod(p, 0o700 if p.is_dir() else 0o600)
            except OSError:
                pass


def _check_run(client, run_id: str, cert: Mapping[str, Any], model_cert: Mapping[str, Any]) -> None:
    """The run's tags say what the certificate says, and the model version is the certified one."""
    tags = client.get_run(run_id).data.tags
    want = synthetic_tags(cert)
    wrong = sorted(k for k, val in want.items() if tags.get(k) != val)
    if wrong:
        raise VeilError(f"run tag(s) {', '.join(wrong)} do not match the corpus certificate")
    m = cert["model"]
    try:
        mv = client.get_model_version(m["name"], str(m["version"]))
    except Exception:  # noqa: BLE001 - a deleted version is a failed lineage check
        raise VeilError(f"model {m['name']}/{m['version']} is not in this registry") from None
    if mv.run_id != m["run_id"]:
        raise VeilError(f"model {m['name']}/{m['version']} is another run than the one the corpus was sampled from")
    registered = mv.tags.get("privacy.certificate_sha256")
    if registered == m["certificate_sha256"]:
        return
    # A re-audit after sampling amends the model's certificate (audit section only, `supersedes` the
    # embedded one): the same release when both documents amend, or are, one embedded certificate.
    now = run_json(client, mv.run_id, CERT_ARTIFACT)
    ours = model_cert
    base_now = now.get("supersedes") or now.get("sha256")
    base_ours = ours.get("supersedes") or ours.get("sha256")
    if not (now.get("sha256") == registered and base_now and base_now == base_ours):
        raise VeilError(f"model {m['name']}/{m['version']}'s certificate {str(registered)[:12]}… is not the "
                        f"certified {m['certificate_sha256'][:12]}… (nor an audit amendment of it)")


def load_synthetic(uri: str | Path, settings: Settings | None = None) -> SyntheticCorpus:
    """THE consumer call: a verified synthetic corpus (Arrow table + its certificate), or ReleaseInvalid.

    `uri`: `runs:/<run id>` (what `veil synthesize` prints; the registry side is checked too) or a corpus
    folder (offline: the folder's own sealed chain — corpus, certificate, model certificate and seal)."""
    import sys

    settings = settings or load_settings()
    trusted = trusted_keys(settings)
    text = str(uri)
    if not text.startswith("runs:/"):
        v, cert, table = verify_corpus_dir(text, trusted)
        v.raise_if_invalid(f"synthetic corpus {text}")
        return SyntheticCorpus(table=table, certificate=cert, verification=v.to_dict(), uri=text)
    import mlflow

    quiet_third_party(prefect="prefect" in sys.modules)
    run_id = text[len("runs:/"):].strip("/").split("/", 1)[0]
    if not run_id:
        raise VeilError(f"synthetic corpus URI {text!r}: expected runs:/RUN_ID or a corpus folder")
    client = _client(settings)
    try:
        client.get_run(run_id)
    except Exception:  # noqa: BLE001
        raise VeilError(f"synthetic corpus URI {text!r}: no such run") from None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=ARTIFACT_PATH, dst_path=tmp)
        except Exception:  # noqa: BLE001
            raise VeilError(f"synthetic corpus {text}: run {run_id[:8]} has no synthetic/ artifacts") from None
        v, cert, table = verify_corpus_dir(local, trusted)
        if cert is not None:
            model_cert = json.loads((Path(local) / FILES["model_certificate"]).read_text())
            v.run("registry", _check_run, client, run_id, cert, model_cert)
        v.raise_if_invalid(f"synthetic corpus {text}")
    return SyntheticCorpus(table=table, certificate=cert, verification=v.to_dict(), uri=text)


def record_echo_audit(settings: Settings, certificate_sha256: str, section: Mapping[str, Any]) -> str | None:
    """Tag the corpus' run(s) with the echo audit's public verdict and AUROC bucket (`veil audit-synthetic`).
    Returns the run id tagged last, or None when the corpus was never registered."""

    client = _client(settings)
    exp = client.get_experiment_by_name(EXPERIMENT)
    if exp is None:
        return None
    runs = client.search_runs([exp.experiment_id],
                              filter_string=f"tags.`synthetic.certificate_sha256` = '{certificate_sha256}'")
    auroc = section.get("auroc")
    tags = publish("registry.tag", {
        "synthetic.echo_audit.verdict": str(section.get("verdict")),
        "synthetic.echo_audit.auroc": "none" if not auroc else f"[{auroc[0]:g}, {auroc[1]:g})"},
        subject=certificate_sha256)
    last = None
    for r in runs:
        for k, v in tags.items():
            client.set_tag(r.info.run_id, k, v)
        last = r.info.run_id
    return last
