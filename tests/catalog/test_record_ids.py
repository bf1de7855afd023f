"""Record ids are sha256(user_id ‖ 0x1f ‖ text) in hex, whatever computes them (DataFusion in ingest):
checked here against hashlib, row by row and in order, on text a hash must not mangle."""
from __future__ import annotations

import hashlib
import random

import pyarrow as pa

from catalog.ingest import _RecordIds

TEXTS = ["hello", "ünïcödé ☃ 😀", "tab\there\nnewline", "\x00nul inside", "\u2028line sep", " lead/trail ",
         "x" * 70_000, "'quote\" and \\ backslash", "a\x1fb"]


def _want(u: str, t: str) -> str:
    return hashlib.sha256(f"{u}\x1f{t}".encode("utf-8")).hexdigest()


def test_ids_equal_hashlib_in_row_order_and_null_where_invalid():
    rnd = random.Random(7)
    n = 5000
    users = [f"user{rnd.randrange(50)}@x.example" if i % 97 else None for i in range(n)]
    texts = [TEXTS[i % len(TEXTS)] + str(rnd.random()) if i % 89 else None for i in range(n)]
    valid = [u is not None and t is not None and i % 13 != 0 for i, (u, t) in enumerate(zip(users, texts))]
    # several chunks, cut at different places in the two columns
    u_arr = pa.chunked_array([pa.array(users[:1000]), pa.array(users[1000:3333]), pa.array(users[3333:])])
    t_arr = pa.chunked_array([pa.array(texts[:2500]), pa.array(texts[2500:])])
    got = _RecordIds()(u_arr, t_arr, pa.array(valid)).to_pylist()
    assert got == [_want(u, t) if ok else None for u, t, ok in zip(users, texts, valid)]


def test_empty_batch():
    ids = _RecordIds()(pa.chunked_array([], pa.string()), pa.array([], pa.string()), pa.array([], pa.bool_()))
    assert len(ids) == 0 and ids.type == pa.string()
