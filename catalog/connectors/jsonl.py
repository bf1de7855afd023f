"""JSON Lines (optionally gzip): block reads through `pyarrow.json`, line by line only where a block fails.

The stream is cut at newlines into blocks of ~16 MiB. A block that decodes as UTF-8 and parses into as
many rows as it has non-blank lines takes the vectorised path; any other block (a malformed line, bad
bytes, a field of the wrong JSON type, an oversized line) is re-read line by line, so each bad line is
quarantined with its own line number and byte offset and the good lines around it are kept.
Blank lines are not records and are skipped. A line longer than `max_line_bytes` is never held in
memory whole: it is quarantined from its first 64 KiB and skipped to its newline.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from catalog.connectors.base import RAW_KEEP, FieldMap, HashedStream, RawRows, StreamedFile, as_text, meta_col
from catalog.schemas import RAW
from components.core.errors import VeilError


class JsonlSource(StreamedFile):
    format = "jsonl"
    default_source = "jsonl"

    # 16 MiB blocks: a few in flight as parsed tables (each pipeline thread holds one, its queue one or
    # two more: catalog/ingest.py), plus the raw block being cut. 8 MiB blocks
    # save ~180 MB of peak RSS on 1M records but cost ~15 % more CPU (per-block fixed costs in
    # pyarrow.json and the stage query); speed is the target here (docs/catalog.md, Memory and speed).
    def __init__(self, path: Path, fields: FieldMap, *, max_line_bytes: int = 4 << 20, block: int = 16 << 20,
                 start: int = 0, end: int | None = None, check_mapping: bool = True):
        """`start`/`end`: one shard of the file (catalog/shards.py): bytes [start, end), cut at line
        starts; its line numbers count from the shard's first line (`lines`: how many it held) and
        its byte offsets from the file's start. `check_mapping`: the first block's test for a wrong
        --user-field/--text-field (the first shard's only: the unsharded ingest runs it once)."""
        fields.check()
        self.path = Path(path)
        self.fields = fields
        self.max_line_bytes = max_line_bytes
        self.stream = HashedStream(self.path, block=block, start=start, end=end)
        self.start = start
        self.check_mapping = check_mapping
        self.lines = 0   # lines read (blank and bad ones too), once the stream is done
        names = fields.wanted()
        self._read_names = frozenset(names)
        self._schema = pa.schema([(n, pa.string()) for n in names])
        self.meta_names = tuple(fields.metadata)

    # -- the stream, cut into whole-line blocks ------------------------------------------------------
    def batches(self) -> Iterator[pa.Table]:
        checked = not self.check_mapping
        for t in self._batches():
            if not checked:
                checked = self._check_mapping(t)
            yield t

    def _check_mapping(self, t: pa.Table) -> bool:
        """A mapped user/text field absent from every well-formed line of the first block is a wrong
        --user-field/--text-field, not a million bad records: say so before quarantining them all."""
        ok = pc.is_null(t.column("error"))
        if not pc.any(ok).as_py():
            return False
        for role, col, name in (("user", "user", self.fields.user), ("text", "text", self.fields.text)):
            present = pc.sum(pc.and_(ok, pc.is_valid(t.column(col)))).as_py() or 0
            if present == 0:
                keys = self._first_keys()
                raise VeilError(f"{self.path}: no line of the first block has the {role} field {name!r}"
                                + (f" (line 1 has: {', '.join(keys)})" if keys else "")
                                + f"; pass --{role}-field")
        return True

    def _first_keys(self) -> list[str]:
        try:
            for chunk in HashedStream(self.path, block=1 << 16).chunks():
                line = chunk.lstrip(b"\xef\xbb\xbf").split(b"\n", 1)[0]
                obj = json.loads(line.decode("utf-8"))
                return sorted(obj)[:20] if isinstance(obj, dict) else []
        except (ValueError, UnicodeDecodeError):
            return []
        return []

    def _batches(self) -> Iterator[pa.Table]:
        carry = b""
        offset = self.start  # byte offset of `carry` in the decompressed stream
        line = 0        # lines before `carry`
        skipping = False
        first = self.start == 0   # (a byte-order mark can only open the file)
        for data in self.stream.chunks():
            if first:
                first = False
                if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark is not part of line 1
                    data, offset = data[3:], 3
            if skipping:  # inside an oversized line: drop bytes up to its newline
                nl = data.find(b"\n")
                if nl < 0:
                    offset += len(data)
                    continue
                offset += nl + 1
                line += 1
                data = data[nl + 1:]
                skipping = False
            buf = carry + data if carry else data
            cut = buf.rfind(b"\n")
            if cut < 0:
                carry = buf
                if len(carry) > self.max_line_bytes:
                    yield self._oversized(line + 1, offset, carry)
                    offset += len(carry)
                    carry = b""
                    skipping = True
                continue
            # A view, not a copy of the 16 MiB block (the carry, a partial line, is copied)
            block, carry = memoryview(buf)[:cut + 1], buf[cut + 1:]
            line += yield from self._block(block, offset, line)
            offset += len(block)
            if len(carry) > self.max_line_bytes:
                yield self._oversized(line + 1, offset, carry)
                offset += len(carry)
                carry = b""
                skipping = True
        if carry and not skipping:
            line += yield from self._block(memoryview(carry + b"\n"), offset, line)
        self.lines = line

    def _oversized(self, line: int, offset: int, head: bytes) -> pa.Table:
        rows = RawRows(self.meta_names)
        rows.add(seq=line, line=line, offset=offset,
                 error=f"oversized record: line longer than {self.max_line_bytes} bytes", raw=head[:RAW_KEEP])
        return rows.table()

    # -- one block ------------------------------------------------------------------------------------
    def _block(self, block: memoryview, offset: int, first_line: int):
        """Yields the block's rows; returns how many lines it held (its newlines)."""
        arr = np.frombuffer(block, dtype=np.uint8)
        ends = np.flatnonzero(arr == 10)
        starts = np.empty_like(ends)
        starts[0] = 0
        starts[1:] = ends[:-1] + 1
        lengths = ends - starts
        # Lines pyarrow skips: whitespace only. Counted exactly, so that "as many rows as non-blank
        # lines" really means one row per line (a line holding two objects makes the counts differ).
        blank = _blank_lines(arr, starts, ends)
        fast = None
        if not (lengths > self.max_line_bytes).any():
            try:
                str(block, "utf-8")  # not UTF-8: the block goes line by line
                fast = self._parse(block, int(lengths.max(initial=0)))
            except (UnicodeDecodeError, pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                fast = None
        keep = np.flatnonzero(~blank)
        if fast is not None and fast.num_rows == len(keep):
            line_no = first_line + 1 + keep
            cols = {"seq": pa.array(line_no, pa.int64()), "line": pa.array(line_no, pa.int64()),
                    "offset": pa.array(offset + starts[keep], pa.int64())}
            n = fast.num_rows
            for c, name in self.fields.columns().items():
                cols[c] = fast.column(name)
            for f in RAW:
                if f.name not in cols:
                    cols[f.name] = pa.nulls(n, f.type)
            names = list(RAW.names) + ["raw"] + [meta_col(m) for m in self.meta_names]
            arrays = [cols[f] for f in RAW.names] + [pa.nulls(n, pa.binary())] + \
                     [fast.column(m) for m in self.meta_names]
            yield pa.Table.from_arrays(arrays, names=names)
            return len(ends)
        yield self._slow(bytes(block), offset, first_line, starts, ends, blank)
        return len(ends)

    def _read(self, block: bytes, longest: int, schema: pa.Schema, unexpected: str) -> pa.Table:
        bs = max(1 << 20, 2 * (longest + 1))
        return pj.read_json(
            pa.BufferReader(block),  # (zero-copy over the block's bytes)
            read_options=pj.ReadOptions(use_threads=False, block_size=bs),
            parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior=unexpected,
                                          newlines_in_values=False),
        )

    def _parse(self, block: bytes, longest: int) -> pa.Table:
        """Parse with the field types learnt so far; on a type clash learn this block's scalar types
        (numbers and booleans become their JSON spelling, as on the line-by-line path) and retry once."""
        try:
            t = self._read(block, longest, self._schema, "ignore")
        except pa.ArrowInvalid:
            probe = self._read(block, longest, pa.schema([(self.fields.text, pa.string())]), "infer")
            fields = []
            for f in self._schema:
                typ = probe.schema.field(f.name).type if f.name in probe.column_names else pa.string()
                # The user and the text must be JSON strings (a number as a user id is quarantined
                # line by line, never spelled out: 123, 123.0 and 1.23e2 would be three people);
                # other fields' numbers and booleans become their JSON spelling.
                strict = f.name in (self.fields.text, self.fields.user)
                if strict or not (pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_boolean(typ)):
                    if not strict and (pa.types.is_nested(typ) or pa.types.is_binary(typ)):
                        raise  # objects/arrays in a mapped field: line by line
                    typ = pa.string()
                fields.append((f.name, typ))
            learnt = pa.schema(fields)
            if learnt.equals(self._schema):
                raise
            self._schema = learnt
            t = self._read(block, longest, self._schema, "ignore")
        cols = [c if pa.types.is_string(c.type) else pc.cast(c, pa.string()) for c in t.columns]
        return pa.Table.from_arrays(cols, names=t.column_names)

    def _slow(self, block: bytes, offset: int, first_line: int, starts, ends, blank) -> pa.Table:
        rows = RawRows(self.meta_names)
        colmap = self.fields.columns()
        for i in range(len(starts)):
            if blank[i]:
                continue
            s, e = int(starts[i]), int(ends[i])
            raw = block[s:e]
            pos = dict(seq=first_line + 1 + i, line=first_line + 1 + i, offset=offset + s)
            if not raw.strip():
                continue
            if len(raw) > self.max_line_bytes:
                rows.add(**pos, error=f"oversized record: line longer than {self.max_line_bytes} bytes",
                         raw=raw[:RAW_KEEP])
                continue
            try:
                txt = raw.decode("utf-8")
            except UnicodeDecodeError as ex:
                rows.add(**pos, error=f"undecodable bytes: not UTF-8 at byte {ex.start} of the line", raw=raw[:RAW_KEEP])
                continue
            try:
                obj = json.loads(txt, object_pairs_hook=_Object)
            except json.JSONDecodeError as ex:
                rows.add(**pos, error=f"malformed JSON: {ex.msg} at column {ex.colno}", raw=raw[:RAW_KEEP])
                continue
            if not isinstance(obj, dict):
                rows.add(**pos, error=f"not a JSON object: a JSON {_json_type(obj)}", raw=raw[:RAW_KEEP])
                continue
            dup = _duplicate_key(obj, self._read_names)
            if dup:
                rows.add(**pos, error=f"duplicate key: {dup} appears twice in the object (which one counts is "
                                      "a guess no reader may make)", raw=raw[:RAW_KEEP])
                continue
            vals = {}
            err = None
            for c, name in colmap.items():
                v = obj.get(name)
                if c in ("text", "user") and v is not None and not isinstance(v, str):
                    err = f"wrong type: field {name!r} ({c}) is a JSON {_json_type(v)}, not a string"
                vals[c] = as_text(v)
            for m in self.meta_names:
                vals[meta_col(m)] = as_text(obj.get(m))
            if err is None:
                err = _lone_surrogate(vals)
            if err:
                rows.add(**pos, error=err, raw=raw[:RAW_KEEP])
            else:
                rows.add(**pos, **vals)
        return rows.table()


def _blank_lines(arr: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Which lines hold only whitespace (space, tab, CR). A line whose first byte is '{' is not blank,
    so only the other lines (few, in JSONL) are scanned byte by byte; many of them: one vector pass."""
    first = arr[starts]          # a line's first byte (its newline when the line is empty)
    maybe = np.flatnonzero(first != 123)
    if len(maybe) > 256:
        solid = (arr != 32) & (arr != 9) & (arr != 13) & (arr != 10)
        return ~np.logical_or.reduceat(solid, starts)  # each line's bytes, its newline included
    blank = np.zeros(len(starts), dtype=bool)
    for i in maybe:
        line = arr[starts[i]:ends[i]]
        blank[i] = not bool(((line != 32) & (line != 9) & (line != 13)).any())
    return blank


class _Object(dict):
    """A JSON object that remembers the keys written more than once (Python's json keeps the last)."""

    __slots__ = ("dups",)

    def __init__(self, pairs):
        super().__init__(pairs)
        self.dups = ()
        if len(self) != len(pairs):
            seen, dups = set(), []
            for k, _ in pairs:
                if k in seen and k not in dups:
                    dups.append(k)
                seen.add(k)
            self.dups = tuple(dups)


def _duplicate_key(obj: "_Object", read: frozenset) -> str | None:
    """The first duplicated key among the fields ingest reads (and anywhere inside their values), as
    'field' or 'field.key'. Keys of fields it does not read are not looked at: pyarrow's block path
    ignores those fields, and a line must get the same answer on either path."""
    for k in obj.dups:
        if k in read:
            return repr(k)
    for k in read:
        v = obj.get(k)
        if isinstance(v, (dict, list)):
            inner = _nested_dup(v)
            if inner is not None:
                return repr(f"{k}.{inner}")
    return None


def _nested_dup(v) -> str | None:
    if isinstance(v, dict):
        if getattr(v, "dups", ()):
            return v.dups[0]
        items = v.items()
    elif isinstance(v, list):
        items = enumerate(v)
    else:
        return None
    for k, x in items:
        inner = _nested_dup(x)
        if inner is not None:
            return f"{k}.{inner}"
    return None


def _json_type(v) -> str:
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, dict):
        return "object"
    if isinstance(v, list):
        return "array"
    if v is None:
        return "null"
    return "string"


def _lone_surrogate(vals: dict) -> str | None:
    """JSON may escape half of a UTF-16 pair ("\\ud800"): valid JSON, but no Unicode text can hold it."""
    for k, v in vals.items():
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                name = k[5:] if k.startswith("meta:") else k
                return (f"undecodable text: field {name!r} holds a lone surrogate "
                        f"(\\u{ord(v[e.start]):04x}) at character {e.start}")
    return None
