"""docs/reference/protocol.schema.json, generated from the typed messages.

``python scripts/gen_protocol_schema.py`` (or ``make docs``) rewrites the file;
tests/edge_agent/protocol/test_protocol.py fails when it is stale.  The root schema is the
report message; ``$defs`` holds every other message of docs/reference/PROTOCOL.md by name, and the
scale-out partition state collectors exchange over NATS (``collector.storage.states``):
a script, not a module of either package, because it documents both.
"""

import inspect
import json
import sys
from pathlib import Path

import msgspec

from collector.storage import states
from edge_agent.protocol import confirmations, range, reports, snapshots, statuses

SCHEMA_PATH = (Path(__file__).resolve().parents[1] / "docs" / "reference"
               / "protocol.schema.json")

# Every message on the wire, by the topic that carries it (docs/reference/PROTOCOL.md).
MESSAGES = {
    "ldp/v1/<fleet>/<agent>/<channel>": reports.Report,
    "ldp/v1/<fleet>/<agent>/status": statuses.Status,
    "ldp/v1/<fleet>/_range/control/<run>": range.RangeControl,
    "ldp/v1/<fleet>/<agent>/_range/<run>": range.RangeReply,
    "ldp/v1/<fleet>/_range/result/<channel>/<side>": range.RangeResult,
    "ldp/v1/<fleet>/_aggregates/<channel>": snapshots.ChannelSnapshot,
    "ldp/v1/<fleet>/_confirm/<agent>": confirmations.Confirm,
    # Not MQTT: the value of key p.<partition> of the NATS KV bucket <stream>_state, the
    # state itself or (when larger than [scale_out] inline_state_bytes) the object of
    # bucket <stream>_state_objects that holds it.
    "nats-kv:<stream>_state/p.<partition>": states.PartitionState,
    "nats-kv:<stream>_state/p.<partition> (large)": states.PartitionStateObject,
    "nats-object:<stream>_state_objects/p.<partition>.<id>": states.PartitionState,
}


def protocol_schema() -> dict:
    """One JSON Schema (draft 2020-12): the report at the root, every message in $defs."""
    roots, definitions = msgspec.json.schema_components(list(MESSAGES.values()),
                                                        ref_template="#/$defs/{name}")
    report = definitions["Report"]
    topics = {topic: root for topic, root in zip(MESSAGES, roots)}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://edge-ldp.invalid/protocol/v1/report.json",
        "title": "edge-ldp report message, protocol v1",
        "description": (
            "One channel's perturbed reports for one batch, on ldp/v1/<fleet>/<agent>/"
            "<channel>. Carries grid codes only, never raw readings. Generated from "
            "edge_agent/protocol by `python scripts/gen_protocol_schema.py`; the other "
            "messages are in $defs, and x-topics names the definition each topic carries."),
        **{key: value for key, value in report.items() if key not in ("title", "description")},
        "x-topics": topics,
        "$defs": definitions,
    }


def normalized(node):
    """Every ``description`` as ``inspect.cleandoc`` leaves a docstring, whatever msgspec
    release rendered it (0.19 kept the continuation lines' indentation, 0.23 strips it):
    the file depends on the types, not on a library's formatting."""
    if isinstance(node, dict):
        return {key: inspect.cleandoc(value) if key == "description" and isinstance(value, str)
                else normalized(value) for key, value in node.items()}
    if isinstance(node, list):
        return [normalized(value) for value in node]
    return node


def render() -> str:
    return json.dumps(normalized(protocol_schema()), indent=2, sort_keys=False) + "\n"


def main() -> int:
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else SCHEMA_PATH
    target.write_text(render())
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
