"""What the fleet teaches the plan (``[privacy] plan_spread = "auto"``).

The planner (``edge_agent.config.planning``) chooses each channel's spacing for a fleet
of ``plan_fleet`` wearers whose readings spread by ``plan_spread`` of the domain's width.
With ``plan_spread = "auto"`` it starts from ``PLAN_SPREAD_ASSUMED`` and learns both
from the collector: its retained snapshot of each linear channel
(``ldp/v1/<fleet>/_aggregates/<channel>``) carries the readings' spread with a 95%
interval and how many agents reported the channel.  When a budget period begins (never
in the middle of one, like a discovered range), each linear channel is planned again for
the upper end of that interval and that many agents: the same shares of the guarantees,
so never more ε in any window, only another spacing and ε per report
(``planning.replan_channel``).

The snapshots are the collector's private outputs, not anybody's raw readings; still,
they come from the network: a snapshot that is oversized, malformed or out of range is
refused and counted, and only the agent's own planned linear channels are subscribed to,
so what is kept is bounded by the configuration.
"""

from __future__ import annotations

import logging
import math

from edge_agent import protocol
from edge_agent.config.agent import PLAN_FLEET_MAX
from edge_agent.config.planning import ChannelPlan, replan_channel
from edge_agent.protocol import Rejected

log = logging.getLogger(__name__)

# The spreads and fleet sizes a plan is made for are rounded to these grids (spread up,
# fleet down: the plan errs on the side of more reports), so that the estimates'
# wobble from one snapshot to the next does not change a channel's schedule, and with it
# its series at the collector, at every period.
SPREAD_STEP = 2 ** 0.25
FLEET_STEP = 2 ** 0.5
# The spreads a plan is made for, as a share of the domain's width (the configuration's
# own bounds on plan_spread).
SPREAD_MIN, SPREAD_MAX = 1e-3, 0.5


def _rounded_up(value: float, step: float) -> float:
    return step ** math.ceil(math.log(value, step) - 1e-9)


def _rounded_down(value: int, step: float) -> int:
    return max(1, math.floor(step ** math.floor(math.log(value, step) + 1e-9)))


def planned_spread(share: float) -> float:
    """The spread a plan is made for, from the fleet's (a share of the domain's width):
    bounded, then rounded up to the grid (bounded first: a huge spread over a narrow
    domain would overflow to inf)."""
    bounded = min(max(share, SPREAD_MIN), SPREAD_MAX)
    return min(SPREAD_MAX, _rounded_up(bounded, SPREAD_STEP))


def planned_fleet(agents: int) -> int:
    """The fleet size a plan is made for, from the agents reporting: bounded, then
    rounded down to the grid."""
    return _rounded_down(min(agents, PLAN_FLEET_MAX), FLEET_STEP)


class FleetSpreads:
    """The latest fleet spread and size the collector published for each planned linear
    channel of ``widths`` (name -> its domain's width), and the plans they give."""

    def __init__(self, fleet: str, widths: dict[str, float]):
        self.fleet = fleet
        self.widths = dict(widths)
        self.latest: dict[str, tuple[float, int]] = {}  # name -> (spread share, agents)
        self.invalid = 0
        self._prefix = protocol.aggregates_topic(fleet, "")
        # (name, spread, fleet) -> its plan: every virtual agent of a fleet asks for the same
        self._plans: dict[tuple[str, float, int], ChannelPlan | None] = {}

    @property
    def subscriptions(self) -> list[str]:
        return [protocol.aggregates_topic(self.fleet, name) for name in self.widths]

    def handle(self, topic: str, payload: bytes) -> bool:
        """Take one retained snapshot; whether ``topic`` was a snapshot's at all."""
        if not topic.startswith(self._prefix):
            return False
        name = topic[len(self._prefix):]
        width = self.widths.get(name)
        if width is None:
            return True
        try:
            found = protocol.decode_fleet_spread(payload)
        except Rejected as exc:
            self.invalid += 1
            log.warning("ignored the snapshot on %s: %s", topic, exc.detail)
            return True
        if found is None or found.kind != "linear" or found.spread is None:
            return True  # cleared, another kind, or no reports yet
        spread = found.spread
        upper = spread.ci95[1] if spread.ci95 is not None else spread.estimate
        if upper is None or not math.isfinite(upper) or upper < 0 or found.agents < 1:
            self.invalid += 1
            log.warning("ignored the snapshot on %s: spread %r of %d agents", topic, upper,
                        found.agents)
            return True
        self.latest[name] = (planned_spread(upper / width), planned_fleet(found.agents))
        return True

    def plan(self, config, name: str) -> ChannelPlan | None:
        """Channel ``name``'s plan for the fleet last published (None: nothing yet)."""
        found = self.latest.get(name)
        if found is None:
            return None
        key = (name, *found)
        if key not in self._plans:
            self._plans[key] = replan_channel(config, name, spread=found[0], fleet=found[1])
        return self._plans[key]
