"""Where everything lives. Embedded defaults under VEIL_HOME; env vars and veil.toml override.

Precedence (highest first): environment variables, `veil.toml` (in VEIL_HOME or the working
directory, or the file named by VEIL_CONFIG), built-in defaults.
"""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from components.core.device import check_device
from components.core.errors import VeilError

# veil.toml key  ->  environment variable
_KEYS = {
    "home": "VEIL_HOME",
    "mlflow_tracking_uri": "VEIL_MLFLOW_TRACKING_URI",
    "mlflow_registry_uri": "VEIL_MLFLOW_REGISTRY_URI",
    "prefect_api_url": "PREFECT_API_URL",
    "device": "VEIL_DEVICE",
    "ledger_url": "VEIL_LEDGER_URL",  # per-person privacy ledger; default sqlite under private_dir
}


@dataclass(frozen=True)
class Settings:
    home: Path
    mlflow_tracking_uri: str
    mlflow_registry_uri: str
    prefect_api_url: str | None = None  # None: Prefect's ephemeral API, PREFECT_HOME inside home
    device: str = "auto"
    ledger_url: str | None = None  # None: sqlite:///<private_dir>/ledger.db (components.ledger)
    sources: dict = field(default_factory=dict, compare=False)

    @property
    def catalog_path(self) -> Path:
        return self.home / "catalog.duckdb"

    @property
    def snapshots_dir(self) -> Path:
        return self.home / "snapshots"

    @property
    def plans_dir(self) -> Path:
        return self.home / "plans"

    @property
    def runs_dir(self) -> Path:
        return self.home / "runs"

    @property
    def models_dir(self) -> Path:
        return self.home / "models"

    @property
    def cache_dir(self) -> Path:
        return self.home / "cache"

    @property
    def prefect_home(self) -> Path:
        return self.home / "prefect"

    @property
    def mlflow_artifacts_dir(self) -> Path:
        return self.home / "mlflow-artifacts"

    @property
    def private_dir(self) -> Path:
        """Never logged, registered or printed: plan annexes (membership), per-person audit rows,
        ledger rows, keys. Everything that names a person or a secret value lives here."""
        return self.home / "private"

    def ensure(self) -> "Settings":
        """Create the home's folders 0700 whatever the umask, set this process's umask to 0o077 (so
        files written by DuckDB, SQLite/MLflow, Parquet and ours are 0600), and repair a home an
        older Veil or a loose umask left readable by others (group/other bits removed below it)."""
        private_umask()
        loose = self.home.is_dir() and bool(self.home.stat().st_mode & 0o077)
        for d in (self.home, self.snapshots_dir, self.plans_dir, self.runs_dir, self.models_dir,
                  self.cache_dir, self.prefect_home, self.mlflow_artifacts_dir, self.private_dir):
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
            if d.stat().st_mode & 0o077:
                os.chmod(d, 0o700)
        if loose:
            self.make_private(self.home)
        return self

    def make_private(self, *paths: Path) -> None:
        """Remove group/other permission bits from `paths` and everything below them (symlinks are
        left alone). For files a library copies with their source's mode (MLflow artifacts)."""
        strip_group_other(*paths)

    def apply_environment(self) -> None:
        """Point Prefect (ephemeral unless a server URL is set) and telemetry at our settings."""
        os.environ.setdefault("PREFECT_HOME", str(self.prefect_home))
        os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        os.environ.setdefault("DO_NOT_TRACK", "1")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        if self.prefect_api_url:
            os.environ["PREFECT_API_URL"] = self.prefect_api_url


PRIVATE_UMASK = 0o077


def private_umask() -> None:
    """Files and folders this process creates are its owner's only (0600 / 0700). Everything
    under VEIL_HOME is private (catalog with secret values, snapshots, plans, runs, MLflow's
    database); the CLI and the Prefect flows call this at start, `Settings.ensure()` too."""
    os.umask(PRIVATE_UMASK)


def strip_group_other(*paths: Path) -> None:
    """Remove group/other permission bits from `paths` and everything below them (symlinks left alone)."""
    for root in paths:
        root = Path(root)
        if not root.exists() or root.is_symlink():
            continue
        _strip(root)
        if root.is_dir():
            for dirpath, dirnames, filenames in os.walk(root):
                for n in dirnames + filenames:
                    p = Path(dirpath) / n
                    if not p.is_symlink():
                        _strip(p)


def repair_loaded_package(artifact_path: str | Path) -> Path | None:
    """A plain `mlflow.pyfunc.load_model("models:/…")` on a local registry writes `registered_model_meta` into the
    registered package itself, in VEIL_HOME, with the consumer's umask (0644 under the usual 022; issue 28) — before
    any Veil code runs. Veil's pyfuncs call this first in `load_context`: the package folder holding MLmodel (found
    above one of its artifacts) is made owner-only again when it is itself owner-only, i.e. a package in a private
    registry; a consumer's own download (a folder others may read) is left as its owner made it. Returns the
    package folder repaired, or None. Others could not open the file in between: the folders above it are 0700."""
    p = Path(artifact_path).resolve()
    for d in (p, *p.parents):
        if (d / "MLmodel").is_file():
            if d.stat().st_mode & 0o077:
                return None
            strip_group_other(d)
            return d
    return None


def _strip(p: Path) -> None:
    mode = p.stat().st_mode
    if mode & 0o077:
        os.chmod(p, mode & 0o7700)


def _read_toml(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise VeilError(f"{path}: not valid TOML ({e})") from None
    veil = data.get("veil", data)
    unknown = set(veil) - set(_KEYS)
    if unknown:
        raise VeilError(f"{path}: unknown setting(s) {', '.join(sorted(unknown))}; known: {', '.join(_KEYS)}")
    return veil


def load_settings(home: str | Path | None = None, env: dict | None = None) -> Settings:
    env = os.environ if env is None else env
    values: dict[str, str] = {}
    sources: dict[str, str] = {}
    candidates = []
    if env.get("VEIL_CONFIG"):
        candidates.append(Path(env["VEIL_CONFIG"]))
    home_hint = Path(home or env.get("VEIL_HOME") or ".veil")
    candidates += [home_hint / "veil.toml", Path("veil.toml")]
    for c in candidates:
        if c.is_file():
            for k, v in _read_toml(c).items():
                values[k] = str(v)
                sources[k] = str(c)
            break
    for k, var in _KEYS.items():
        if env.get(var):
            values[k] = env[var]
            sources[k] = f"${var}"
    if home is not None:
        values["home"], sources["home"] = str(home), "argument"
    root = Path(values.get("home", ".veil")).expanduser().resolve()
    default_db = f"sqlite:///{root / 'mlflow.db'}"  # absolute path -> sqlite://// + path
    tracking = values.get("mlflow_tracking_uri", default_db)
    return Settings(
        home=root,
        mlflow_tracking_uri=tracking,
        mlflow_registry_uri=values.get("mlflow_registry_uri", tracking),
        prefect_api_url=values.get("prefect_api_url"),
        device=check_device(values.get("device", "auto"),
                            "VEIL_DEVICE" if sources.get("device", "$VEIL_DEVICE") == "$VEIL_DEVICE"
                            else f"device in {sources['device']}"),
        ledger_url=values.get("ledger_url"),
        sources=sources,
    )
