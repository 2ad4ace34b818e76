"""JSON schemas that structured-output tests on either engine and every API share: the
torch engine's twenty (tests/api/openai/structured_schemas.json) and a cookbook."""

from __future__ import annotations

import json
from pathlib import Path

NESTED = ("nested", "recipe", "deep", "cookbook")  # three of the torch engine's test's twenty
# and a recipe as the issue describes it: an array of 2-4 objects with enums (its strings
# bounded: a small model left an unbounded one may still be inside it at max_tokens, as
# docs/api-openai.md's structured outputs say; a CI run's answer was)
COOKBOOK = {
    "name": "cookbook",
    "question": "Give me a recipe for pancakes as JSON.",
    "schema": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "ingredients": {
                "type": "array",
                "minItems": 2,
                "maxItems": 4,
                "items": {
                    "type": "object",
                    "properties": {
                        "item": {"type": "string", "maxLength": 40},
                        "amount": {"type": "number"},
                        "unit": {"enum": ["g", "ml", "piece"]},
                    },
                    "required": ["item", "amount", "unit"],
                },
            },
            "difficulty": {"enum": ["easy", "medium", "hard"]},
        },
        "required": ["name", "ingredients", "difficulty"],
    },
}


def structured_schemas() -> dict[str, dict]:
    found = Path(__file__).resolve().parents[1] / "api" / "openai" / "structured_schemas.json"
    return {case["name"]: case for case in [*json.loads(found.read_text()), COOKBOOK]}
