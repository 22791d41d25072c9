"""The privacy boundary (docs/guides/PRIVACY.md): nothing that depends on a raw reading leaves the
device except the reports' codes.

The differential test runs an agent, and a fleet, twice through a real Mosquitto with
the same seed on two recordings that differ only in their readings: finite values
inside, outside and around the domains, and non-finite ones of different kinds (NaN,
+inf, -inf, 1e999) in the same places.  Every byte published is captured; apart from
the reports' ``codes``, the two runs must publish exactly the same messages, and the
codes must decode with the mechanism each report names.
"""

from __future__ import annotations

import csv
import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from edge_agent import protocol
from edge_agent.agent import STATE_FILE, AgentCore, AgentService
from edge_agent.channels import build_channel, vector_plan
from edge_agent.config import VectorChannelConfig, parse_config
from edge_agent.fleet import fleet_service
from edge_agent.mechanisms import from_description, split_epsilon
from edge_agent.mechanisms.randomized_response import RandomizedResponse
from edge_agent.mechanisms.rangefind import answer_epsilon
from edge_agent.mechanisms.registry import KIND_CONFIG_NAMES, VECTOR
from edge_agent.readings import Readings
from edge_agent.sources.base import Source
from edge_agent.state import NANO, StateStore
from tests.support import MqttClient, SimulatedTime, Subscriber, agent_config, wait_until

T0 = 1_800_000_000.0
DAY = 86400.0
FIELDS = ("lin", "ang", "r", "th", "vx", "vy", "vz")
CHANNELS = [
    {"name": "lin", "source": "rec", "kind": "linear", "field": "lin", "epsilon": 1.0,
     "domain": [-2.0, 2.0]},
    {"name": "ang", "source": "rec", "kind": "circular", "field": "ang", "epsilon": 1.0,
     "origin": -math.pi},  # signed angles: a wrapped count would tell their signs
    {"name": "pol", "source": "rec", "kind": "polar", "fields": ["r", "th"], "epsilon": 2.0,
     "radius_max": 3.0},
    {"name": "vec", "source": "rec", "kind": "vector", "fields": ["vx", "vy", "vz"],
     "epsilon": 1.5, "domain": [-1.0, 1.0], "strategy": "split"},
    {"name": "one", "source": "rec", "kind": "vector", "fields": ["vx", "vy", "vz"],
     "epsilon": 1.0, "domain": [-1.0, 1.0], "strategy": "sample", "k": 1},
]
ROWS = 120
NON_FINITE = {  # (row, field) -> what each recording holds there
    **{(i, "lin"): ("nan", "inf") for i in range(0, ROWS, 7)},
    **{(i, "ang"): ("-inf", "nan") for i in range(3, ROWS, 11)},
    **{(i, "r"): ("1e999", "-inf") for i in range(5, ROWS, 13)},
    **{(i, "vy"): ("inf", "-1e999") for i in range(2, ROWS, 9)},
}


def recordings(tmp_path):
    """Two CSV recordings with the same shape: A's finite readings inside the domains,
    B's outside them (clipped), wrapped around the circle, or at the edges."""
    rng = np.random.default_rng(3)
    inside = {"lin": rng.uniform(-2, 2, ROWS), "ang": rng.uniform(-math.pi, math.pi, ROWS),
              "r": rng.uniform(0, 3, ROWS), "th": rng.uniform(0, 2 * math.pi, ROWS),
              **{f: rng.uniform(-1, 1, ROWS) for f in ("vx", "vy", "vz")}}
    outside = {"lin": rng.choice([-1e6, -2.0, 2.0, 50.0, 1e300], ROWS),
               "ang": rng.uniform(-40, 40, ROWS), "r": rng.uniform(3, 1e9, ROWS),
               "th": rng.uniform(-1e6, 1e6, ROWS),
               **{f: rng.choice([-7.0, -1.0, 1.0, 9.0], ROWS) for f in ("vx", "vy", "vz")}}
    paths = []
    for name, finite, which in (("a", inside, 0), ("b", outside, 1)):
        path = tmp_path / f"{name}.csv"
        with path.open("w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(FIELDS)
            for i in range(ROWS):
                writer.writerow([NON_FINITE[(i, f)][which] if (i, f) in NON_FINITE
                                 else repr(float(finite[f][i])) for f in FIELDS])
        paths.append(path)
    return paths


def config_for(tmp_path, mosquitto, recording, run: str, budget: float, planned: bool = False):
    source = {"name": "rec", "type": "csv", "path": str(recording), "pace": "fast",
              "rate_hz": 50.0, "columns": {f: f for f in FIELDS}}
    if planned:  # the planner's epsilons and schedule: a reading a second, for minutes
        data = agent_config(
            state_dir=tmp_path / f"state-{run}", broker=mosquitto, budget=None,
            batch_seconds=1.0, privacy={"guarantees": [{"epsilon": 4, "per": "1m"}]},
            channels=[{k: v for k, v in c.items() if k != "epsilon"} for c in CHANNELS],
            sources=[{**source, "pace": "fixed", "rate_hz": 1.0, "loop": True}])
    else:
        data = agent_config(state_dir=tmp_path / f"state-{run}", broker=mosquitto,
                            budget=budget, batch_seconds=1.0, channels=CHANNELS,
                            sources=[source])
    return parse_config(data)


PLANNED_SECONDS = 200  # a planned run's batches, one a second: each channel reports


def publish_once(service: AgentService, times=(T0,)) -> None:
    """A batch of what the recording holds at each of ``times``, a status, then a clean
    stop: the run loop's steps in a fixed order (the run loop times them by the clock)."""
    for core in service.cores:
        core.warm_up()
        core.start()
    service.transport.start()
    assert wait_until(lambda: service.transport.connected, 10)
    for now in times:
        service.tick(now)
    service._publish_status()
    service._shutdown()


def captured(tmp_path, mosquitto, recording, run: str, *, fleet: int | None = None,
             budget: float = 1e6, planned: bool = False) -> list[tuple[str, bytes, bool]]:
    """Every message the agent (or fleet) publishes for ``recording``, in order."""
    subscriber = Subscriber(mosquitto, f"{protocol.TOPIC_ROOT}/#")
    config = config_for(tmp_path, mosquitto, recording, run, budget, planned)
    rng = np.random.default_rng(11)
    clock = lambda: T0  # noqa: E731  (statuses and reports carry no time that differs)
    # The ledger's clock paced by a simulated monotonic clock, so that batches a second
    # apart are a second apart for it too, however fast the test runs them.
    time = SimulatedTime(T0 - 1)
    store = StateStore(Path(config.privacy.state_dir) / STATE_FILE,
                       monotonic=time.monotonic, boot_id=time.boot_id)
    service = (AgentService(config, rng=rng, clock=clock, drain_timeout=10, store=store)
               if fleet is None else fleet_service(config, count=fleet, rng=rng, clock=clock,
                                                   drain_timeout=10, store=store))
    publish_once(service, (time.advance(1.0) for _ in range(PLANNED_SECONDS if planned else 1)))
    assert wait_until(lambda: any(b'"offline"' in p for _, p, _ in subscriber.messages), 10)
    subscriber.close()
    mosquitto_clear_retained(mosquitto, subscriber.messages)
    return list(subscriber.messages)


def mosquitto_clear_retained(mosquitto, messages) -> None:
    """The next run's subscriber must not receive this run's retained statuses."""
    client = MqttClient(mosquitto, v5=False).connect()
    for topic in {t for t, _, _ in messages if t.endswith("/status")}:
        client.acked(client.publish(topic, b"", retain=True))
    client.close()


def checked_codes(report: dict) -> list:
    """The report's codes, each decoded by the mechanism the report names (a code off
    its grid raises)."""
    mechanism, codes = from_description(report["mechanism"]), report["codes"]
    if report["kind"] == "polar":
        parts = [(mechanism.radius_mechanism, codes[0]), (mechanism.angle_mechanism, codes[1])]
    elif report["kind"] == "vector":
        parts = [(mechanism, axis) for axis in codes]
    else:
        parts = [(mechanism, codes)]
    for part, values in parts:
        part.from_codes(np.array(values, dtype=np.int64))
    return codes


def without_codes(messages) -> tuple[list, list]:
    """(every message, each report's codes taken out; the reports' codes, checked)."""
    shapes, codes = [], []
    for topic, payload, retained in messages:
        if topic.endswith("/status"):
            shapes.append((topic, payload, retained))
            continue
        report = json.loads(payload)
        codes.append(checked_codes(report))
        del report["codes"]
        shapes.append((topic, report, retained))
    return shapes, codes


@pytest.mark.parametrize("fleet, planned", [(None, False), (2, False), (None, True), (2, True)],
                         ids=["agent", "fleet", "planned-agent", "planned-fleet"])
def test_only_the_codes_differ_between_runs_on_different_readings(tmp_path, mosquitto, fleet,
                                                                  planned):
    """Planned: the planner's schedule (a CSPRNG phase, then a report every spacing) is
    the same whatever the readings."""
    a, b = recordings(tmp_path)
    first = captured(tmp_path, mosquitto, a, "a", fleet=fleet, planned=planned)
    second = captured(tmp_path, mosquitto, b, "b", fleet=fleet, planned=planned)
    shapes_a, codes_a = without_codes(first)
    shapes_b, codes_b = without_codes(second)
    reports = [s for s in shapes_a if not s[0].endswith("/status")]
    assert len(reports) >= 5 * (fleet or 1)  # every channel reported
    assert {report["channel"] for _, report, _ in reports} == {c["name"] for c in CHANNELS}
    if planned:  # more than once: the schedule ran, not only the first phase
        assert len(reports) >= 2 * 5 * (fleet or 1)
    assert shapes_a == shapes_b
    assert codes_a != codes_b  # the readings do differ (and the codes with them)
    statuses = [json.loads(p) for t, p, _ in first if t.endswith("/status") and p]
    for status in statuses:
        for channel in status.get("channels", {}).values():
            assert set(channel) == {"exhausted", "reports", "messages"}


def test_a_budget_that_runs_out_runs_out_alike(tmp_path, mosquitto):
    """Exhaustion depends on how many readings were reported, never on their values."""
    a, b = recordings(tmp_path)
    shapes_a, _ = without_codes(captured(tmp_path, mosquitto, a, "a", budget=60.0))
    shapes_b, _ = without_codes(captured(tmp_path, mosquitto, b, "b", budget=60.0))
    assert shapes_a == shapes_b
    last = json.loads([p for t, p, _ in reversed(shapes_a) if t.endswith("/status")][0])
    assert any(channel["exhausted"] for channel in last["channels"].values())


# -- readings that are not numbers ---------------------------------------------------------

class Scripted(Source):
    def __init__(self, columns):
        super().__init__("rec")
        self.columns = columns

    def poll(self, now):
        n = len(next(iter(self.columns.values())))
        return Readings(now - 1 + np.arange(n) / n, {k: np.asarray(v, dtype=float)
                                                     for k, v in self.columns.items()})


def core_for(tmp_path, channels, columns, budget=1e6, period=None, **kw):
    config = parse_config(agent_config(state_dir=tmp_path, budget=budget, period=period,
                                       channels=channels,
                                       sources=[{"name": "rec", "type": "jsonl"}]))
    store = StateStore(tmp_path / "state.sqlite", **kw)
    return AgentCore(config, store, sources={"rec": Scripted(columns)},
                     rng=np.random.default_rng(0)), store


def spooled(store):
    return [json.loads(p) for _, _, p, _ in store.pending(0, 10_000)]


def test_infinite_readings_are_dropped_and_never_cost_the_batch(tmp_path):
    values = [0.5, math.inf, -math.inf, math.nan, float("1e999"), -0.5]
    core, store = core_for(tmp_path, CHANNELS[:2], {"lin": values, "ang": values})
    core.tick(T0)
    sent = spooled(store)
    assert [(m["channel"], len(m["codes"])) for m in sent] == [("lin", 2), ("ang", 2)]
    assert core.local_status()["channels"]["lin"]["non_finite_dropped"] == 4


def test_a_channel_that_fails_costs_only_its_own_batch(tmp_path, caplog):
    core, store = core_for(tmp_path, CHANNELS[:2], {"lin": [0.1, 0.2], "ang": [0.3, 0.4]})
    broken = core.channels[0]

    def fail(*args, **kwargs):
        raise RuntimeError("a kernel bug")

    broken.build_message = fail
    core.tick(T0)
    assert [m["channel"] for m in spooled(store)] == ["ang"]
    assert store.spent("w1", DAY, T0) == core.channels[1].charge_nano * 2
    assert store.next_seq("w1", "lin") == 0
    assert core.local_status()["channels"]["lin"]["errors"] == 1
    assert "channel lin: its batch failed" in caplog.text


# -- a budget that only moves forward -------------------------------------------------------

BUDGET = 5.0


def spending_by_real_time(tmp_path, steps) -> list[tuple[float, int]]:
    """Run one linear channel (10 readings a tick, budget 5 at 1 per reading) through
    ``steps`` and return (real time, nano charged) per tick.  Steps: ("tick", seconds
    of real time pass), ("step", seconds the wall clock is set by), ("restart", None),
    ("reboot", seconds of real time the device is off: the monotonic clock starts
    again), ("period", a new budget_period, with a restart)."""
    clock, real, period = SimulatedTime(T0), T0, "1d"
    charges: list[tuple[float, int]] = []
    state: dict = {}

    def start():
        if "store" in state:
            state["store"].close()
        state["core"], state["store"] = core_for(
            tmp_path, CHANNELS[:1], {"lin": [0.1] * 10}, budget=BUDGET, period=period,
            monotonic=clock.monotonic, boot_id=clock.boot_id)

    start()
    reported = 0
    for kind, value in steps:
        if kind == "tick":
            real = real + value
            state["core"].tick(clock.advance(value))
            now_reported = sum(len(m["codes"]) for m in spooled(state["store"]))
            charges.append((real, (now_reported - reported)
                            * state["core"].channels[0].charge_nano))
            reported = now_reported
        elif kind == "step":
            clock.step(value)
        elif kind == "reboot":
            real += value
            clock.reboot(value)
            clock.wall = real  # NTP set it right
            start()
        else:
            period = value if kind == "period" else period
            start()
    return charges


def window_before(charges, end: float, window_seconds: float) -> int:
    """Nano charged in the window of real time (end - window_seconds, end]."""
    return sum(c for t, c in charges if end - window_seconds < t <= end)


def test_a_clock_stepped_back_or_forward_gives_no_budget_back(tmp_path):
    steps = [("tick", 1.0)] * 3 + [("step", -DAY)] + [("tick", 1.0)] * 3 \
        + [("restart", None)] + [("tick", 1.0)] * 3 \
        + [("step", +DAY)] + [("tick", 1.0)] * 3 \
        + [("step", +3 * DAY), ("restart", None)] + [("tick", 1.0)] * 3 \
        + [("step", -3 * DAY - 10)] + [("tick", 600.0)] * 3 \
        + [("reboot", 5 * DAY)] + [("tick", 1.0)] * 3
    charges = spending_by_real_time(tmp_path, steps)
    assert charges[0][1] == BUDGET * NANO  # the first tick spends it all ...
    assert all(c == 0 for _, c in charges[1:-3])  # ... and no clock step gives any back
    # Days later (the device was off; the clock had shown a time 4 days ahead, so it
    # must have passed that too): the budget is back.
    assert charges[-3][1] == BUDGET * NANO
    for end, _ in charges:
        assert window_before(charges, end, DAY) <= BUDGET * NANO


def test_changing_the_period_from_a_day_to_a_week_keeps_what_was_spent(tmp_path):
    steps = [("tick", 1.0)] + [("tick", DAY / 2)] * 3 + [("period", "1w")] \
        + [("tick", DAY / 2)] * 20
    charges = spending_by_real_time(tmp_path, steps)
    assert sum(c for _, c in charges[:4]) == 2 * BUDGET * NANO  # two days: the daily rule
    # Under the weekly rule, every week ending at a charge holds one budget, counting what
    # the daily rule spent before the change.
    later = [(t, c) for t, c in charges[4:] if c]
    assert later, "the weekly budget came back after a week"
    for end, _ in later:
        assert window_before(charges, end, 7 * DAY) <= BUDGET * NANO


# -- exact accounting -------------------------------------------------------------------------

# Every kind, and a 5-axis split at epsilon 15.36 with every scalar mechanism (the float
# epsilon / 5 composed to more than the float 15.36 before shares were rounded down), and
# the mechanisms of whole vectors (their own k of 5, pure epsilon).
KINDS = CHANNELS + [
    {"name": f"split-{name}", "source": "rec", "kind": "vector",
     "fields": ["a", "b", "c", "d", "e"], "epsilon": 15.36, "domain": [-1.0, 1.0],
     "mechanism": name, **({} if name in VECTOR else {"strategy": "split"})}
    for name in KIND_CONFIG_NAMES["vector"]
] + [{"name": "auto", "source": "rec", "kind": "vector", "fields": ["a", "b", "c"],
      "epsilon": 0.3, "domain": [0.0, 5.0], "strategy": "auto"}]


@pytest.mark.parametrize("channel", KINDS, ids=[c["name"] for c in KINDS])
def test_every_channel_is_charged_at_least_its_exact_composed_loss(channel):
    config = parse_config(agent_config(state_dir="/tmp/unused", channels=[channel],
                                       sources=[{"name": "rec", "type": "jsonl"}]))
    built = build_channel(config.channels[0], agent_id="w1", fleet="demo")
    loss = built.privacy_loss()
    assert loss.at_most(Fraction(built.charge_nano, NANO))
    assert not loss.at_most(Fraction(built.charge_nano - 1, NANO))  # and not a unit more
    assert loss.at_most(Fraction(channel["epsilon"]))  # the configured epsilon holds exactly


@pytest.mark.parametrize("d", [2, 3, 5, 7, 64])
@pytest.mark.parametrize("epsilon", [15.36, 0.1, 1.0, 3.3, 19.99])
def test_a_vector_split_composes_to_at_most_epsilon_exactly(d, epsilon):
    share = split_epsilon(epsilon, d)
    assert Fraction(share) * d <= Fraction(epsilon)
    assert Fraction(math.nextafter(share, math.inf)) * d > Fraction(epsilon) or \
        share == epsilon / d
    fields = [f"f{i}" for i in range(d)]
    k, axis = vector_plan(VectorChannelConfig(name="v", source="s", kind="vector",
                                              fields=fields, epsilon=epsilon,
                                              domain=(-1.0, 1.0), strategy="split"))
    assert k == d and Fraction(axis) * d <= Fraction(epsilon)


@pytest.mark.parametrize("rounds", [1, 3, 7, 10, 64])
@pytest.mark.parametrize("epsilon", [0.1, 1.0, 4.0, 15.36])
def test_range_discovery_answers_compose_to_at_most_the_run_epsilon(rounds, epsilon):
    for strategy, answers in (("sequential", rounds), ("split", 1)):
        mechanism = RandomizedResponse(epsilon=answer_epsilon(epsilon, rounds, strategy))
        one = mechanism.exact_privacy_loss()
        total = sum([one] * (answers - 1), one)
        assert total.at_most(Fraction(epsilon))
        assert one.at_most(Fraction(one.ceiling(NANO), NANO))


# -- domain = "auto" --------------------------------------------------------------------------

class KnownRange:
    """A range responder that has heard a discovered range for ``lin``."""

    def __init__(self, low, high, interval=None):
        result = type("Result", (), {"interval": None, "participants": None})
        self.results = {("lin", "min"): result(), ("lin", "max"): result()}
        self.results[("lin", "min")].estimate = low
        self.results[("lin", "max")].estimate = high
        if interval is not None:  # (the min's, the max's)
            self.results[("lin", "min")].interval = interval[0]
            self.results[("lin", "max")].interval = interval[1]

    def observe(self, *args):
        pass


def test_a_discovered_range_is_adopted_when_a_period_begins_never_mid_period(tmp_path):
    auto = {**CHANNELS[0], "domain": "auto", "initial_domain": [-10.0, 10.0],
            "domain_margin": 0.0}
    core, _ = core_for(tmp_path, [auto], {"lin": [0.5]})
    core.range = KnownRange(-1.0, 1.0)
    mid_period = 20 * DAY + DAY / 2  # an agent (re)started in the middle of a UTC day
    core.tick(mid_period)
    core.tick(mid_period + 3600)
    assert (core.channels[0].mechanism.low, core.channels[0].mechanism.high) == (-10.0, 10.0)
    core.tick(21 * DAY + 1)  # the next period
    # [-1, 1] with no margin, and as much more as keeps it out of OGPM's flat ends
    mechanism = core.channels[0].mechanism
    assert -10.0 < mechanism.low < -1.0 and mechanism.low == -mechanism.high
    assert mechanism.affine_mean()[2:] == pytest.approx((-1.0, 1.0), abs=1e-12)


def test_a_discovered_range_in_ogpms_flat_end_is_logged_naming_the_channel(tmp_path, caplog):
    core, _ = core_for(tmp_path, CHANNELS[:1], {"lin": [0.5]})
    core.range = KnownRange(-1.9, -1.6, interval=((-2.0, -1.85), (-1.7, -1.5)))
    caplog.set_level("INFO")
    core.tick(20 * DAY + 1)  # ranges are taken when a period begins, not at the start
    core.tick(21 * DAY + 1)
    flat = [r.getMessage() for r in caplog.records if "reports the same distribution" in
            r.getMessage()]
    assert len(flat) == 1 and "channel lin" in flat[0] and "[-2, -1.5]" in flat[0], flat
    caplog.clear()
    core.range = KnownRange(-0.4, 0.4, interval=((-0.5, -0.3), (0.3, 0.5)))
    core.tick(22 * DAY + 1)
    assert "reports the same distribution" not in caplog.text


def test_an_auto_domain_adopts_the_intervals_outer_ends_out_of_ogpms_flat_ends(tmp_path):
    auto = {**CHANNELS[0], "domain": "auto", "initial_domain": [-10.0, 10.0],
            "domain_margin": 0.1}
    core, _ = core_for(tmp_path, [auto], {"lin": [0.5]})
    core.range = KnownRange(-1.0, 1.0, interval=((-1.2, -0.9), (0.8, 1.3)))
    core.tick(20 * DAY + 1)
    core.tick(21 * DAY + 1)
    mechanism = core.channels[0].mechanism
    _, _, x_lo, x_hi = mechanism.affine_mean()
    assert -10.0 < mechanism.low < x_lo <= -1.2 and 1.3 <= x_hi < mechanism.high < 10.0
    assert x_lo == pytest.approx(-1.2) or mechanism.low == pytest.approx(-1.2 - 0.1 * 2.5)


def test_a_clock_behind_is_logged_once_and_its_readings_counted(tmp_path, caplog):
    clock = SimulatedTime(T0)
    core, store = core_for(tmp_path, CHANNELS[:1], {"lin": [0.1] * 4},
                           monotonic=clock.monotonic, boot_id=clock.boot_id)
    caplog.set_level("INFO")
    core.tick(clock.wall)
    clock.step(-DAY)
    for _ in range(3):
        core.tick(clock.advance(1.0))
    behind = [r for r in caplog.records if "the clock is behind" in r.getMessage()]
    assert len(behind) == 1 and core.local_status()["clock_behind"] is True
    assert core.local_status()["channels"]["lin"]["clock_behind"] == 12
    assert len(spooled(store)) == 1
    clock.step(DAY)
    core.tick(clock.advance(1.0))
    assert "the clock has caught up" in caplog.text and len(spooled(store)) == 2
