"""From the sampler's chosen units to the step's records: which records (or chunks) each sampled
unit contributes, and with what weight inside the unit."""
from __future__ import annotations

import numpy as np

from components.dpsgd.data import TokenizedRecords, random_chunks
from components.dpsgd.per_sample import Unit


class BatchBuilder:
    """mode "records": one record per unit (record/els/group/secret/nonprivate);
    "uls": ≤ G of the user's records, drawn afresh at each visit, mean over them;
    "uls-chunks": G random seq_len-token chunks of the user's concatenated text, mean over them."""

    def __init__(self, mode: str, tok: TokenizedRecords, by_user: list[np.ndarray], *,
                 G: int | None = None, streams: list[np.ndarray] | None = None, seq_len: int = 0):
        self.mode, self.tok, self.by_user = mode, tok, by_user
        self.G, self.streams, self.seq_len = G, streams, seq_len

    def build(self, chosen: np.ndarray, rng: np.random.Generator) -> tuple[list[Unit], np.ndarray, np.ndarray]:
        """(units, ids, lengths) where units index rows of ids. `rng` is the step's sampling stream,
        already advanced past the Poisson draw, so a replayed step redraws the same records."""
        if self.mode == "records":
            return [Unit(np.array([r]), 1.0) for r in chosen], self.tok.ids, self.tok.lengths
        if self.mode == "uls":
            units = []
            for u in chosen:
                recs = self.by_user[u]
                if len(recs) > self.G:
                    recs = np.sort(rng.choice(recs, size=self.G, replace=False))
                units.append(Unit(recs, 1.0 / len(recs)))
            return units, self.tok.ids, self.tok.lengths
        units, chunks = [], []
        for u in chosen:
            cs = random_chunks(self.streams[u], self.seq_len, self.G, rng)
            units.append(Unit(np.arange(len(chunks), len(chunks) + len(cs)), 1.0 / len(cs)))
            chunks.extend(cs)
        ids = np.zeros((len(chunks), self.seq_len), dtype=np.int64)
        lengths = np.array([len(c) for c in chunks], dtype=np.int64)
        for i, c in enumerate(chunks):
            ids[i, :len(c)] = c
        return units, ids, lengths
