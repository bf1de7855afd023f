"""A registered release read from a local MLflow store without importing MLflow: `veil verify`'s fast path.

MLflow's client costs a fresh process about 4 CPU s of imports (its GenAI, data and SQLAlchemy
layers) and an alembic schema check before it reads one row. Veil's default registry is local: one
SQLite file for tracking and registry (`sqlite:///…`) and `file://` artifacts under VEIL_HOME. This
module reads exactly the rows and files MLflow 3's SqlAlchemyStore and LocalArtifactRepository read
for the calls verification makes (`components.registry.verification`):

- `get_model_version(name, version)` / `get_model_version_by_alias(name, alias)`: the `model_versions`
  row of the default workspace whose stage is not `Deleted_Internal`, its `model_version_tags`, and the
  aliases of `registered_model_aliases` that point at it;
- `get_run(run_id)`: the run's `tags` and `latest_metrics` (NaN where `is_nan`);
- `download_artifacts(run_id, path, dst)`: the file under the run's `artifact_uri`, copied to `dst`;
- `package_dir(mv)`: the model package, found as MLflow finds it (`models:/<model id>` → the
  `logged_models` row not deleted → its `artifact_location`), read in place.

It answers only for a store it knows exactly: both URIs the same `sqlite:///` file, a sound SQLite
file whose alembic revision is one in KNOWN_SCHEMAS (the revisions this reader was checked against,
tests/core/test_registry_local_store.py), `file://` artifact locations. Everything else — an HTTP
tracking server, PostgreSQL, another MLflow schema, a URI or row this reader does not resolve, a
database error — returns None (`open_local_store`, `resolve`), and the caller uses MLflow's client
exactly as before; so a store MLflow would refuse is refused by MLflow, in MLflow's words.
"""
from __future__ import annotations

import os
import shutil
import sqlite3
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from components.core.errors import VeilError
from components.core.settings import Settings
from components.core.sqlite_files import check_existing

# alembic revisions of MLflow's SQL schema this reader was checked against (MLflow 3.17). A store at
# another revision is read by MLflow itself (a new MLflow: add its head here once the tests pass).
KNOWN_SCHEMAS = frozenset({"dc11669786a5"})
# MLflow's single-tenant workspace, and the stage MLflow gives a deleted version's row
DEFAULT_WORKSPACE = "default"
DELETED_INTERNAL = "Deleted_Internal"
MLFLOW_RESTORE = ("restore it from a backup (it holds the registered models, their runs and aliases); do not "
                  "move it aside: a new, empty registry forgets every release")
TABLES = ("model_versions", "model_version_tags", "registered_model_aliases", "runs", "tags", "latest_metrics",
          "logged_models", "alembic_version")


@dataclass
class RunData:
    tags: dict[str, str]
    metrics: dict[str, float]


@dataclass
class Run:
    data: RunData
    artifact_uri: str


@dataclass
class ModelVersion:
    name: str
    version: str
    source: str
    run_id: str
    tags: dict[str, str] = field(default_factory=dict)
    aliases: list[str] = field(default_factory=list)


class _Unknown(Exception):
    """Something this reader does not resolve exactly: the caller asks MLflow instead."""


def local_path(uri: str | None) -> Path | None:
    """A `file:` URI (or a plain absolute path) as MLflow's `local_file_uri_to_path` reads it; None for
    any other scheme."""
    if not uri:
        return None
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost"):
        if os.name == "nt":
            from urllib.request import url2pathname   # (~0.1 s: http.client, ssl) only where it differs

            return Path(url2pathname(parsed.path))
        return Path(urllib.parse.unquote(parsed.path))       # url2pathname on POSIX
    if parsed.scheme == "" and os.path.isabs(uri):
        return Path(uri)
    return None


class LocalStore:
    """Read-only view of one SQLite MLflow store (module docstring); the subset of MlflowClient that
    verification calls."""

    def __init__(self, path: Path):
        self.path = path
        # read-only: verification never writes, and MLflow's migrations never run from here
        self.db = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)

    def close(self) -> None:
        self.db.close()

    def _rows(self, sql: str, *args) -> list[tuple]:
        return self.db.execute(sql, args).fetchall()

    def known_schema(self) -> bool:
        have = {r[0] for r in self._rows("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not set(TABLES) <= have:
            return False
        revs = {r[0] for r in self._rows("SELECT version_num FROM alembic_version")}
        return len(revs) == 1 and revs <= KNOWN_SCHEMAS

    # --- the registry ----------------------------------------------------------------------------
    # (SQL's `!=` as MLflow's queries use it: a NULL stage matches neither side, so such a row is not
    # returned by MLflow either)
    def get_model_version(self, name: str, version) -> ModelVersion:
        try:
            v = int(str(version))
        except ValueError:
            raise _Unknown from None
        rows = self._rows("SELECT name, version, source, run_id FROM model_versions WHERE workspace = ? AND name = ? "
                          "AND version = ? AND current_stage != ?",
                          DEFAULT_WORKSPACE, name, v, DELETED_INTERNAL)
        if len(rows) != 1:
            raise _Unknown
        name, v, source, run_id = rows[0]
        tags = dict(self._rows("SELECT key, value FROM model_version_tags WHERE workspace = ? AND name = ? "
                               "AND version = ?", DEFAULT_WORKSPACE, name, v))
        # the registered model's aliases that point here, as MLflow lists them (its relationship query)
        aliases = [a for a, av in self._rows("SELECT alias, version FROM registered_model_aliases WHERE workspace = ? "
                                             "AND name = ?", DEFAULT_WORKSPACE, name) if av == v]
        return ModelVersion(name=name, version=str(v), source=source, run_id=run_id, tags=tags, aliases=aliases)

    def get_model_version_by_alias(self, name: str, alias: str) -> ModelVersion:
        if alias.lower() == "latest":      # MLflow's reserved alias (the highest version): left to MLflow
            raise _Unknown
        rows = self._rows("SELECT version FROM registered_model_aliases WHERE workspace = ? AND name = ? AND alias = ?",
                          DEFAULT_WORKSPACE, name, alias)
        if len(rows) != 1:
            raise _Unknown
        return self.get_model_version(name, rows[0][0])

    # --- runs and their artifacts ----------------------------------------------------------------
    def get_run(self, run_id: str) -> Run:
        rows = self._rows("SELECT artifact_uri FROM runs WHERE run_uuid = ?", run_id)
        if len(rows) != 1:
            raise VeilError(f"run {str(run_id)[:8]} not found")
        tags = dict(self._rows("SELECT key, value FROM tags WHERE run_uuid = ?", run_id))
        metrics = {k: (float("nan") if nan else float(val))
                   for k, val, nan in self._rows("SELECT key, value, is_nan FROM latest_metrics WHERE run_uuid = ?",
                                                 run_id)}
        return Run(data=RunData(tags=tags, metrics=metrics), artifact_uri=rows[0][0])

    def download_artifacts(self, run_id: str, path: str, dst_path: str) -> str:
        """The run's artifact `path` copied into `dst_path` (MLflow's LocalArtifactRepository: the path
        normalised and kept inside the run's artifact folder)."""
        root = local_path(self.get_run(run_id).artifact_uri)
        if root is None:
            raise VeilError(f"run {str(run_id)[:8]}: artifacts are not in a local folder")
        src = Path(os.path.join(root, os.path.normpath(path)))
        # MLflow's validate_path_within_directory: inside the run's folder once symlinks are resolved
        if not str(src.resolve()).startswith(str(root.resolve()) + os.sep) or not src.is_file():
            raise VeilError(f"run {str(run_id)[:8]}: no {path} artifact")
        dst = Path(dst_path) / src.name
        shutil.copyfile(src, dst)
        return str(dst)

    def package_dir(self, mv: ModelVersion) -> Path:
        """The version's model package, where MLflow would download it from."""
        source = str(mv.source or "")
        if not source.startswith("models:/m-") or "/" in source[len("models:/"):]:
            raise _Unknown       # a runs:/ or registry URI source (older MLflow): MLflow resolves it
        rows = self._rows("SELECT artifact_location FROM logged_models WHERE model_id = ? AND "
                          "lifecycle_stage != 'deleted'", source[len("models:/"):])
        if len(rows) != 1:
            raise _Unknown
        path = local_path(rows[0][0])
        if path is None or not path.is_dir():
            raise _Unknown
        return path


def open_local_store(settings: Settings) -> LocalStore | None:
    """The store, when it is one this reader knows exactly (module docstring); else None."""
    uri = settings.mlflow_tracking_uri
    if not uri or uri != settings.mlflow_registry_uri or not uri.startswith("sqlite:///"):
        return None
    path = Path(uri[len("sqlite:///"):])
    if not path.is_file():
        return None
    # the same one-line refusal of an empty, garbled or truncated file as the MLflow path's check_store
    check_existing(path, "MLflow store", MLFLOW_RESTORE)
    try:
        store = LocalStore(path)
    except sqlite3.Error:
        return None
    try:
        if store.known_schema():
            return store
    except sqlite3.Error:
        pass
    store.close()
    return None


def resolve(store: LocalStore, model_uri: str) -> tuple[ModelVersion, Path] | None:
    """(version, package folder) for `models:/NAME/VERSION` or `models:/NAME@ALIAS`; None where MLflow
    must answer (not found, a URI form or source this reader does not resolve, a database error)."""
    if not model_uri.startswith("models:/"):
        return None
    rest = model_uri[len("models:/"):]
    try:
        if "@" in rest:
            name, alias = rest.split("@", 1)
            mv = store.get_model_version_by_alias(name, alias)
        else:
            name, version = rest.rsplit("/", 1)
            mv = store.get_model_version(name, version)
        store.get_run(mv.run_id)     # a version whose run is gone: MLflow's own error, as before
        return mv, store.package_dir(mv)
    except (_Unknown, VeilError, ValueError, sqlite3.Error):
        return None


def package_artifacts(package_dir: str | Path) -> dict[str, str]:
    """The pyfunc's artifact name -> local path, from the package's MLmodel as MLflow's `Model.load`
    reads it (YAML; `components.registry.artifacts.package_artifacts` is the same through MLflow)."""
    import yaml

    root = Path(package_dir)
    try:
        doc = yaml.safe_load((root / "MLmodel").read_text())
        flavor = doc["flavors"]["python_function"]
        return {name: str(root / a["path"]) for name, a in (flavor.get("artifacts") or {}).items()}
    except Exception:  # noqa: BLE001 - any unreadable package is named for the user, as the MLflow reader does
        raise VeilError(f"{root}: not an MLflow pyfunc model package") from None
