"""MQTT topics of the protocol (docs/reference/PROTOCOL.md, "Topics"), built and parsed in one
place.

  ldp/v1/<fleet>/<agent>/<channel>              perturbed reports, QoS 1
  ldp/v1/<fleet>/<agent>/status                 retained agent status; last will ``offline``
  ldp/v1/<fleet>/<agent>/_range/<run>           an agent's join and answers for one run
  ldp/v1/<fleet>/_range/control/<run>           range-discovery announce/round/end
  ldp/v1/<fleet>/_range/result/<channel>/<side> retained range result
  ldp/v1/<fleet>/_aggregates/<channel>          retained aggregate snapshot
  ldp/v1/<fleet>/_confirm/<agent>               retained: what a collector durably counted

Levels starting with ``_`` are reserved for collectors.
"""

from __future__ import annotations

import re

TOPIC_ROOT = "ldp/v1"
STATUS = "status"
RANGE = "_range"
AGGREGATES = "_aggregates"
CONFIRM = "_confirm"

# Agents, channels, fields, fleets: one topic level each, so no wildcards or
# separators, and no leading "_" (reserved).  The character class is shared with the
# configuration models (edge_agent.config), whose regex engine spells "end" as "$".
NAME_CHARS = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
NAME = re.compile(rf"\A{NAME_CHARS}\Z")


def is_name(text: str) -> bool:
    return NAME.match(text) is not None


def data_topic(fleet: str, agent: str, channel: str) -> str:
    return f"{TOPIC_ROOT}/{fleet}/{agent}/{channel}"


def status_topic(fleet: str, agent: str) -> str:
    return f"{TOPIC_ROOT}/{fleet}/{agent}/{STATUS}"


def data_subscription(fleet: str) -> str:
    """Reports and statuses of every agent."""
    return f"{TOPIC_ROOT}/{fleet}/+/+"


def collector_topics(fleet: str) -> str:
    """The prefix of every topic of ``fleet`` the collectors own (aggregates, range runs,
    confirmations: a level that starts with ``_``, which no agent name can), which the
    data subscription also matches."""
    return f"{TOPIC_ROOT}/{fleet}/_"


def status_subscription(fleet: str) -> str:
    return f"{TOPIC_ROOT}/{fleet}/+/{STATUS}"


def shared_subscription(group: str, topic_filter: str) -> str:
    """MQTT 5 shared subscription: the broker gives each message to one member."""
    return f"$share/{group}/{topic_filter}"


def aggregates_topic(fleet: str, channel: str) -> str:
    return f"{TOPIC_ROOT}/{fleet}/{AGGREGATES}/{channel}"


def confirm_topic(fleet: str, agent: str) -> str:
    return f"{TOPIC_ROOT}/{fleet}/{CONFIRM}/{agent}"


def confirm_agent(topic: str, fleet: str) -> str | None:
    """The agent a confirmation topic of ``fleet`` names, or None."""
    prefix = f"{TOPIC_ROOT}/{fleet}/{CONFIRM}/"
    if not topic.startswith(prefix) or not is_name(topic[len(prefix):]):
        return None
    return topic[len(prefix):]


def topic_fleet(topic: str) -> str | None:
    """The fleet a protocol topic names (``ldp/v1/<fleet>/...``), or None."""
    levels = topic.split("/", 3)
    if len(levels) < 4 or "/".join(levels[:2]) != TOPIC_ROOT or not is_name(levels[2]):
        return None
    return levels[2]


def classify(topic: str, fleet: str) -> str:
    """'report', 'status', or 'ignore' (reserved levels, other fleets, other roots)."""
    levels = topic.split("/")
    if len(levels) < 4 or "/".join(levels[:2]) != TOPIC_ROOT or levels[2] != fleet:
        return "ignore"
    if levels[3].startswith("_"):
        return "ignore"  # collectors' own topics (aggregates, range runs, confirmations)
    if len(levels) == 5 and levels[4] == STATUS:
        return "status"
    return "report"


def report_levels(topic: str, fleet: str) -> tuple[str, str] | None:
    """(agent, channel) of a report topic of ``fleet``, or None."""
    levels = topic.split("/")
    if len(levels) != 5 or "/".join(levels[:3]) != f"{TOPIC_ROOT}/{fleet}":
        return None
    return levels[3], levels[4]


def status_agent(topic: str) -> str:
    """The agent level of a status topic (``classify`` said 'status')."""
    return topic.split("/")[3]


# -- range discovery (docs/reference/PROTOCOL.md, "Range discovery") ------------------------------

def range_control_topic(fleet: str, run: str) -> str:
    return f"{TOPIC_ROOT}/{fleet}/{RANGE}/control/{run}"


def range_control_subscription(fleet: str) -> str:
    return f"{TOPIC_ROOT}/{fleet}/{RANGE}/control/+"


def range_result_topic(fleet: str, channel: str, side: str) -> str:
    return f"{TOPIC_ROOT}/{fleet}/{RANGE}/result/{channel}/{side}"


def range_result_subscription(fleet: str) -> str:
    return f"{TOPIC_ROOT}/{fleet}/{RANGE}/result/+/+"


def range_result_levels(topic: str, fleet: str) -> tuple[str, str] | None:
    """(channel, side) of a range result topic of ``fleet``, or None."""
    prefix = f"{TOPIC_ROOT}/{fleet}/{RANGE}/result/"
    if not topic.startswith(prefix):
        return None
    channel, _, side = topic[len(prefix):].partition("/")
    if not is_name(channel) or side not in ("min", "max"):
        return None
    return channel, side


def range_reply_topic(fleet: str, agent: str, run: str) -> str:
    return f"{TOPIC_ROOT}/{fleet}/{agent}/{RANGE}/{run}"


def range_reply_subscription(fleet: str, run: str) -> str:
    return f"{TOPIC_ROOT}/{fleet}/+/{RANGE}/{run}"


def range_reply_agent(topic: str, fleet: str, run: str) -> str | None:
    """The agent a reply topic of run ``run`` names, or None."""
    levels = topic.split("/")
    if len(levels) != 6 or "/".join(levels[:3]) != f"{TOPIC_ROOT}/{fleet}" \
            or levels[4] != RANGE or levels[5] != run:
        return None
    return levels[3]

