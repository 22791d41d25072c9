"""The published protocol schema (docs/reference/protocol.schema.json) as ready validators.

Building a validator checks the schema itself, which is large (every message of
the protocol): build each once, then validate many messages."""

from __future__ import annotations

import json
from functools import cache

import jsonschema

from tests.support.paths import REPO

SCHEMA = json.loads((REPO / "docs" / "reference" / "protocol.schema.json").read_text())


@cache
def protocol_validator(definition: str | None = None) -> jsonschema.Draft202012Validator:
    """A validator of the schema's root (the report message), or of one ``$defs`` entry."""
    if definition is None:
        return jsonschema.Draft202012Validator(SCHEMA)
    return jsonschema.Draft202012Validator({"$ref": f"#/$defs/{definition}",
                                            "$defs": SCHEMA["$defs"]})
