"""What every connector shares: the field mapping, the raw batch it yields, a hashed byte stream."""
from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pyarrow as pa

from catalog.schemas import RAW
from components.core.errors import VeilError

GZIP_MAGIC = b"\x1f\x8b"
# Raw bytes kept with a quarantined record: enough to see what was wrong, bounded for huge lines.
RAW_KEEP = 64 * 1024


@dataclass(frozen=True)
class FieldMap:
    """Which source field is which record column (JSONL / CSV / Parquet)."""

    user: str = "user"
    text: str = "text"
    id: str | None = None
    time: str | None = None
    source: str | None = "source"
    path: str | None = "path"
    metadata: tuple[str, ...] = ()

    def columns(self) -> dict[str, str]:
        """RAW column -> source field name, for the fields that are mapped."""
        out = {"user": self.user, "text": self.text}
        for col, name in (("source_id", self.id), ("ts", self.time), ("source", self.source), ("path", self.path)):
            if name:
                out[col] = name
        return out

    def wanted(self) -> list[str]:
        """Every source field read, once each, in a stable order."""
        names: list[str] = []
        for n in list(self.columns().values()) + list(self.metadata):
            if n not in names:
                names.append(n)
        return names

    def check(self) -> None:
        if not self.user or not self.text:
            raise VeilError("field mapping: user and text fields must be named")
        if self.user == self.text:
            raise VeilError(f"field mapping: user and text are the same field {self.user!r}")


def meta_col(name: str) -> str:
    return "meta:" + name


@dataclass
class RawRows:
    """Column lists building one RAW batch (the slow paths and the non-JSON connectors use it)."""

    meta_names: tuple[str, ...] = ()
    cols: dict[str, list] = field(default_factory=dict)

    def __post_init__(self):
        for f in RAW.names:
            self.cols[f] = []
        self.cols["raw"] = []
        for m in self.meta_names:
            self.cols[meta_col(m)] = []

    def __len__(self) -> int:
        return len(self.cols["seq"])

    def add(self, **values) -> None:
        for k, lst in self.cols.items():
            lst.append(values.get(k))

    def table(self) -> pa.Table:
        arrays, names = [], []
        for f in RAW:
            arrays.append(pa.array(self.cols[f.name], type=f.type))
            names.append(f.name)
        arrays.append(pa.array(self.cols["raw"], type=pa.binary()))
        names.append("raw")
        for m in self.meta_names:
            arrays.append(pa.array(self.cols[meta_col(m)], type=pa.string()))
            names.append(meta_col(m))
        return pa.Table.from_arrays(arrays, names=names)


def as_text(v) -> str | None:
    """A JSON scalar as the string stored in a string column (numbers keep their JSON spelling)."""
    import json

    if v is None:
        return None
    if isinstance(v, str):
        return v
    return json.dumps(v, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


class HashedStream:
    """Reads a file in blocks, decompressing gzip (by magic bytes), hashing the bytes on disk.

    `start`/`end`: only those bytes of an uncompressed file (one shard of a sharded ingest,
    catalog/shards.py; its sha256 is then of those bytes only)."""

    def __init__(self, path: Path, block: int = 16 << 20, start: int = 0, end: int | None = None):
        self.path = Path(path)
        self.block = block
        self.sha = hashlib.sha256()
        self.bytes_read = 0          # on disk
        self.size = self.path.stat().st_size
        self.start, self.end = start, end

    @property
    def sha256(self) -> str:
        return self.sha.hexdigest()

    def chunks(self) -> Iterator[bytes]:
        ranged = self.start > 0 or self.end is not None
        left = (self.size if self.end is None else self.end) - self.start
        with open(self.path, "rb") as f:
            head = f.read(2)
            if ranged and head == GZIP_MAGIC:
                raise VeilError(f"{self.path}: a gzip file cannot be read in byte ranges (shards); decompress it first")
            f.seek(self.start)
            dec = zlib.decompressobj(wbits=47) if head == GZIP_MAGIC else None
            while True:
                data = f.read(min(self.block, left) if ranged else self.block)
                if not data:
                    break
                left -= len(data)
                self.sha.update(data)
                self.bytes_read += len(data)
                if dec is None:
                    yield data
                    continue
                try:
                    out = dec.decompress(data)
                    while dec.eof and dec.unused_data:  # concatenated gzip members
                        rest = dec.unused_data
                        dec = zlib.decompressobj(wbits=47)
                        out += dec.decompress(rest)
                except zlib.error as e:
                    raise VeilError(f"{self.path}: corrupt gzip stream near byte {self.bytes_read}: {e}") from None
                if out:
                    yield out
            if dec is not None:
                tail = dec.flush()
                if tail:
                    yield tail
                if not dec.eof:
                    raise VeilError(f"{self.path}: gzip stream is truncated")


class StreamedFile:
    """A connector that reads one file through `self.stream` (a HashedStream): the source's sha256
    and byte progress come from the stream."""

    stream: HashedStream

    @property
    def sha256(self) -> str:
        return self.stream.sha256

    @property
    def progress_total(self) -> int:
        return self.stream.size

    @property
    def progress_done(self) -> int:
        return self.stream.bytes_read
