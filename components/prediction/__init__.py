"""Private prediction (PMixED, seed 002, repaired): an ensemble of per-shard LoRA adapters mixed with the
public base under a pointwise mollifier, served token by token against a durable token budget.

    mechanism   the per-token bound (pure DP per token → RDP on the ledger's orders), calibration
    mixing      Algorithm 1 repaired: Poisson selection, λ per member, mixture, CSPRNG draw
Derivation: docs/privacy/pmixed.md.
"""
