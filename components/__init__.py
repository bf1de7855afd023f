"""Veil's pure library: accounting, policy, planning, training, certificates, registry, audit.

Nothing here imports `flows` or `catalog`; stages take and return plain values (Arrow tables,
dataclasses, JSON documents) so each can be tested alone.
"""
