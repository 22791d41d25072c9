"""The wire protocol between agents and collectors (docs/reference/PROTOCOL.md), used by both sides.

* ``topics``: the MQTT topics, built and parsed in one place;
* ``fields``: the bounded field types every message is made of;
* ``codec``: ``Rejected``, how a family of structs is defined, and the encoder and
  checking decoder;
* one module per family of messages, each a typed struct with its bounds, its
  encoder and its checking decoder: ``descriptions`` (a mechanism's parameters),
  ``reports``, ``statuses``, ``confirmations``, ``range`` (range discovery) and
  ``snapshots`` (the collector's retained aggregates).

docs/reference/protocol.schema.json is generated from the types (scripts/gen_protocol_schema.py).
The states collectors save and exchange are the collector's (collector/storage/states.py).
"""

from edge_agent.protocol.codec import PROTOCOL_VERSION, Rejected, encode
from edge_agent.protocol.confirmations import (
    Confirm,
    decode_confirm,
)
from edge_agent.protocol.descriptions import (
    MechanismDescription,
    as_dict,
    describe,
    description_name,
    mechanism_of,
)
from edge_agent.protocol.fields import MAX_CODES, SEQ_LIMIT
from edge_agent.protocol.range import (
    RANGE_WINDOW_MAX,
    Announce,
    Answer,
    End,
    Join,
    RangeParameters,
    RangeResult,
    RangeTerms,
    Round,
    RoundRecord,
    decode_range_control,
    decode_range_reply,
    decode_range_result,
    range_answer,
    range_join,
    terms_of,
)
from edge_agent.protocol.reports import (
    KINDS,
    MAX_REPORT_BYTES,
    Report,
    Strategy,
    ValidReport,
    check_report,
    decode_report,
    kind_problem,
    report,
)
from edge_agent.protocol.snapshots import (
    ChannelSnapshot,
    FleetSpread,
    decode_fleet_spread,
    snapshot,
)
from edge_agent.protocol.statuses import (
    Status,
    decode_status,
    status,
)
from edge_agent.protocol.topics import (
    NAME,
    STATUS,
    TOPIC_ROOT,
    aggregates_topic,
    classify,
    collector_topics,
    confirm_agent,
    confirm_topic,
    data_subscription,
    data_topic,
    is_name,
    range_control_subscription,
    range_control_topic,
    range_reply_agent,
    range_reply_subscription,
    range_reply_topic,
    range_result_levels,
    range_result_subscription,
    range_result_topic,
    report_levels,
    shared_subscription,
    status_agent,
    status_subscription,
    status_topic,
    topic_fleet,
)

__all__ = [
    "KINDS", "MAX_CODES", "MAX_REPORT_BYTES", "NAME", "PROTOCOL_VERSION", "RANGE_WINDOW_MAX",
    "SEQ_LIMIT", "STATUS", "TOPIC_ROOT", "Announce", "Answer", "ChannelSnapshot", "Confirm",
    "End", "FleetSpread", "Join", "MechanismDescription", "RangeParameters", "RangeResult",
    "RangeTerms",
    "Rejected", "Report", "Round", "RoundRecord", "Status", "Strategy", "ValidReport",
    "aggregates_topic", "as_dict", "check_report", "classify", "collector_topics",
    "confirm_agent", "confirm_topic",
    "data_subscription", "data_topic", "decode_confirm", "decode_fleet_spread",
    "decode_range_control",
    "decode_range_reply", "decode_range_result", "decode_report", "decode_status", "describe",
    "description_name", "encode", "is_name", "kind_problem", "mechanism_of", "range_answer",
    "range_control_subscription", "range_control_topic", "range_join", "range_reply_agent",
    "range_reply_subscription", "range_reply_topic", "range_result_levels",
    "range_result_subscription", "range_result_topic", "report", "report_levels",
    "shared_subscription", "snapshot", "status", "status_agent", "status_subscription",
    "status_topic", "terms_of", "topic_fleet",
]
