"""The policy's JSON Schema, generated from the pydantic model (policies/schema.json).

Editors (VS Code's YAML extension, IntelliJ) use it to complete and check policies as they are typed.
`python -m components.policy.schema` rewrites the file; a test fails when it is out of date.
"""
from __future__ import annotations

import json
from pathlib import Path

from components.policy.model import Policy

SCHEMA_ID = "https://veil.dev/schemas/policy/v1.json"
DEFAULT_PATH = Path(__file__).resolve().parents[2] / "policies" / "schema.json"


def policy_json_schema() -> dict:
    schema = Policy.model_json_schema(mode="validation")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID,
            "title": "Veil privacy policy (veil.dev/v1, kind PrivacyPolicy)", **{k: v for k, v in schema.items()
                                                                                if k != "title"}}


def schema_text() -> str:
    return json.dumps(policy_json_schema(), indent=2, sort_keys=True) + "\n"


def write_schema(path: str | Path = DEFAULT_PATH) -> Path:
    path = Path(path)
    path.write_text(schema_text())
    return path


if __name__ == "__main__":
    print(write_schema())
