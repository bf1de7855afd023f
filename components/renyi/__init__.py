"""Rényi curves, costs and the filter's maths (imports core; dp-accounting where a curve is computed).

- `rdp`: each release's RDP curve on the ledger's fixed orders, the individual filter's condition,
  ε(δ) of a spend, releases left under a budget;
- `costs`: what a release costs one person (`PersonCost`), one secret (`SecretCost`), the lifetime
  `Budget`, and pricing a plan's people given its mechanism (passed in, never looked up: the
  registry sits above this floor).
The mechanisms price releases with these; `components.ledger` stores and filters the charges.
"""
