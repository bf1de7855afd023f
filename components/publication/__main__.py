"""`python -m components.publication [--markdown | --write [PATH]]`: the published-field table."""
from __future__ import annotations

import sys
from pathlib import Path

from components.publication.gate import table_markdown, with_table

DOC = Path(__file__).resolve().parents[2] / "docs" / "privacy" / "threat-model.md"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--write"]:
        path = Path(argv[1]) if len(argv) > 1 else DOC
        path.write_text(with_table(path.read_text()))
        print(f"wrote the published-field table into {path}")
        return 0
    sys.stdout.write(table_markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
