"""Orchestration: Prefect flows that run the stages of `components`, and the `veil` CLI."""
