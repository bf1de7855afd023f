"""`veil models` and the study table fit an 80-column terminal without cutting a name to "…" (issue 26)."""
from __future__ import annotations

import io
from rich.console import Console

LONG = "debian-changelog-maintainers-weekly-retrain"


def _render(table, width=80) -> str:
    buf = io.StringIO()
    Console(file=buf, width=width, force_terminal=False, color_system=None).print(table)
    return buf.getvalue()


def _column(text: str, i: int) -> str:
    """Column i of the table's body, its folded lines joined (a folded name reads whole)."""
    return "".join(line.split("│")[i + 1].strip() for line in text.splitlines() if line.startswith("│"))


def test_models_table_folds_long_names():
    from flows.cli.core_cmds import models_table

    cert = {"mechanism": "uls", "privacy_unit": "user", "epsilon": 7.9989, "delta": 1e-5, "steps": 120,
            "accountant": {"mechanism": "uls", "pessimistic": True}}
    rows = [{"name": LONG, "version": "12", "aliases": ["latest-certified", "production"], "certificate": cert,
             "certificate_status": "verified"}]
    text = _render(models_table(rows))
    assert "…" not in text, text
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert _column(text, 0) == f"{LONG}/12", text


def test_study_table_folds_long_point_keys():
    from flows.study_report import rich_table

    key = "uls-filtered_eps8_ppl-high_k32_lora-r16-" + "x" * 30
    row = {"key": key, "mechanism": "uls-filtered", "privacy_unit": "user", "epsilon": 8.0, "noise_multiplier": 0.9378,
           "sampling_rate": 0.0903, "steps": 120, "perplexity": 9.532, "next_token_accuracy": 0.611,
           "base_perplexity": 11.85}
    text = _render(rich_table({"study_id": "grid-20261126T000000-abcdef", "rows": [row], "gap_closing": []}))
    assert "…" not in text, text
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert _column(text, 0) == key, text
    assert _column(text, 3) == "0.938" and _column(text, 8) == "11.85", text
