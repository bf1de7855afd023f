"""A git repository: one record per (commit, file) holding the lines that commit added to that file.

The user is the commit's author after `.mailmap` (`%aE`, lower-cased), so one person with several
addresses is one user. Merge commits are skipped (their content is other commits' work); renames are
detected, so moving a file does not credit its whole content to whoever moved it. The file path goes
to `path` (visible to `path_glob` secret rules) and to metadata, with the commit and its subject.
Binary files and added text that is not UTF-8 are quarantined at `<commit>:<path>`. Runs `git log`
through subprocess, streaming its output.
"""
from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path
from typing import Iterator

import pyarrow as pa

from catalog.connectors.base import RAW_KEEP, RawRows
from components.core.errors import VeilError

_BATCH = 5_000
# A commit header is one line starting with two NULs, its fields NUL-separated. git refuses NUL in
# names, addresses and subjects, and a patch line never starts with NUL, so no author name can shift
# the fields (with \x1f separators, a name "Mallory\x1fvictim@x" credited the victim's address).
_SEP = b"\x00\x00"
_FMT = "%x00%x00%H%x00%aN%x00%aE%x00%aI%x00%s"
_QUOTED = re.compile(rb'^"(.*)"$')


def _unquote(p: bytes) -> bytes:
    """git's C-style quoting of unusual paths ("a\\tb", octal escapes)."""
    m = _QUOTED.match(p)
    if not m:
        return p
    body, out, i = m.group(1), bytearray(), 0
    esc = {b"n": b"\n", b"t": b"\t", b'"': b'"', b"\\": b"\\", b"a": b"\a", b"b": b"\b", b"f": b"\f",
           b"r": b"\r", b"v": b"\v"}
    while i < len(body):
        c = body[i:i + 1]
        if c == b"\\" and i + 1 < len(body):
            nxt = body[i + 1:i + 2]
            if nxt.isdigit() and i + 3 < len(body) + 1:
                out += bytes([int(body[i + 1:i + 4], 8)])
                i += 4
                continue
            out += esc.get(nxt, nxt)
            i += 2
            continue
        out += c
        i += 1
    return bytes(out)


def _git(repo: Path, *args: str) -> str:
    try:
        r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=False)
    except FileNotFoundError:
        raise VeilError("git: the git executable is not installed") from None
    if r.returncode != 0:
        raise VeilError(f"{repo}: git {' '.join(args[:2])} failed: {r.stderr.decode(errors='replace').strip()[:300]}")
    return r.stdout.decode("utf-8", "replace").strip()


class GitSource:
    format = "git"
    default_source = "code"
    progress_unit = "commits"

    def __init__(self, repo: Path, *, rev: str = "HEAD"):
        self.path = Path(repo)
        self.rev = rev
        try:
            _git(self.path, "rev-parse", "--git-dir")
        except VeilError:
            raise VeilError(f"{self.path}: not a git repository") from None
        try:
            self.head = _git(self.path, "rev-parse", "--verify", f"{rev}^{{commit}}")
        except VeilError:
            raise VeilError(f"{self.path}: {rev} names no commit (empty repository?)") from None
        # A subdirectory of a repository is that path only: `git -C <dir> log -- .` reads the commits
        # touching it and only its files (paths in the diff stay relative to the repository root).
        self.prefix = _git(self.path, "rev-parse", "--show-prefix")
        top = Path(_git(self.path, "rev-parse", "--show-toplevel"))
        self._total = int(_git(self.path, "rev-list", "--count", "--no-merges", self.head, "--", ".") or 0)
        mailmap = top / ".mailmap"
        mm = mailmap.read_bytes() if mailmap.is_file() else b""
        self._sha = hashlib.sha256(b"git\n" + self.head.encode() + b"\n" + self.prefix.encode() + b"\n"
                                   + mm).hexdigest()
        self._done = 0

    @property
    def sha256(self) -> str:
        return self._sha

    @property
    def progress_total(self) -> int:
        return self._total

    @property
    def progress_done(self) -> int:
        return self._done

    def _log(self) -> Iterator[bytes]:
        cmd = ["git", "-C", str(self.path), "-c", "core.quotepath=off", "log", "--no-merges", "--reverse",
               "--use-mailmap", f"--format={_FMT}", "--patch", "--unified=0", "--no-color", "--no-ext-diff",
               "-M", "--no-textconv", self.head, "--", "."]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                yield line[:-1] if line.endswith(b"\n") else line
        finally:
            if proc.stdout is not None:
                proc.stdout.close()
            err = proc.stderr.read() if proc.stderr is not None else b""
            rc = proc.wait()
            if rc not in (0, -13) and rc is not None:  # -13: we stopped reading early (SIGPIPE)
                raise VeilError(f"{self.path}: git log failed: {err.decode(errors='replace').strip()[:300]}")

    def files(self) -> Iterator[dict]:
        """Every (commit, file) with added lines: {commit, author, email, date, subject, path, added|binary}."""
        commit: dict | None = None
        cur: dict | None = None
        in_hunk = False

        def flush():
            if cur is not None and (cur.get("binary") or cur["added"]):
                return cur
            return None

        for line in self._log():
            if line.startswith(_SEP):
                done = flush()
                if done:
                    yield done
                cur, in_hunk = None, False
                parts = line[len(_SEP):].split(b"\x00")
                if len(parts) != 5:  # git never writes this; refuse rather than guess who the author is
                    raise VeilError(f"{self.path}: git log header with {len(parts)} fields, expected 5")
                commit = {"commit": parts[0].decode(), "author": parts[1].decode("utf-8", "replace"),
                          "email": parts[2].decode("utf-8", "replace"), "date": parts[3].decode(),
                          "subject": parts[4].decode("utf-8", "replace")}
                self._done += 1
                continue
            if commit is None:
                continue
            if line.startswith(b"diff --git "):
                done = flush()
                if done:
                    yield done
                m = re.match(rb"^diff --git (\"?)a/(.*?)\1 (\"?)b/(.*)\3$", line)
                guess = m.group(4) if m else line[11:]
                cur = {**commit, "path": _unquote(guess).decode("utf-8", "replace"), "added": [], "binary": False}
                in_hunk = False
                continue
            if cur is None:
                continue
            if in_hunk:
                if line.startswith(b"+"):
                    cur["added"].append(line[1:])
                elif line.startswith(b"@@"):
                    pass
                continue
            if line.startswith(b"@@"):
                in_hunk = True
            elif line.startswith(b"+++ "):
                p = line[4:]
                if p != b"/dev/null":
                    p = _unquote(p)
                    cur["path"] = (p[2:] if p.startswith(b"b/") else p).decode("utf-8", "replace")
            elif line.startswith(b"Binary files ") or line.startswith(b"GIT binary patch"):
                cur["binary"] = True
        done = flush()
        if done:
            yield done

    def batches(self) -> Iterator[pa.Table]:
        rows = RawRows(())
        n = 0
        for f in self.files():
            n += 1
            pos = {"seq": n, "line": None, "offset": None, "locator": f"{f['commit'][:12]}:{f['path']}"}
            user = f["email"].strip().lower() or None
            meta = json.dumps({"commit": f["commit"], "path": f["path"], "subject": f["subject"],
                               "author_name": f["author"]}, sort_keys=True, ensure_ascii=False)
            if f["binary"]:
                rows.add(**pos, user=user, path=f["path"], error="binary file: not text", raw=None)
            else:
                blob = b"\n".join(f["added"])
                try:
                    text = blob.decode("utf-8")
                except UnicodeDecodeError as e:
                    rows.add(**pos, user=user, path=f["path"], raw=blob[:RAW_KEEP],
                             error=f"undecodable bytes: added lines are not UTF-8 at byte {e.start}")
                else:
                    rows.add(**pos, user=user, text=text, ts=f["date"], path=f["path"], metadata=meta,
                             source_id=f"{f['commit']}:{f['path']}")
            if len(rows) >= _BATCH:
                yield rows.table()
                rows = RawRows(())
        if len(rows):
            yield rows.table()
