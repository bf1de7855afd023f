"""Refuse an SQLite file that exists but cannot be what it claims (issue 28).

A zero-length `ledger.db` used to become a fresh ledger on the next open (SQLite treats an empty file
as an empty database, and the ledger created its tables in it): everyone's lifetime spend reset, with
exit 0. A full disk, a failed copy or a bad restore leaves exactly that. An existing database file is
now checked before SQLite touches it, in O(1): not empty, SQLite's 16-byte magic header, a valid page
size, and not shorter than the page count its header records (a truncated copy). Damage inside a
file of the right shape is reported by SQLite itself when read ("database disk image is malformed"),
and `unreadable` turns that into the same one line.
"""
from __future__ import annotations

from pathlib import Path

from components.core.errors import VeilError

MAGIC = b"SQLite format 3\x00"


def check_existing(path: str | Path, what: str, restore: str) -> None:
    """Raise VeilError (one line: what, where, what to restore) if `path` exists and is not a sound
    SQLite file. A missing file is not checked (the caller may create it)."""
    p = Path(path)
    try:
        size = p.stat().st_size
    except FileNotFoundError:
        return
    try:
        with open(p, "rb") as f:
            head = f.read(100)
    except OSError as e:
        raise VeilError(f"{what} {p}: cannot be read ({e.strerror}); {restore}") from None
    if size == 0:
        raise VeilError(f"{what} {p} is empty (0 bytes: a full disk, a failed copy or a bad restore leaves that) and "
                        f"is not re-created over what it held; {restore}")
    if len(head) < 100 or head[:16] != MAGIC:
        raise VeilError(f"{what} {p} is not an SQLite database ({size} bytes of something else: garbled or "
                        f"overwritten); {restore}")
    page = int.from_bytes(head[16:18], "big")
    page = 65536 if page == 1 else page
    if page < 512 or page & (page - 1):
        raise VeilError(f"{what} {p} has a garbled header (page size {page}); {restore}")
    pages = int.from_bytes(head[28:32], "big")
    # The header's page count is valid when its "version-valid-for" number equals the change counter
    # (SQLite ≥ 3.7.0 writes both); with WAL, newer pages may sit in the -wal file, never fewer here.
    valid = head[92:96] == head[24:28]
    if size % page or (valid and pages and size < pages * page):
        raise VeilError(f"{what} {p} is truncated ({size} bytes, its header says {pages} pages of {page}); {restore}")


MALFORMED = ("file is not a database", "malformed", "disk image", "file is encrypted")


def unreadable(e: BaseException) -> bool:
    """An SQLite error that means the file is damaged (not a lock or a busy database)."""
    return any(m in str(e) for m in MALFORMED)
