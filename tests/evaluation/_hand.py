"""An independent NLL: no padding, no batching, a python loop over positions in float64."""
from __future__ import annotations

import math


def by_hand(model, tok, texts, max_length):
    """(mean NLL, next-token accuracy, predicted tokens) over `texts`, BOS prepended, cut at max_length."""
    import torch

    nll, hits, n = 0.0, 0, 0
    for text in texts:
        ids = ([tok.bos_token_id] + tok(text, add_special_tokens=False)["input_ids"])[:max_length]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0].double()
        for t in range(1, len(ids)):
            row = logits[t - 1]
            top = float(row.max())
            logz = top + math.log(sum(math.exp(v - top) for v in row.tolist()))
            nll += logz - row[ids[t]].item()
            hits += int(int(row.argmax()) == ids[t])
            n += 1
    return nll / n, hits / n, n
