"""Debian changelogs: one record per entry of every `changelog.Debian[.gz]` under a directory.

Every Debian system ships one per installed package (`/usr/share/doc/<pkg>/changelog.Debian.gz`),
written by hundreds of maintainers over decades: a real multi-person corpus already on the machine.

An entry (Debian Policy §4.4) is

    package (version) distribution(s); urgency=…
    <blank>
      * change details
    <blank>
     -- Maintainer Name <email>  Day, dd Mon yyyy hh:mm:ss +zzzz

The trailer's maintainer address (lower-cased) is the user, its RFC 2822 date the timestamp. The
record's text is the header line and the body — never the trailer, so the text does not name its
own author; addresses mentioned in the body ("Thanks to … <x@y>") are left for the email detector
to tag as secrets. Package, version, distribution, urgency, the file and the maintainer's name go to
metadata (`author_name`: how the catalog spots one person behind several addresses).

Bad entries are quarantined at `<file>:<line>`: a header or trailer that does not parse, an entry
without its trailer, a date that is no date, bytes that are not UTF-8. A file that is not valid gzip
is one quarantined row with a one-line reason. Text after a `# …`, `Old Changelog:` or
`Local variables:` line is not entries (dpkg-parsechangelog stops there too) and is skipped.

Nothing outside the given directory is read: the walk does not follow directory links, a file link
pointing outside is quarantined (named, never opened), and a link pointing inside is read once, at
its real path (many binary packages of one source ship the same changelog as a link).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import zlib
from pathlib import Path
from typing import Iterator

import pyarrow as pa

from catalog.connectors.base import GZIP_MAGIC, RAW_KEEP, RawRows
from catalog.dates import parse_timestamp
from components.core.errors import VeilError

_BATCH = 5_000
NAMES = ("changelog.Debian.gz", "changelog.Debian")
# A changelog larger than this decompressed is refused (quarantined), not read: a gzip bomb in a
# directory someone else can write to must not exhaust memory. The largest on a Debian system is ~2 MiB.
MAX_DECOMPRESSED = 64 << 20
_HEADER = re.compile(r"^(\w[-+0-9a-z.]*) \(([^()\s]+)\)((?:\s+[-+0-9A-Za-z./]+)+)\s*;\s*(.*)$")
_TRAILER = re.compile(r"^ -- (.+?) <([^<>\s]+@[^<>\s]+)>  ?(.+?)\s*$")
_STOP = re.compile(r"^(# |#$|old changelog:|local variables:)", re.IGNORECASE)


def _inside(real: str, root_real: str) -> bool:
    return real == root_real or real.startswith(root_real.rstrip(os.sep) + os.sep)


def _rel(p: Path, root: Path) -> str:
    return os.fsencode(p.relative_to(root).as_posix()).decode("utf-8", "backslashreplace")


def _decompress(raw: bytes) -> bytes:
    """gzip (possibly several members) or plain bytes; VeilError with one line on a bad stream."""
    if raw[:2] != GZIP_MAGIC:
        return raw
    out, data = bytearray(), raw
    while data:
        dec = zlib.decompressobj(wbits=47)
        try:
            out += dec.decompress(data, MAX_DECOMPRESSED + 1 - len(out))
        except zlib.error as e:
            raise VeilError(f"corrupt gzip stream: {e}") from None
        if len(out) > MAX_DECOMPRESSED:
            raise VeilError(f"too large: over {MAX_DECOMPRESSED >> 20} MiB decompressed, not read")
        if not dec.eof:
            raise VeilError("truncated gzip stream: it ends before its end-of-stream marker")
        data = dec.unused_data
        if data and data[:2] != GZIP_MAGIC:
            break  # trailing garbage after the last member: gzip(1) ignores it too
    return bytes(out)


def parse_changelog(data: bytes) -> Iterator[dict]:
    """Entries of one changelog: {line, header fields, body, name, email, date} or {line, error, raw}."""
    lines = data.split(b"\n")
    cur: dict | None = None
    for i, b in enumerate(lines, start=1):
        try:
            line = b.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError as e:
            line = None
            bad = f"undecodable bytes: line {i} is not UTF-8 at byte {e.start}"
        if cur is None:
            if line is None:
                yield {"line": i, "error": bad, "raw": b}
                continue
            if not line.strip():
                continue
            if _STOP.match(line):
                return
            m = _HEADER.match(line)
            if m is None:
                yield {"line": i, "error": f"bad entry header: {line[:80]!r} is not 'package (version) dist; urgency=…'",
                       "raw": b}
                # skip to the next line that parses as a header (the rest of this entry is not ours to guess)
                cur = {"line": i, "skip": True, "body": [], "raw": [b]}
                continue
            cur = {"line": i, "package": m.group(1), "version": m.group(2),
                   "distribution": " ".join(m.group(3).split()), "options": m.group(4).strip(),
                   "header": line, "body": [], "raw": [b], "bad": None}
            continue
        cur["raw"].append(b)
        if line is None:
            if not cur.get("skip") and cur["bad"] is None:
                cur["bad"] = bad
            continue
        if line.startswith(" -- "):
            if cur.get("skip"):
                cur = None
                continue
            t = _TRAILER.match(line)
            raw = b"\n".join(cur["raw"])[:RAW_KEEP]
            if cur["bad"]:
                yield {"line": cur["line"], "error": cur["bad"], "raw": raw}
            elif t is None:
                yield {"line": i, "error": f"bad trailer: {line[:80]!r} is not ' -- Name <email>  date'", "raw": raw}
            else:
                ts = parse_timestamp(t.group(3))
                if ts is None:
                    yield {"line": i, "error": f"bad timestamp: trailer date {t.group(3)[:60]!r} is not RFC 2822",
                           "raw": raw}
                else:
                    body = "\n".join(cur["body"]).strip("\n")
                    yield {**{k: cur[k] for k in ("line", "package", "version", "distribution", "options", "header")},
                           "body": body, "name": t.group(1).strip(), "email": t.group(2).strip().lower(), "ts": ts}
            cur = None
            continue
        if cur.get("skip"):
            if _HEADER.match(line):  # a new entry begins without the broken one's trailer
                cur = None
                m = _HEADER.match(line)
                cur = {"line": i, "package": m.group(1), "version": m.group(2),
                       "distribution": " ".join(m.group(3).split()), "options": m.group(4).strip(),
                       "header": line, "body": [], "raw": [b], "bad": None}
            continue
        if _HEADER.match(line) and not line.startswith(" "):
            # the next entry started: this one never got its trailer
            yield {"line": cur["line"], "error": "entry without trailer: no ' -- Name <email>  date' line before "
                                                 f"the next entry at line {i}",
                   "raw": b"\n".join(cur["raw"][:-1])[:RAW_KEEP]}
            m = _HEADER.match(line)
            cur = {"line": i, "package": m.group(1), "version": m.group(2),
                   "distribution": " ".join(m.group(3).split()), "options": m.group(4).strip(),
                   "header": line, "body": [], "raw": [b], "bad": None}
            continue
        if _STOP.match(line) and not line.startswith(" "):
            yield {"line": cur["line"], "error": "entry without trailer: the file's entries end first",
                   "raw": b"\n".join(cur["raw"][:-1])[:RAW_KEEP]}
            return
        cur["body"].append(line)
    if cur is not None and not cur.get("skip"):
        yield {"line": cur["line"], "error": "entry without trailer: the file ends first",
               "raw": b"\n".join(cur["raw"])[:RAW_KEEP]}


class DebianChangelogSource:
    format = "debian-changelog"
    default_source = "changelog"
    progress_unit = "files"

    def __init__(self, path: Path):
        self.path = Path(path)
        if not self.path.is_dir():
            raise VeilError(f"{self.path}: debian-changelog source must be a directory")
        self._files = list(self._walk())
        self._done = 0
        self._sha = hashlib.sha256(b"debian-changelog\n")

    @property
    def sha256(self) -> str:
        return self._sha.hexdigest()

    @property
    def progress_total(self) -> int:
        return len(self._files)

    @property
    def progress_done(self) -> int:
        return self._done

    def _walk(self) -> list[tuple[str, Path | None, str | None]]:
        """(relative name, path to read or None, error) for every changelog, in a stable order.
        Links are resolved but never followed out of the tree; each real file is read once."""
        root_real = os.path.realpath(self.path)
        seen: set[str] = set()
        out = []
        for root, dirs, files in os.walk(self.path, followlinks=False):
            dirs.sort()
            for f in sorted(files):
                if f not in NAMES:
                    continue
                p = Path(root) / f
                rel = _rel(p, self.path)
                real = os.path.realpath(p)
                if not _inside(real, root_real):
                    out.append((rel, None, f"outside the source: symbolic link to a path outside {self.path}"))
                    continue
                if real in seen or not os.path.isfile(real):
                    continue
                seen.add(real)
                out.append((rel, Path(real), None))
        # links found before their target is walked still read the target once, under the first name
        return out

    def entries(self) -> Iterator[tuple[str, dict]]:
        for rel, p, err in self._files:
            self._done += 1
            if err is not None:
                self._sha.update(os.fsencode(rel) + b"\0link")
                yield rel, {"line": None, "error": err, "raw": b""}
                continue
            raw = p.read_bytes()
            self._sha.update(os.fsencode(rel) + b"\0" + hashlib.sha256(raw).digest())
            try:
                data = _decompress(raw)
            except VeilError as e:
                yield rel, {"line": None, "error": str(e), "raw": raw[:256]}
                continue
            for e in parse_changelog(data):
                yield rel, e

    def batches(self) -> Iterator[pa.Table]:
        rows = RawRows(())
        n = 0
        for rel, e in self.entries():
            n += 1
            pos = {"seq": n, "line": e["line"], "offset": None,
                   "locator": f"{rel}:{e['line']}" if e["line"] else rel}
            if e.get("error"):
                rows.add(**pos, path=rel, error=e["error"], raw=bytes(e.get("raw") or b"")[:RAW_KEEP])
            else:
                text = e["header"] + ("\n\n" + e["body"] if e["body"] else "")
                meta = json.dumps({"package": e["package"], "version": e["version"],
                                   "distribution": e["distribution"], "urgency": e["options"], "file": rel,
                                   "author_name": e["name"]}, sort_keys=True, ensure_ascii=False)
                rows.add(**pos, user=e["email"], text=text, ts=e["ts"], path=rel, metadata=meta,
                         source_id=f"{e['package']}/{e['version']}")
            if len(rows) >= _BATCH:
                yield rows.table()
                rows = RawRows(())
        if len(rows):
            yield rows.table()
