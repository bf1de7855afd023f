"""Many people's keyed numpy draws at once: `np.random.default_rng(SeedSequence([seed, *words]))`
followed by `choice(n, size=m, replace=False)`, computed for a whole column of people in numpy.

Planning gives each person their own generator, seeded from their keyed PRF words (audit_split's
attacker samples, selection's random records), so that a person's draw depends on that person alone.
Creating one numpy Generator per person costs 50–200 µs — minutes at 10⁶–10⁷ people — so this module
replays, vectorised over people, exactly what numpy does for each of them:

* SeedSequence's entropy pool (`mix_entropy`) and `generate_state(4, uint64)`, in uint32 arithmetic;
* PCG64 seeded from it (`pcg_setseq_128_srandom_r`), its 128-bit LCG step and XSL-RR output, with the
  32-bit half kept for the next `next_uint32` as numpy's bit generator does;
* `Generator.choice(n, m, replace=False)` for n ≤ 10 000: Floyd's sampling with Lemire's bounded draws,
  then the Fisher–Yates shuffle of the m picks; and `choice(n, m, replace=True)`: m bounded draws.

Nothing here is a new random choice: each row's output is, bit for bit, what that person's own
Generator returns (tests/planning/test_planning_columns.py compares them). `floyd_choice` checks this
against numpy itself once per process on a few seeds, and falls back to one Generator per person if
the installed numpy draws differently (a numpy that changed `choice` changes plans either way; the
check keeps the two paths equal so that no plan depends on which one ran).
"""
from __future__ import annotations

import numpy as np

_M32 = np.uint64(0xFFFFFFFF)
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715
_PCG_MULT = 0x2360ED051FC65DA44385DF649FCCF645
_MH, _ML = np.uint64(_PCG_MULT >> 64), np.uint64(_PCG_MULT & 0xFFFFFFFFFFFFFFFF)
FLOYD_MAX = 10_000         # numpy uses Floyd's algorithm up to this population (then a tail shuffle)


def _u32(x: int) -> np.uint32:
    return np.uint32(x & 0xFFFFFFFF)


def seed_states(entropy: np.ndarray) -> np.ndarray:
    """SeedSequence(row).generate_state(4, uint64) for every row of `entropy` (uint32, one row per
    person: the words numpy would make of the list [seed, w0, w1, w2, w3])."""
    ent = np.asarray(entropy, dtype=np.uint32)
    n, width = ent.shape
    with np.errstate(over="ignore"):
        hc = [np.uint32(_INIT_A)]

        def hashmix(value):
            value = value ^ hc[0]
            hc[0] = np.uint32(hc[0] * np.uint32(_MULT_A))
            value = value * hc[0]
            return value ^ (value >> np.uint32(16))

        def mix(x, y):
            r = np.uint32(_MIX_L) * x - np.uint32(_MIX_R) * y
            return r ^ (r >> np.uint32(16))

        pool = [hashmix(ent[:, i] if i < width else np.zeros(n, np.uint32)) for i in range(4)]
        for s in range(4):
            for d in range(4):
                if s != d:
                    pool[d] = mix(pool[d], hashmix(pool[s]))
        for s in range(4, width):
            for d in range(4):
                pool[d] = mix(pool[d], hashmix(ent[:, s]))
        out = np.empty((n, 8), np.uint32)
        h = np.uint32(_INIT_B)
        for i in range(8):
            v = pool[i % 4] ^ h
            h = np.uint32(h * np.uint32(_MULT_B))
            v = v * h
            out[:, i] = v ^ (v >> np.uint32(16))
    return out.astype("<u4", copy=False).view("<u8")      # numpy: 8 uint32 words viewed as 4 uint64


def _mulhi64(a: np.ndarray, b: np.uint64) -> np.ndarray:
    """The high 64 bits of a·b (a array, b scalar), from 32-bit halves."""
    a_lo, a_hi = a & _M32, a >> np.uint64(32)
    b_lo, b_hi = b & _M32, b >> np.uint64(32)
    ll = a_lo * b_lo
    lh = a_lo * b_hi
    hl = a_hi * b_lo
    hh = a_hi * b_hi
    mid = (ll >> np.uint64(32)) + (lh & _M32) + (hl & _M32)
    return hh + (lh >> np.uint64(32)) + (hl >> np.uint64(32)) + (mid >> np.uint64(32))


class PCG64s:
    """One PCG64 stream per row, as numpy's bit generator (state, inc, the buffered 32-bit half)."""

    def __init__(self, seeds: np.ndarray):
        s = np.asarray(seeds, dtype=np.uint64)            # (n, 4): generate_state(4, uint64)
        with np.errstate(over="ignore"):
            # inc = (initseq << 1) | 1 with initseq = (s2, s3) as (high, low)
            self.ih = (s[:, 2] << np.uint64(1)) | (s[:, 3] >> np.uint64(63))
            self.il = (s[:, 3] << np.uint64(1)) | np.uint64(1)
            self.sh = np.zeros(len(s), np.uint64)
            self.sl = np.zeros(len(s), np.uint64)
            self._step(np.arange(len(s)))
            lo = self.sl + s[:, 1]
            self.sh = self.sh + s[:, 0] + (lo < s[:, 1]).astype(np.uint64)
            self.sl = lo
            self._step(np.arange(len(s)))
        self.has32 = np.zeros(len(s), bool)
        self.buf32 = np.zeros(len(s), np.uint64)

    def _step(self, rows: np.ndarray) -> None:
        with np.errstate(over="ignore"):
            sh, sl = self.sh[rows], self.sl[rows]
            hi = sh * _ML + sl * _MH + _mulhi64(sl, _ML)
            lo = sl * _ML
            lo2 = lo + self.il[rows]
            hi = hi + self.ih[rows] + (lo2 < lo).astype(np.uint64)
            self.sh[rows], self.sl[rows] = hi, lo2

    def next64(self, rows: np.ndarray) -> np.ndarray:
        self._step(rows)
        hi, lo = self.sh[rows], self.sl[rows]
        x = hi ^ lo
        rot = hi >> np.uint64(58)
        with np.errstate(over="ignore"):
            return (x >> rot) | (x << ((np.uint64(64) - rot) & np.uint64(63)))

    def next32(self, rows: np.ndarray) -> np.ndarray:
        out = np.empty(len(rows), np.uint64)
        has = self.has32[rows]
        if has.any():
            r = rows[has]
            out[has] = self.buf32[r]
            self.has32[r] = False
        if (~has).any():
            r = rows[~has]
            v = self.next64(r)
            out[~has] = v & _M32
            self.buf32[r] = v >> np.uint64(32)
            self.has32[r] = True
        return out

    def bounded(self, rows: np.ndarray, rng: np.ndarray) -> np.ndarray:
        """random_bounded_uint64(0, rng) for rng < 2³² − 1 (Lemire's rejection on 32-bit draws);
        rng = 0 consumes nothing and returns 0, as numpy's does."""
        rng = np.asarray(rng, dtype=np.uint64)
        out = np.zeros(len(rows), np.uint64)
        live = rng > 0
        todo = np.flatnonzero(live)
        excl = rng + np.uint64(1)
        thresh = np.zeros(len(rows), np.uint64)
        thresh[live] = (np.uint64(0xFFFFFFFF) - rng[live]) % excl[live]
        while len(todo):
            with np.errstate(over="ignore"):
                m = self.next32(rows[todo]) * excl[todo]
            # numpy tests leftover < rng_excl before computing the threshold (< rng_excl): same outcome
            bad = (m & _M32) < thresh[todo]
            out[todo[~bad]] = m[~bad] >> np.uint64(32)
            todo = todo[bad]
        return out


def _floyd(seeds: np.ndarray, pop: np.ndarray, size: int) -> np.ndarray:
    """(n, size) int64: each row's Generator(PCG64(seed)).choice(pop[row], size, replace=False)."""
    n = len(pop)
    g = PCG64s(seeds)
    rows = np.arange(n)
    pop = np.asarray(pop, dtype=np.int64)
    idx = np.empty((n, size), np.int64)
    for t in range(size):
        j = pop - size + t
        val = g.bounded(rows, j.astype(np.uint64)).astype(np.int64)
        seen = (idx[:, :t] == val[:, None]).any(axis=1) if t else np.zeros(n, bool)
        idx[:, t] = np.where(seen, j, val)
    for i in range(size - 1, 0, -1):           # numpy's _shuffle_int(size, 1, idx)
        jj = g.bounded(rows, np.full(n, i, np.uint64)).astype(np.int64)
        a = idx[rows, jj].copy()
        idx[rows, jj] = idx[:, i]
        idx[:, i] = a
    return idx


def _draws_with_replacement(seeds: np.ndarray, pop: np.ndarray, size: int) -> np.ndarray:
    """(n, size): each row's Generator(PCG64(seed)).choice(pop[row], size, replace=True) — `size`
    bounded draws on [0, pop − 1] in turn (numpy's `integers` path)."""
    g = PCG64s(seeds)
    rows = np.arange(len(pop))
    hi = (np.asarray(pop, np.int64) - 1).astype(np.uint64)
    return np.stack([g.bounded(rows, hi).astype(np.int64) for _ in range(size)], axis=1).reshape(len(pop), size)


def entropy_rows(seed: int, words: np.ndarray) -> np.ndarray:
    """The uint32 words numpy makes of [seed, w0, w1, w2, w3] (SeedSequence's entropy coercion)."""
    s = int(seed)
    if s < 0:
        raise ValueError("seed must be non-negative")
    head = [s & 0xFFFFFFFF] if s == 0 else []
    while s > 0:
        head.append(s & 0xFFFFFFFF)
        s >>= 32
    words = np.asarray(words, dtype=np.uint32)
    return np.concatenate([np.tile(np.asarray(head, np.uint32), (len(words), 1)), words], axis=1)


def _numpy_choice(seed: int, words: np.ndarray, pop: np.ndarray, size: int, replace: bool = False) -> np.ndarray:
    out = np.empty((len(pop), size), np.int64)
    for r in range(len(pop)):
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), *map(int, words[r])]))
        out[r] = rng.choice(int(pop[r]), size=size, replace=replace)
    return out


_VERIFIED: bool | None = None


def _verified() -> bool:
    """Whether the vectorised replay matches this numpy's own draws (checked once per process)."""
    global _VERIFIED
    if _VERIFIED is None:
        rs = np.random.default_rng(12345)
        words = rs.integers(0, 2 ** 32, size=(64, 4), dtype=np.uint64).astype(np.uint32)
        words[0] = 0
        ok = True
        for seed in (0, 7, 2 ** 40 + 3):
            for size in (1, 2, 4):
                pop = rs.integers(size + 1, 60, size=64)
                pop[1] = size
                ok &= bool(np.array_equal(_floyd(seed_states(entropy_rows(seed, words)), pop, size),
                                          _numpy_choice(seed, words, pop, size)))
                pop[2] = 1
                ok &= bool(np.array_equal(_draws_with_replacement(seed_states(entropy_rows(seed, words)), pop, size),
                                          _numpy_choice(seed, words, pop, size, replace=True)))
        _VERIFIED = ok
    return _VERIFIED


def floyd_choice(seed: int, words: np.ndarray, pop: np.ndarray, size: int) -> np.ndarray:
    """(n, size) int64: row r is `np.random.default_rng(SeedSequence([seed, *words[r]]))
    .choice(pop[r], size=size, replace=False)` — every row's own Generator, replayed in numpy.

    `words`: (n, 4) uint32 (annex.prf_seed's words per person); `pop[r] ≥ size`."""
    words = np.asarray(words, dtype=np.uint32).reshape(-1, 4)
    pop = np.asarray(pop, dtype=np.int64)
    if len(pop) == 0 or size == 0:
        return np.empty((len(pop), size), np.int64)
    if (pop < size).any():
        raise ValueError("choice: a population is smaller than the sample")
    big = pop > FLOYD_MAX
    if not _verified():
        return _numpy_choice(seed, words, pop, size)
    out = np.empty((len(pop), size), np.int64)
    small = ~big
    if small.any():
        out[small] = _floyd(seed_states(entropy_rows(seed, words[small])), pop[small], size)
    if big.any():                               # numpy's tail-shuffle path: one Generator each
        out[big] = _numpy_choice(seed, words[big], pop[big], size)
    return out


def replace_choice(seed: int, words: np.ndarray, pop: np.ndarray, size: int) -> np.ndarray:
    """(n, size) int64: row r is `np.random.default_rng(SeedSequence([seed, *words[r]]))
    .choice(pop[r], size=size, replace=True)`, replayed in numpy (`pop[r] ≥ 1`)."""
    words = np.asarray(words, dtype=np.uint32).reshape(-1, 4)
    pop = np.asarray(pop, dtype=np.int64)
    if len(pop) == 0 or size == 0:
        return np.empty((len(pop), size), np.int64)
    if (pop < 1).any():
        raise ValueError("choice: an empty population")
    if not _verified():
        return _numpy_choice(seed, words, pop, size, replace=True)
    return _draws_with_replacement(seed_states(entropy_rows(seed, words)), pop, size)
