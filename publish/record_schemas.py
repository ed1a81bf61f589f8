"""The JSON Schemas of the published records, generated from their types into docs/schemas/.

`python -m chattts_forge.publish.record_schemas` rewrites them; tests/test_record_schemas.py checks
that the committed files equal what the types generate, so a changed record changes its schema in
the same commit.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chattts_forge.evaluate.latency_record import latency_json_schema
from chattts_forge.evaluate.report_record import report_json_schema
from chattts_forge.publish.regression_record import regression_json_schema
from chattts_forge.runtime.routing_record import routing_json_schema

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "docs" / "schemas"
# file name -> the function that generates it
SCHEMAS: dict[str, Callable[[], dict[str, Any]]] = {
    "report.schema.json": report_json_schema,
    "latency.schema.json": latency_json_schema,
    "routing.schema.json": routing_json_schema,
    "regression.schema.json": regression_json_schema,
}


def schema_bytes(generate: Callable[[], dict[str, Any]]) -> bytes:
    return (json.dumps(generate(), indent=2, sort_keys=True) + "\n").encode("utf-8")


def write_schemas(folder: Path = SCHEMA_DIR) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, generate in SCHEMAS.items():
        (folder / name).write_bytes(schema_bytes(generate))
        written.append(folder / name)
    return written


if __name__ == "__main__":
    for path in write_schemas(Path(sys.argv[1]) if len(sys.argv) > 1 else SCHEMA_DIR):
        print(path)
