"""CSV (optionally gzip) and Parquet sources with a field mapping.

CSV: the first row is the header; fields are mapped by name. Read with the stdlib `csv` module over a
streaming decoder, so quoted fields may span lines; a row's position is its number and the line it
starts on. A row with the wrong number of fields, bytes that are not UTF-8, or a field over the size
limit is quarantined; the rows around it are kept.

Parquet: read in row batches. The text column must be text (string, or binary decoded per row: bad
UTF-8 is quarantined), the user column text or integers (their decimal spelling); any other type
there — a float, a boolean, a struct, a list — quarantines its rows as `wrong type`, naming the
column and its type. Other mapped columns (time, id, source,
metadata) may be numbers, booleans or timestamps too (their decimal/ISO spelling).
"""
from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from catalog.connectors.base import RAW_KEEP, FieldMap, HashedStream, RawRows, StreamedFile, meta_col
from catalog.schemas import RAW
from components.core.errors import VeilError
from components.core.hashing import sha256_file

_BATCH = 20_000
_SURROGATE = re.compile("[\udc80-\udcff]")


class _ChunkReader(io.RawIOBase):
    """A readable binary stream over an iterator of byte chunks."""

    def __init__(self, chunks: Iterator[bytes]):
        self._it = chunks
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not self._buf:
            try:
                self._buf = next(self._it)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


class CsvSource(StreamedFile):
    format = "csv"
    default_source = "csv"

    def __init__(self, path: Path, fields: FieldMap, *, max_field_bytes: int = 4 << 20, delimiter: str = ","):
        fields.check()
        self.path = Path(path)
        self.fields = fields
        self.max_field_bytes = max_field_bytes
        self.delimiter = delimiter
        self.stream = HashedStream(self.path)
        self.meta_names = tuple(fields.metadata)

    def batches(self) -> Iterator[pa.Table]:
        csv.field_size_limit(max(self.max_field_bytes, 1 << 16))
        raw = io.BufferedReader(_ChunkReader(self.stream.chunks()), buffer_size=1 << 20)
        text = io.TextIOWrapper(raw, encoding="utf-8", errors="surrogateescape", newline="")
        reader = csv.reader(text, delimiter=self.delimiter)
        try:
            header = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise VeilError(f"{self.path}:1: CSV header is unreadable: {e}") from None
        header = [h.lstrip("\ufeff").strip() if i == 0 else h.strip() for i, h in enumerate(header)]
        index = {h: i for i, h in enumerate(header)}
        for role, name in (("user", self.fields.user), ("text", self.fields.text)):
            if name not in index:
                raise VeilError(f"{self.path}:1: header has no {role} column {name!r} (columns: {', '.join(header)})")
        colmap = {c: index.get(n) for c, n in self.fields.columns().items()}
        metamap = {m: index.get(m) for m in self.meta_names}
        rows = RawRows(self.meta_names)
        n = 0
        last_line = reader.line_num
        while True:
            start = last_line + 1
            try:
                rec = next(reader)
            except StopIteration:
                break
            except csv.Error as e:
                n += 1
                rows.add(seq=n, line=start, locator=f"row {n} (line {start})",
                         error=f"malformed CSV row: {e}", raw=None)
                last_line = reader.line_num
                continue
            last_line = reader.line_num
            if not rec:  # blank line: not a record
                continue
            n += 1
            pos = dict(seq=n, line=start, locator=f"row {n} (line {start})")
            joined = self.delimiter.join(rec)
            if len(rec) != len(header):
                rows.add(**pos, error=f"malformed CSV row: {len(rec)} fields, the header has {len(header)}",
                         raw=joined.encode("utf-8", "surrogateescape")[:RAW_KEEP])
            elif _SURROGATE.search(joined):
                bad = _SURROGATE.search(joined).start()
                rows.add(**pos, error=f"undecodable bytes: not UTF-8 at character {bad} of the row",
                         raw=joined.encode("utf-8", "surrogateescape")[:RAW_KEEP])
            else:
                vals = {c: (rec[i] if i is not None and rec[i] != "" else None) for c, i in colmap.items()}
                vals.update({meta_col(m): (rec[i] if i is not None and rec[i] != "" else None)
                             for m, i in metamap.items()})
                rows.add(**pos, **vals)
            if len(rows) >= _BATCH:
                yield rows.table()
                rows = RawRows(self.meta_names)
        if len(rows):
            yield rows.table()


def _is_text(t: pa.DataType) -> bool:
    """A column type whose values are text as they stand (strings, or bytes to decode as UTF-8)."""
    if pa.types.is_dictionary(t):
        return _is_text(t.value_type)
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)
            or pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)
            or pa.types.is_null(t))


def _as_strings(col: pa.ChunkedArray) -> tuple[pa.ChunkedArray, list[int]]:
    """A column as strings, and the rows whose bytes were not UTF-8 (binary columns only)."""
    t = col.type
    if pa.types.is_dictionary(t):  # (a pandas categorical): its values, not a JSON dump of each
        return _as_strings(col.cast(t.value_type))
    if pa.types.is_null(t):
        return col.cast(pa.string()), []
    if pa.types.is_string(t):
        return col, []
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return col.cast(pa.string()), []
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_decimal(t):
        return pc.cast(col, pa.string()), []
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        return pc.cast(col, pa.string()), []
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        try:
            return col.cast(pa.string()), []
        except pa.ArrowInvalid:
            vals, bad = [], []
            for i, v in enumerate(col.to_pylist()):
                try:
                    vals.append(None if v is None else v.decode("utf-8"))
                except UnicodeDecodeError:
                    vals.append(None)
                    bad.append(i)
            return pa.chunked_array([pa.array(vals, pa.string())]), bad
    # nested or other: compact JSON per row
    return pa.chunked_array([pa.array([None if v is None else json.dumps(v, default=str, sort_keys=True)
                                       for v in col.to_pylist()], pa.string())]), []


class ParquetSource:
    format = "parquet"
    default_source = "parquet"
    progress_unit = "rows"

    def __init__(self, path: Path, fields: FieldMap, *, batch_rows: int = 65_536):
        fields.check()
        self.path = Path(path)
        self.fields = fields
        self.batch_rows = batch_rows
        self.meta_names = tuple(fields.metadata)
        try:
            self.file = pq.ParquetFile(self.path)
        except (pa.ArrowInvalid, OSError) as e:
            raise VeilError(f"{self.path}: not a readable Parquet file ({e})") from None
        names = self.file.schema_arrow.names
        for role, name in (("user", fields.user), ("text", fields.text)):
            if name not in names:
                raise VeilError(f"{self.path}: no {role} column {name!r} (columns: {', '.join(names)})")
        self.columns = [n for n in fields.wanted() if n in names]
        self._done = 0
        self._sha = None

    @property
    def sha256(self) -> str:
        if self._sha is None:
            self._sha = sha256_file(self.path)
        return self._sha

    @property
    def progress_total(self) -> int:
        return self.file.metadata.num_rows

    @property
    def progress_done(self) -> int:
        return self._done

    def batches(self) -> Iterator[pa.Table]:
        base = 0
        colmap = self.fields.columns()
        it = self.file.iter_batches(batch_size=self.batch_rows, columns=self.columns)
        while True:
            try:
                batch = next(it)
            except StopIteration:
                break
            except (OSError, pa.ArrowException) as e:  # a damaged page: the file is bad, not one row
                raise VeilError(f"{self.path}: corrupt Parquet data after row {base} "
                                f"({str(e).splitlines()[0][:200]})") from None
            t = pa.Table.from_batches([batch])
            n = t.num_rows
            rowno = pa.array(range(base + 1, base + n + 1), pa.int64())
            cols: dict[str, pa.ChunkedArray | pa.Array] = {"seq": rowno, "line": rowno}
            errors = [None] * n
            for c, name in colmap.items():
                if name in t.column_names:
                    col = t.column(name)
                    if (c == "text" and not _is_text(col.type)) or \
                            (c == "user" and not (_is_text(col.type) or pa.types.is_integer(col.type))):
                        # A person id or a text must be text in the file (a user id may be a whole
                        # number: a typed column has one decimal spelling); a float (7.0 or 7?), a
                        # struct or a list spelled out would be an id or a text nobody wrote (issue 28)
                        allowed = "a string or an integer" if c == "user" else "a string"
                        why = f"wrong type: column {name!r} ({c}) is {col.type}, not {allowed}"
                        for i in pc.indices_nonzero(pc.is_valid(col)).to_pylist():
                            errors[i] = errors[i] or why
                        cols[c] = pa.nulls(n, pa.string())
                        continue
                    arr, bad = _as_strings(col)
                    for i in bad:
                        errors[i] = f"undecodable bytes: column {name!r} is not UTF-8"
                    cols[c] = arr
            cols["locator"] = pc.binary_join_element_wise("row ", pc.cast(rowno, pa.string()), "")
            if any(errors):
                cols["error"] = pa.array(errors, pa.string())
            arrays, names = [], []
            for f in RAW:
                arrays.append(cols.get(f.name, pa.nulls(n, f.type)))
                names.append(f.name)
            arrays.append(pa.nulls(n, pa.binary()))
            names.append("raw")
            for m in self.meta_names:
                arrays.append(_as_strings(t.column(m))[0] if m in t.column_names else pa.nulls(n, pa.string()))
                names.append(meta_col(m))
            base += n
            self._done = base
            yield pa.Table.from_arrays([a if isinstance(a, pa.ChunkedArray) else pa.chunked_array([a]) for a in arrays],
                                       names=names)
