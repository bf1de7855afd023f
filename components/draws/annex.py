"""The plan's private annex, and the keyed PRF every private planning decision draws from.

A plan has two parts. The public part (`plans/<sha>.json`, registered with the model) holds policy
values, DP estimates and salted commitments. The annex — who is held out, which records train and
which go to the attacker, the files that say so with their hashes, exact counts, `auto`'s private
statistics — lives under `private_dir/plans/` and is never logged, registered or printed. The public
part commits to it: `annex.commitment = sha256(salt ‖ canonical JSON of the annex without its salt)`,
so a consumer holding the annex can check it is the one the plan was built with, and nobody without
it learns anything from the hash (the salt is 256 bits from the PRF below).

Every private random choice (held-out draws, attacker samples, selection, the population noise,
salts) comes from HMAC-SHA256 under one secret key, `private_dir/keys/plan.key` (32 bytes of
os.urandom, made on first use, mode 0600). Keyed, not seeded: a public seed would let anyone with the
roster recompute who was held out. Deterministic, not clocked: the same snapshot + policy give the
same plan, so re-planning releases nothing new (the DP population estimate in particular is the
same draw, not a fresh one an attacker could average).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
from pathlib import Path
from typing import Any, Mapping

from components.core.errors import VeilError
from components.core.hashing import canonical_json, sha256_bytes, sha256_file

ANNEX_SCHEMA = "veil.plan-annex/v1"
KEY_FILE = Path("keys") / "plan.key"


def _private_mkdir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        os.chmod(path, 0o700)
    except OSError:  # pragma: no cover - e.g. a folder we do not own; the file modes still hold
        pass


def _new_key(n: int) -> bytes:
    """A fresh key's bytes (the test suite pins it so that its small orgs' DP draws are reproducible)."""
    return os.urandom(n)


def plan_key(private_dir: str | Path) -> bytes:
    """The planner's secret PRF key; created (0600, in a 0700 folder) on first use."""
    path = Path(private_dir) / KEY_FILE
    if not path.is_file():
        _private_mkdir(path.parent)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:          # another planner made it first: use theirs
            pass
        else:
            with os.fdopen(fd, "wb") as f:
                f.write(_new_key(32))
    key = path.read_bytes()
    if len(key) != 32:
        raise VeilError(f"{path}: the plan key must be 32 bytes, found {len(key)}; restore it from backup "
                        "(a new key changes every plan's private draws)")
    return key


def prf(key: bytes, *parts: Any) -> bytes:
    """HMAC-SHA256 of the parts (each canonical JSON, so ('a','bc') and ('ab','c') differ)."""
    msg = b"\x1f".join(canonical_json(p) for p in parts)
    return hmac.new(key, msg, hashlib.sha256).digest()


def json_strings(values):
    """`canonical_json` of every string in an Arrow array, as a string array (no per-row Python for
    ids without a quote, backslash or control character — the only ones JSON escapes here, since
    canonical JSON keeps non-ASCII text as it is)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = _string_array(values)
    quoted = pc.binary_join_element_wise('"', arr, '"', "")
    odd = pc.or_kleene(pc.match_substring_regex(arr, r'[\x00-\x1f"\\]'), pc.is_null(arr))
    if pc.any(odd).as_py():
        mask = odd.fill_null(True)
        fixed = [canonical_json(v).decode() for v in arr.filter(mask).to_pylist()]
        quoted = pc.replace_with_mask(quoted, np.asarray(mask.to_numpy(zero_copy_only=False), bool),
                                      pa.array(fixed, pa.string()))
    return quoted


def _string_array(values):
    import pyarrow as pa

    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not isinstance(values, pa.Array):
        values = pa.array(list(values), pa.string())
    if values.type != pa.string():
        values = values.cast(pa.string()) if not pa.types.is_large_string(values.type) else values.cast(pa.string())
    return values


PRF_CHUNK = 1 << 17     # messages hashed per batch (bounds the Python bytes alive at once)


def prf_column(key: bytes, *parts: Any):
    """`prf(key, *parts)` for every row at once: (n, 32) uint8 digests.

    A part is either one value (the same for every row: a label, the seed) or an Arrow string array
    / sequence of strings with one entry per row (person ids, texts). Row i's digest is exactly
    `prf(key, *(p[i] if p is a column else p for p in parts))` — one HMAC per row, each of one row's
    values alone; only the message assembly and the output decoding are vectorised."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    cols = [i for i, p in enumerate(parts) if not isinstance(p, (str, int, float, bool, type(None)))]
    if not cols:
        return np.frombuffer(prf(key, *parts), np.uint8).reshape(1, 32)
    pieces = [json_strings(p) if i in cols else canonical_json(p).decode() for i, p in enumerate(parts)]
    n = len(pieces[cols[0]])
    if any(len(pieces[i]) != n for i in cols):
        raise VeilError("prf: column parts must have one entry per row")
    if n == 0:
        return np.empty((0, 32), np.uint8)
    msgs = pc.binary_join_element_wise(*pieces, "\x1f").cast(pa.binary())
    pad = bytes(key).ljust(64, b"\0") if len(key) <= 64 else hashlib.sha256(key).digest().ljust(64, b"\0")
    inner0 = hashlib.sha256(bytes(b ^ 0x36 for b in pad))
    outer0 = hashlib.sha256(bytes(b ^ 0x5C for b in pad))
    out = bytearray()
    for start in range(0, n, PRF_CHUNK):
        for m in msgs.slice(start, PRF_CHUNK).to_pylist():
            i = inner0.copy()                    # HMAC-SHA256 from the key's precomputed pads
            i.update(m)
            o = outer0.copy()
            o.update(i.digest())
            out += o.digest()
    return np.frombuffer(bytes(out), np.uint8).reshape(n, 32)


def prf_uniform_column(key: bytes, *parts: Any):
    """`prf_uniform` for every row (float64), bit for bit."""
    import numpy as np

    d = prf_column(key, *parts)
    x = np.ascontiguousarray(d[:, :8]).view(">u8").ravel().astype(np.uint64) >> np.uint64(11)
    return (x.astype(np.float64) + 0.5) / float(1 << 53)


def prf_seed_column(key: bytes, *parts: Any):
    """`prf_seed` for every row: (n, 4) uint32."""
    import numpy as np

    d = prf_column(key, *parts)
    return np.ascontiguousarray(d[:, :16]).view("<u4").reshape(-1, 4).astype(np.uint32)


def prf_uniform(key: bytes, *parts: Any) -> float:
    """A uniform draw in the open interval (0, 1), 53 bits, from `prf`."""
    x = int.from_bytes(prf(key, *parts)[:8], "big") >> 11
    return (x + 0.5) / float(1 << 53)


def prf_seed(key: bytes, *parts: Any) -> list[int]:
    """Four 32-bit words for numpy's SeedSequence."""
    d = prf(key, *parts)
    return [int.from_bytes(d[i:i + 4], "little") for i in range(0, 16, 4)]


def laplace_noise(key: bytes, scale: float, *parts: Any) -> float:
    """Laplace(0, scale) by inverse CDF from one keyed uniform draw."""
    import math

    u = prf_uniform(key, "laplace", *parts) - 0.5
    return -scale * math.copysign(1.0, u) * math.log1p(-2.0 * abs(u))


def population_digest(key: bytes, chosen) -> str:
    """A keyed digest of exactly what N counts: the (user, record) pairs the plan trains on.

    The population estimate's noise is keyed on it (issue 22, case 1): the same counted population
    re-planned gives the same N̂ (nothing new is released), while any other population — one person
    retired, held out or in evaluation, another base model's exclusions — draws fresh noise, so two
    public N̂ never differ by exactly the number of people excluded. Keyed (HMAC), so the digest of a
    guessed population cannot be matched against the ledger's record of it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from components.draws.columns import is_sorted, take  # startup

    u, r = chosen.column("user_id"), chosen.column("record_id")
    h = hashlib.sha256()
    if u.type == pa.string() and r.type == pa.string() and u.null_count == 0 and r.null_count == 0:
        # Columns: Arrow sorts strings as UTF-8 bytes, i.e. by code point, as `sorted` sorts `str`s; the
        # lines are hashed straight from Arrow's buffers, a slice at a time
        # rows the planner already sorted (make_plan sorts the training rows once) are hashed in place
        pair = pa.table({"u": u, "r": r})
        order = None if is_sorted(pair, ["u", "r"]) else pc.sort_indices(
            pair, sort_keys=[("u", "ascending"), ("r", "ascending")])
        for start in range(0, len(u), _DIGEST_SLICE):
            if order is None:
                us, rs = u.slice(start, _DIGEST_SLICE), r.slice(start, _DIGEST_SLICE)
            else:
                # chunk by chunk (columns.take): Arrow's own take on a chunked column first concatenates
                # the whole column, for every slice (at 10⁷ people, a gigabyte or more at once: the plan's peak)
                idx = order.slice(start, _DIGEST_SLICE).to_numpy()
                us, rs = take(u, idx), take(r, idx)
            lines = pc.binary_join_element_wise(us, "\x1f", rs, "\n", "")
            for chunk in (lines.chunks if isinstance(lines, pa.ChunkedArray) else [lines]):
                if len(chunk):
                    offsets = chunk.buffers()[1]
                    first, last = (int(x) for x in pa.Array.from_buffers(
                        pa.int32(), len(chunk) + 1, [None, offsets], offset=chunk.offset).to_numpy()[[0, -1]])
                    h.update(memoryview(chunk.buffers()[2])[first:last])
        return prf(key, "population-digest", h.hexdigest()).hex()
    users = [str(x) for x in u.to_pylist()]
    recs = [str(x) for x in r.to_pylist()]
    for a, b in sorted(zip(users, recs)):
        h.update(a.encode("utf-8", "surrogatepass") + b"\x1f" + b.encode("utf-8", "surrogatepass") + b"\n")
    return prf(key, "population-digest", h.hexdigest()).hex()


_DIGEST_SLICE = 1 << 18     # rows hashed at a time: their lines and ids are copied (≈ 30 MB a slice)


def commitment(salt: str, obj: Any) -> str:
    """sha256(salt bytes ‖ canonical JSON of obj): hiding (the salt is secret) and binding."""
    return sha256_bytes(bytes.fromhex(salt) + canonical_json(obj))


def snapshot_commitment(key: bytes, snapshot_id: str, snapshot_sha256: str) -> tuple[str, str]:
    """(salt, commitment) of the snapshot a plan, certificate or PMixED release was built on.

    The snapshot's id and sha256 are content hashes (`snap-<16 hex>` names the records): published
    bare, anyone who knows every record but whether person u's are in the data recomputes both and
    learns membership exactly (issue 22). Public documents carry this salted commitment instead; the
    real id and sha256 stay in the plan's annex (`plan_inputs`), with the salt. The salt is the keyed
    PRF of the snapshot's sha256, so one snapshot always gives the same commitment (two releases of
    it are linkable, which says nothing about a person) and another snapshot an unrelated one."""
    salt = prf(key, "snapshot-commitment", snapshot_sha256).hex()
    return salt, commitment(salt, {"snapshot_id": snapshot_id, "snapshot_sha256": snapshot_sha256})


def plan_snapshot_ref(plan: Mapping, annex: Mapping | None = None) -> tuple[str, str]:
    """(snapshot_id, snapshot_sha256) the plan was built on, from its private annex (`plan_inputs`).

    The annex's salt opens the plan's public `data.snapshot_commitment`, which is checked. A plan
    from before the commitment (its public data section still names the snapshot) is read from there,
    so the plans of already-registered models keep loading."""
    data = plan.get("data") or {}
    inputs = (annex or {}).get("plan_inputs") or {}
    if inputs.get("snapshot_id") and inputs.get("snapshot_sha256"):
        sid, sha = str(inputs["snapshot_id"]), str(inputs["snapshot_sha256"])
        want, salt = data.get("snapshot_commitment"), inputs.get("snapshot_salt")
        if want and salt and commitment(salt, {"snapshot_id": sid, "snapshot_sha256": sha}) != want:
            raise VeilError(f"plan {str(plan.get('sha256'))[:12]}…: its annex's snapshot does not open the plan's "
                            "snapshot commitment; refusing to use it")
        return sid, sha
    if data.get("snapshot_id") and data.get("snapshot_sha256"):     # a plan from before the commitment
        return str(data["snapshot_id"]), str(data["snapshot_sha256"])
    raise VeilError(f"plan {str(plan.get('sha256'))[:12]}…: its snapshot is named only in its private annex; "
                    "load the annex (components.draws.annex.load_annex) to find it")


def snapshot_label(doc: Mapping) -> str:
    """How a plan or certificate's snapshot is named where the public reads: its commitment's prefix
    (`snapshot commitment 1a2b3c4d5e6f…`), or the id an old document published anyway."""
    data = doc.get("data") or doc.get("dataset") or {}
    if data.get("snapshot_commitment"):
        return f"commitment {str(data['snapshot_commitment'])[:12]}…"
    return str(data.get("snapshot_id") or "?")


def annex_dir(private_dir: str | Path) -> Path:
    return Path(private_dir) / "plans"


def _body(annex: Mapping) -> dict:
    return {k: v for k, v in annex.items() if k != "salt"}


def seal_annex(key: bytes, annex: Mapping) -> tuple[dict, str]:
    """Add a deterministic salt (keyed on the content) and return (annex, its commitment)."""
    body = {**_body(annex), "schema": ANNEX_SCHEMA}
    salt = prf(key, "annex-salt", body).hex()
    return {**body, "salt": salt}, commitment(salt, body)


def save_annex(private_dir: str | Path, plan_sha256: str, annex: Mapping) -> Path:
    """Write `private_dir/plans/<plan sha>.annex.json` (0600)."""
    d = annex_dir(private_dir)
    _private_mkdir(d)
    path = d / f"{plan_sha256}.annex.json"
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(dict(annex), indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path


def verify_annex(annex: Mapping, plan: Mapping) -> dict:
    """Refuse an annex that is not the one `plan` committed to."""
    want = (plan.get("annex") or {}).get("commitment")
    if not want:
        raise VeilError(f"plan {str(plan.get('sha256'))[:12]}…: no annex commitment (a plan from before the "
                        "public/private split); re-plan it")
    salt = annex.get("salt")
    if not isinstance(salt, str) or len(salt) != 64:
        raise VeilError("plan annex: no valid salt; the annex is damaged")
    if commitment(salt, _body(annex)) != want:
        raise VeilError(f"plan annex does not match the commitment in plan {str(plan.get('sha256'))[:12]}…: "
                        "it was altered or belongs to another plan; refusing to use it")
    return dict(annex)


def load_annex(private_dir: str | Path, plan: Mapping) -> dict:
    """The annex of `plan` from `private_dir`, checked against the plan's commitment."""
    path = annex_dir(private_dir) / f"{plan['sha256']}.annex.json"
    if not path.is_file():
        raise VeilError(f"plan {str(plan['sha256'])[:12]}…: its private annex {path} is missing (plans are "
                        "usable only on the Veil home that made them)")
    try:
        annex = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise VeilError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(annex, dict):
        raise VeilError(f"{path}: an annex is a JSON object")
    annex = verify_annex(annex, plan)
    annex["_dir"] = str(annex_dir(private_dir))
    return annex


def annex_file(annex: Mapping, key: str, *, check: bool = True) -> Path | None:
    """The absolute path of the annex's `<key>_file` (stored relative to the annex folder), its
    sha256 checked against `<key>_sha256`. None when the annex has no such file."""
    rel = annex.get(f"{key}_file")
    if not rel:
        return None
    path = Path(rel) if Path(rel).is_absolute() else Path(annex.get("_dir", ".")) / rel
    if check:
        if not path.is_file():
            raise VeilError(f"plan annex: {key.replace('_', ' ')} file {path} is missing")
        if sha256_file(path) != annex.get(f"{key}_sha256"):
            raise VeilError(f"plan annex: {key.replace('_', ' ')} file {path} does not match its sha256 in the "
                            "annex: refusing to use it")
    return path


def attach_annex(private_dir: str | Path, plan: Mapping, annex: Mapping) -> dict:
    """Seal `annex` under this home's key, store it for `plan`, and return the plan with its commitment.

    For plans assembled by hand (tests, benches); `make_plan` does the same for real plans, before
    sealing the plan's own hash."""
    sealed, digest = seal_annex(plan_key(private_dir), annex)
    save_annex(private_dir, plan["sha256"], sealed)
    return {**plan, "annex": {"schema": ANNEX_SCHEMA, "commitment": digest}}
