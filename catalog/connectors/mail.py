"""Email: mbox files (optionally gzip) and maildir trees (the Enron layout: any folder of message files).

One record per message; the user is the sender: the From header's angle address (or its one bare
address), lower-cased. A display name that is another address, or a From naming two people, is
ambiguous and quarantined, never credited (catalog/connectors/addresses.py; To/Cc alike). The text is the
sender's own words only: quoted replies (`>` lines, "On … wrote:", "-----Original Message-----",
Outlook/Lotus Notes header blocks) and forwarded messages are cut, because a per-user bound means
nothing if one user's words sit in another user's records. Recipients (To/Cc) go to metadata; Bcc is
dropped (the other recipients were never meant to see it). Attachments are not ingested — their
names, types and sizes go to metadata. See docs/catalog.md.
"""
from __future__ import annotations

import email
import email.policy
import email.utils
import hashlib
import html
import json
import os
import re
from pathlib import Path
from typing import Iterator

import pyarrow as pa

from catalog.connectors.addresses import mailboxes
from catalog.connectors.base import RAW_KEEP, HashedStream, RawRows
from components.core.errors import VeilError
from components.core.identity import person_id_or_empty

_BATCH = 5_000

# Lines that start someone else's text: everything from the first of them on is cut.
_CUT_MARKERS = [
    ("original_message", re.compile(r"^\s*-{2,}\s*Original Message\s*-{2,}\s*$", re.I)),
    ("original_message", re.compile(r"^\s*-{2,}\s*Original Appointment\s*-{2,}\s*$", re.I)),
    ("forwarded", re.compile(r"^\s*-{2,}\s*Forwarded (?:message|by\b).*$", re.I)),
    ("forwarded", re.compile(r"^\s*Begin forwarded message:?\s*$", re.I)),
    ("forwarded", re.compile(r"^\s*-{5,}\s*Forwarded\b.*$", re.I)),
]
_ON_WROTE = re.compile(r"^\s*On\b.{0,300}\bwrote:\s*$", re.I | re.S)
_HEADER_FROM = re.compile(r"^\s*\*?From:\*?\s+\S", re.I)
_HEADER_NEXT = re.compile(r"^\s*\*?(?:Sent|Date|To|Subject|Cc):\*?\s", re.I)
# Lotus Notes (Enron): "Jane Doe@ENRON" / "01/02/2001 03:04 PM" / "To: …" / "cc: …" / "Subject: …"
_NOTES_DATE = re.compile(r"\b\d{1,2}/\d{1,2}/\d{2,4}\s+\d{1,2}:\d{2}(?::\d{2})?\s*(?:AM|PM)?\b", re.I)
_NOTES_TO = re.compile(r"^\s*To:\s", re.I)
_TAG = re.compile(r"<[^>]*>")
# An mbox separator line with its asctime date: "From sender@x Mon Jan  2 03:04:05 2006".
_FROM_LINE = re.compile(rb"^From \S+\s+(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) "
                        rb"[ \d]?\d \d\d:\d\d(?::\d\d)?\s.*\d{4}\s*$")
# An RFC 5322 header field: printable ASCII name, colon.
_HEADER_LINE = re.compile(rb"^[!-9;-~]+:")


def _find_cut(lines: list[str]) -> tuple[int, str | None]:
    """Index of the first line of someone else's text (len(lines) if none), and which rule found it."""
    for i, line in enumerate(lines):
        for name, rx in _CUT_MARKERS:
            if rx.match(line):
                return i, name
        if line.lstrip().lower().startswith("on "):
            two = line + " " + lines[i + 1] if i + 1 < len(lines) else line
            if _ON_WROTE.match(line) or _ON_WROTE.match(two):
                return i, "reply_attribution"
        if _HEADER_FROM.match(line) and any(_HEADER_NEXT.match(x) for x in lines[i + 1:i + 5]):
            return i, "reply_header"
        if len(line) < 120 and _NOTES_DATE.search(line) and any(_NOTES_TO.match(x) for x in lines[i + 1:i + 4]):
            if i > 0 and lines[i - 1].strip() and len(lines[i - 1]) < 80:
                return i - 1, "notes_header"  # the author's name line above the date
            return i, "notes_header"
    return len(lines), None


def strip_quoted(text: str) -> tuple[str, dict]:
    """The sender's own text of a message body, and what was cut (for metadata)."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    cut_at, how = _find_cut(lines)
    own = lines[:cut_at]
    quoted = sum(1 for x in own if x.lstrip().startswith(">"))
    own = [x for x in own if not x.lstrip().startswith(">")]
    while own and not own[-1].strip():
        own.pop()
    while own and not own[0].strip():
        own.pop(0)
    return "\n".join(own), {"cut": how, "cut_lines": len(lines) - cut_at, "quoted_lines": quoted}


def _header_values(msg, header: str) -> str:
    """Every `header` field of the message, raw (before Python's address parser, which credits
    `victim@corp <eve@evil>` to the victim), joined as one address list."""
    return ", ".join(str(v) for k, v in msg.raw_items() if k.lower() == header.lower())


def _people(msg, header: str) -> tuple[list, str | None]:
    """(mailboxes, why ambiguous) of an address header (catalog/connectors/addresses.py)."""
    try:
        return mailboxes(_header_values(msg, header))
    except Exception as e:  # noqa: BLE001 - a header Python cannot even hand over: ambiguous, never guessed
        return [], f"unreadable {header} header ({type(e).__name__})"


def _body(msg) -> tuple[str | None, str | None]:
    """(text, error): the plain-text body (or HTML with tags stripped)."""
    try:
        part = msg.get_body(preferencelist=("plain", "html"))
    except Exception:  # noqa: BLE001 - malformed MIME trees
        part = None
    if part is None:
        if msg.get_content_maintype() == "multipart":
            return None, None
        part = msg
        if part.get_content_maintype() != "text":
            return None, None
    try:
        content = part.get_content()
    except (LookupError, UnicodeError, ValueError, AssertionError):
        payload = part.get_payload(decode=True) or b""
        try:
            content = payload.decode("utf-8")
        except UnicodeDecodeError as e:
            return None, f"undecodable bytes: body charset {part.get_content_charset()!r}, not UTF-8 at byte {e.start}"
    if not isinstance(content, str):
        return None, None
    if part.get_content_subtype() == "html":
        content = html.unescape(_TAG.sub(" ", re.sub(r"(?is)<(script|style).*?</\1>", " ", content)))
        content = re.sub(r"[ \t]+", " ", content)
    return content, None


def _attachments(msg) -> list[dict]:
    out = []
    for part in msg.walk():
        if part.is_multipart():
            continue
        disp = part.get_content_disposition()
        if disp == "attachment" or (disp is None and part.get_content_maintype() not in ("text", "multipart")):
            payload = part.get_payload(decode=True) or b""
            out.append({"filename": part.get_filename(), "content_type": part.get_content_type(), "bytes": len(payload)})
    return out


def parse_message(raw: bytes) -> dict:
    """A message → {user, text, ts, source_id, metadata, error}."""
    try:
        msg = email.message_from_bytes(raw, policy=email.policy.default)
    except Exception as e:  # noqa: BLE001 - the stdlib parser rarely raises; be safe
        return {"error": f"malformed message: {e}"}
    # The sender is the angle address; a display name that is another address (Outlook writes
    # `victim@corp <eve@evil>` unquoted) or a From naming two people is ambiguous: quarantined with
    # the reason, never credited to either (docs/catalog.md, "Email: what is credited to the sender").
    froms, why = _people(msg, "From")
    if why:
        return {"error": f"ambiguous sender: {why}"}
    if not froms:
        return {"error": "missing user: no sender address in From"}
    persons = {person_id_or_empty(m.addr) for m in froms}
    if len(persons) > 1:
        return {"error": f"ambiguous sender: From names {len(persons)} addresses"}
    senders = [froms[0].addr]
    # To/Cc own the record under `ownership: all-participants`: read by the same rule
    recipients = {}
    for h in ("To", "Cc"):
        boxes, why = _people(msg, h)
        if why:
            return {"error": f"ambiguous recipient: {why} ({h})", "user": senders[0]}
        recipients[h.lower()] = [m.addr for m in boxes]
    body, err = _body(msg)
    if err:
        return {"error": err, "user": senders[0]}
    own, info = strip_quoted(body or "")
    ts = None
    if msg.get("Date"):
        try:
            dt = email.utils.parsedate_to_datetime(str(msg["Date"]))
            ts = dt.isoformat() if dt is not None and dt.tzinfo is not None else (dt.isoformat() + "+00:00" if dt else None)
        except (TypeError, ValueError, IndexError):
            ts = None
    from_name = froms[0].name  # the sender's display name: how ingest spots one person behind several addresses
    meta = {
        "from_name": from_name,
        "message_id": str(msg.get("Message-ID", "")).strip() or None,
        "subject": str(msg.get("Subject", "")) or None,
        "to": recipients["to"],
        "cc": recipients["cc"],
        "in_reply_to": str(msg.get("In-Reply-To", "")).strip() or None,
        "attachments": _attachments(msg),
        "quoted": info,
    }
    if ts is None and msg.get("Date"):
        meta["date_raw"] = str(msg.get("Date"))
    if not own.strip():
        return {"error": "missing text: no text of the sender's own (empty, or only quoted/forwarded text)",
                "user": senders[0]}
    return {"user": senders[0], "text": own, "ts": ts, "source_id": meta["message_id"],
            "metadata": json.dumps({k: v for k, v in meta.items() if v not in (None, [], {})}, sort_keys=True,
                                   ensure_ascii=False)}


def _inside(real: str, root_real: str) -> bool:
    return real == root_real or real.startswith(root_real.rstrip(os.sep) + os.sep)


def _rel(p: Path, root: Path) -> str:
    """A relative path as readable text: bytes that are not UTF-8 become \\x escapes (file names are bytes)."""
    return os.fsencode(p.relative_to(root).as_posix()).decode("utf-8", "backslashreplace")


class MailSource:
    default_source = "mail"

    def __init__(self, path: Path, fmt: str):
        self.path = Path(path)
        self.format = fmt
        self._sha = hashlib.sha256()
        self._done = 0
        self._total = None
        if fmt == "mbox":
            self._stream = HashedStream(self.path)
            self._total = self._stream.size

    @property
    def sha256(self) -> str:
        return self._stream.sha256 if self.format == "mbox" else self._sha.hexdigest()

    @property
    def progress_unit(self) -> str:
        return "bytes" if self.format == "mbox" else "messages"

    @property
    def progress_total(self):
        return self._total

    @property
    def progress_done(self) -> int:
        return self._stream.bytes_read if self.format == "mbox" else self._done

    def messages(self) -> Iterator[tuple[dict, bytes]]:
        """(position, raw bytes) of every message."""
        return self._mbox() if self.format == "mbox" else self._maildir()

    def _mbox(self):
        """Split an mbox into messages. A `From ` line after a blank line starts a message (mboxo/rd);
        a `From ` line with an asctime date starts one even without the blank line (the previous
        message was truncated: its end must not swallow the next sender's message). Text before the
        first separator is a message of its own if it starts with a header, never dropped; a file
        that neither starts with a separator nor a header is not an mbox (one-line error)."""
        n, line_no, offset = 0, 0, 0
        cur: list[bytes] = []
        start: dict | None = None
        prev_blank = True
        carry = b""
        seen_content = False
        for chunk in self._stream.chunks():
            data = carry + chunk
            lines = data.split(b"\n")
            carry = lines.pop()
            for ln in lines:
                line_no += 1
                if ln.startswith(b"From ") and (prev_blank or _FROM_LINE.match(ln)):
                    if start is not None:
                        yield start, b"\n".join(cur)
                    n += 1
                    start = {"seq": n, "line": line_no, "offset": offset, "locator": f"message {n} (line {line_no})"}
                    cur = []
                    seen_content = True
                elif start is not None:
                    # mboxrd: one level of ">From " quoting is undone
                    cur.append(ln[1:] if re.match(rb"^>+From ", ln) else ln)
                elif not seen_content and ln.strip(b" \t\r"):
                    seen_content = True
                    if not _HEADER_LINE.match(ln):
                        raise VeilError(f"{self.path}: not an mbox file: line {line_no} is neither a 'From ' "
                                        "separator line nor a mail header")
                    # A leading message without its separator (a truncated file, a lone .eml): its own record.
                    n += 1
                    start = {"seq": n, "line": line_no, "offset": offset,
                             "locator": f"message {n} (line {line_no}, no 'From ' separator)"}
                    cur = [ln]
                prev_blank = not ln.strip()
                offset += len(ln) + 1
        if carry:
            line_no += 1
            if start is not None:
                cur.append(carry)
            elif carry.strip(b" \t\r"):
                if not _HEADER_LINE.match(carry):
                    raise VeilError(f"{self.path}: not an mbox file: line {line_no} is neither a 'From ' "
                                    "separator line nor a mail header")
                n += 1
                start = {"seq": n, "line": line_no, "offset": offset,
                         "locator": f"message {n} (line {line_no}, no 'From ' separator)"}
                cur = [carry]
        if start is None:
            raise VeilError(f"{self.path}: not an mbox file: no message in it (empty)")
        yield start, b"\n".join(cur)

    def _maildir(self):
        """Every message file under the folder. Symbolic links are not followed out of the tree: a link
        to a file outside it is quarantined (counted, named), never read. Names that are not UTF-8 are
        shown with backslash escapes."""
        n = 0
        root_real = os.path.realpath(self.path)
        unreadable: list[OSError] = []   # folders os.walk could not list: quarantined, never skipped silently
        for root, dirs, files in os.walk(self.path, onerror=unreadable.append):
            while unreadable:
                e = unreadable.pop(0)
                n += 1
                rel = _rel(Path(e.filename), self.path) if e.filename else "."
                self._sha.update(os.fsencode(rel) + b"\0unreadable")
                yield ({"seq": n, "line": n, "offset": None, "locator": rel,
                        "error": f"unreadable folder: {e.strerror or e}"}, b"")
            keep = []
            for d in sorted(dirs):
                if d.startswith(".") or d == "tmp":
                    continue
                dp = Path(root) / d
                if dp.is_symlink():
                    # os.walk does not descend into links; one pointing outside is reported
                    if not _inside(os.path.realpath(dp), root_real):
                        n += 1
                        yield ({"seq": n, "line": n, "offset": None, "locator": _rel(dp, self.path),
                                "error": "outside the source: folder is a symbolic link to a path outside "
                                         f"{self.path}"}, b"")
                    continue
                keep.append(d)
            dirs[:] = keep
            for f in sorted(files):
                if f.startswith("."):
                    continue
                p = Path(root) / f
                rel = _rel(p, self.path)
                if p.is_symlink() and not _inside(os.path.realpath(p), root_real):
                    n += 1
                    self._done = n
                    self._sha.update(os.fsencode(rel) + b"\0link")
                    yield ({"seq": n, "line": n, "offset": None, "locator": rel,
                            "error": f"outside the source: symbolic link to a path outside {self.path}"}, b"")
                    continue
                if not p.is_file():
                    continue
                try:
                    raw = p.read_bytes()
                except OSError as e:  # (chmod 000, an I/O error): this message is quarantined, the rest read
                    n += 1
                    self._done = n
                    self._sha.update(os.fsencode(rel) + b"\0unreadable")
                    yield ({"seq": n, "line": n, "offset": None, "locator": rel,
                            "error": f"unreadable file: {e.strerror or e}"}, b"")
                    continue
                self._sha.update(os.fsencode(rel) + b"\0" + hashlib.sha256(raw).digest())
                n += 1
                self._done = n
                yield {"seq": n, "line": n, "offset": None, "locator": rel, "folder": str(Path(rel).parent)}, raw
        for e in unreadable:  # a folder listed last
            n += 1
            rel = _rel(Path(e.filename), self.path) if e.filename else "."
            self._sha.update(os.fsencode(rel) + b"\0unreadable")
            yield ({"seq": n, "line": n, "offset": None, "locator": rel,
                    "error": f"unreadable folder: {e.strerror or e}"}, b"")

    def batches(self) -> Iterator[pa.Table]:
        rows = RawRows(())
        for pos, raw in self.messages():
            folder = pos.pop("folder", None)
            err = pos.pop("error", None)
            rec = {"error": err} if err else parse_message(raw)
            if rec.get("error"):
                rows.add(**pos, error=rec["error"], user=rec.get("user"), raw=raw[:RAW_KEEP])
            else:
                meta = rec["metadata"]
                if folder is not None:
                    d = json.loads(meta)
                    d["folder"] = folder
                    meta = json.dumps(d, sort_keys=True, ensure_ascii=False)
                rows.add(**pos, user=rec["user"], text=rec["text"], ts=rec["ts"], source_id=rec["source_id"],
                         metadata=meta)
            if len(rows) >= _BATCH:
                yield rows.table()
                rows = RawRows(())
        if len(rows):
            yield rows.table()
