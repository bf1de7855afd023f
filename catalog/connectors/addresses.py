"""Who a mail header names (From, To, Cc), read so that a display name cannot pass for an address.

    mailboxes("victim@corp.example <eve@evil.example>")
        -> ([], 'display name is another address')

The person a mailbox names is its angle address (`Name <addr>`), or, without angle brackets, its one
bare address. Python's parsers read `victim@corp.example <eve@evil.example>` — an address written
as an unquoted display name, as Outlook does — as the *display name's* address: Eve's words were
credited to the victim (issue 28). Here a display name (quoted or not, RFC 2047-encoded or not, in a
comment or not) that holds an address-like word which is not the same person as the mailbox's
address makes the header **ambiguous**: the caller quarantines the record with the reason, never
guesses. The same address in both places (`alice@x <alice@x>`, any case) is fine.

Read the way the identity rule reads ids (components.core.identity): Unicode NFKC first (a
full-width '＠' or '＜' is '@' or '<'), invisible format characters removed, so no spelling the
ledger counts as an address can hide in a display name.
"""
from __future__ import annotations

import email.errors
import email.header
import re
import unicodedata

from components.core.identity import person_id_or_empty

# An address-like word: something@something, none of the characters that delimit header tokens.
_ADDR_WORD = re.compile(r"[^\s<>()\[\]\",;:@\\]+@[^\s<>()\[\]\",;:@\\]+")
_ENCODED_WORD = re.compile(r"=\?[^?\s]+\?[bBqQ]\?[^?\s]*\?=")


class Mailbox:
    __slots__ = ("addr", "name")

    def __init__(self, addr: str, name: str | None):
        self.addr, self.name = addr, name

    def __repr__(self) -> str:  # pragma: no cover - debugging only
        return f"Mailbox({self.addr!r}, {self.name!r})"


def _plain(raw: str) -> str:
    """The header value as text: unfolded, raw 8-bit bytes read as UTF-8 (RFC 6532), NFKC, no format
    characters."""
    s = re.sub(r"\r?\n(?=[ \t])", "", raw)
    try:  # message_from_bytes keeps non-ASCII header bytes as surrogate escapes
        s = s.encode("ascii", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:
        pass
    s = unicodedata.normalize("NFKC", s)
    return "".join(c for c in s if unicodedata.category(c) != "Cf")


def _decoded(text: str) -> str:
    """RFC 2047 encoded words decoded (`=?utf-8?q?victim=40corp.example?=` is 'victim@corp.example'),
    then NFKC again: what a mail client shows."""
    if not _ENCODED_WORD.search(text):
        return text
    try:
        out = str(email.header.make_header(email.header.decode_header(text)))
    except (LookupError, UnicodeError, ValueError, email.errors.HeaderParseError):
        return text
    out = unicodedata.normalize("NFKC", out)
    return "".join(c for c in out if unicodedata.category(c) != "Cf")


# One token of an address list: a quoted string, a comment (one level of nesting), an angle address, a
# separator, a run of plain text, or a stray delimiter (an unclosed quote, comment or bracket: then
# read as plain text, so what follows it is still looked at).
_TOKEN = re.compile(r'"((?:[^"\\]|\\.)*)"'
                    r"|\(((?:[^()\\]|\\.|\((?:[^()\\]|\\.)*\))*)\)"
                    r"|<([^<>]*)>"
                    r"|([,;])"
                    r'|([^"(<,;]+|.)', re.S)
_ESCAPE = re.compile(r"\\(.)", re.S)


def _split(s: str) -> list[dict]:
    """Top-level comma/semicolon separated pieces, each as its plain text (outside quotes, comments and
    angle brackets), quoted text, comment text, angle-bracket contents, and its display name (plain and
    quoted text in order)."""
    pieces: list[dict] = []
    cur: dict = {"plain": [], "quoted": [], "comment": [], "angle": [], "name": []}
    for m in _TOKEN.finditer(s):
        quoted, comment, angle, sep, plain = m.groups()
        if sep is not None:
            if any(x.strip() for k in ("plain", "quoted", "comment", "angle") for x in cur[k]):
                pieces.append(cur)
            cur = {"plain": [], "quoted": [], "comment": [], "angle": [], "name": []}
        elif quoted is not None:
            q = _ESCAPE.sub(r"\1", quoted)
            cur["quoted"].append(q)
            cur["name"].append(q)
        elif comment is not None:
            cur["comment"].append(_ESCAPE.sub(r"\1", comment))
        elif angle is not None:
            cur["angle"].append(angle)
        else:
            cur["plain"].append(plain)
            cur["name"].append(plain)
    if any(x.strip() for k in ("plain", "quoted", "comment", "angle") for x in cur[k]):
        pieces.append(cur)
    return pieces


def _words(texts) -> list[str]:
    # Outlook quotes an address shown as a name with single quotes ('alice@x' <alice@x>); a sentence
    # may end on one: neither mark is part of the address
    return [w.strip("'`.!?") for t in texts for w in _ADDR_WORD.findall(_decoded(t))]


def mailboxes(raw: str) -> tuple[list[Mailbox], str | None]:
    """The mailboxes of one address-list header value, and why it is ambiguous (None: it is not).
    A piece with no address at all (a group name, `undisclosed-recipients:;`) names no one."""
    out: list[Mailbox] = []
    for p in _split(_plain(raw)):
        if len(p["angle"]) > 1:
            return [], "two angle addresses in one mailbox"
        shown = _words(p["plain"]) + _words(p["quoted"]) + _words(p["comment"])
        if p["angle"]:
            inner = p["angle"][0].strip()
            inner = inner.rsplit(":", 1)[-1].strip()       # an obsolete source route, <@a,@b:x@y>
            addr = inner if _ADDR_WORD.fullmatch(inner) else None
            if addr is None:
                if shown:
                    return [], "display name is an address but the angle brackets hold none"
                continue
            name = " ".join(_decoded(" ".join(p["name"])).split()) or None
        else:
            bare = _words(p["plain"])
            if len(bare) > 1:
                return [], "two addresses in one mailbox without angle brackets"
            if not bare:
                if shown:
                    return [], "an address only inside quotes or a comment"
                continue
            addr = bare[0]
            name = None  # (a comment is not taken as the name: Python's parser never did, nor does this)
        me = person_id_or_empty(addr)
        for w in shown:
            if person_id_or_empty(w) != me:
                return [], "display name is another address"
        out.append(Mailbox(addr.lower(), name))
    return out, None
