"""Streams under a window guarantee: the planner against every slot at ε / w.

1,000 virtual wearers stream one value a minute (a slot) for four hours, each taken from
the BasicMotions recordings (benchmarks/recordings.py): a wearer does one activity
(Standing, Walking, Running, Badminton) for 20 to 60 minutes, then another, reading its
values from one recording of that activity (wrapping), so the fleet's mean moves as the
mix of activities changes.  The guarantee is ε per window of w slots (w-event LDP,
LDP-IDS, Ren et al., SIGMOD 2022), ε in {1, 4, 8}, w in {10, 60}; two designs spend it:

* **every slot at ε / w** (budget division): every wearer reports every slot;
* **the planner** (``[privacy] plan = "auto"``, edge_agent.config.planning): the spacing and ε
  per report it chooses for an agent configured with that guarantee and the channel,
  each wearer from a random phase (population division where it chooses one report
  per window).

Each slot's reports are perturbed with the channel's mechanism and estimated by the
collector's own linear block (``collector.aggregation.blocks.LinearBlock``: the mean
chosen by estimated error, its 95% interval); the truth is the mean of all 1,000
wearers' values in that slot.  Reported per cell and design:

* the RMSE of the **unbiased** estimate (the average of the reports for PM-C, the
  inversion of E[M(x)] = a x + b for OGPM): what the design delivers wherever the truth
  lies, and the ratio of the two designs' (the goal's);
* the RMSE of the **collector's** estimate, its mean 95% half-width and coverage.  Where
  reports carry almost nothing (every slot at ε / 60), the collector's estimate falls
  back towards the reconstruction's prior, the middle of the domain, with an interval
  that says so: its RMSE is then small only when the truth sits in the middle (pitch
  rate), and the half-width shows what the reader really knows.

Goals (issue 28): the planner's RMSE at least 3x lower for w >= 10, coverage >= 94%.

A second table sets the planner's stated error of the fleet's mean per hour
(``Plan.error``, with the data's own spread as ``plan_spread``) beside the RMSE of the
unbiased estimate measured over simulated hours of the pitch-rate recordings, at 100,
1,000 and 10,000 wearers (drawn from the recorded ones), for a guarantee that reports
several times an hour and one that reports less than once.

A third table measures what ``plan_spread = "auto"`` gains: for each signal, guarantee
(those where the spread decides between more and fewer reports, and one where it does
not), resolution read and fleet size, the plan an agent starts from (the assumed spread)
against the one it adopts once the collector has described its fleet, each measured the
same way per window of that resolution.

A fourth measures wearers' own guarantees (PBD/PBA-style, personalized w-event privacy,
PVLDB 2025): a share of the fleet asks for a stricter guarantee than the study's, and
the fleet's mean per hour of each wearer planned at its own guarantee, the strata
weighed by wearers as the collector weighs them (``fleet_mean``), is set beside everyone
planned at the stricter guarantee (what a study must do without strata), beside the same
reports pooled, and beside the study's stratum alone.

Run: ``python -m benchmarks.bench_stream [--slots 240] [--only own]
[--markdown docs/benchmarks/bench_stream.md]`` (``--only own``: the fourth table alone).
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from dataclasses import dataclass

import numpy as np

from benchmarks.machine import describe_machine
from benchmarks.recordings import ACC_FULL_SCALE, GYRO_FULL_SCALE, load_basic_motions
from collector.aggregation.blocks import LinearBlock
from collector.estimation.strata import StratumMean, stratified_mean
from edge_agent import protocol
from edge_agent.config import parse_config
from edge_agent.config.agent import PLAN_SPREAD_ASSUMED
from edge_agent.config.planning import replan_channel
from edge_agent.fleet_spreads import planned_fleet, planned_spread
from edge_agent.mechanisms import linear_mechanism
from edge_agent.mechanisms.randomness import as_random_source

WEARERS = 1000
SLOT = 60.0
BINS = 50
EPSILONS = (1.0, 4.0, 8.0)
WINDOWS = (10, 60)
ACTIVITIES = ("Standing", "Walking", "Running", "Badminton")


@dataclass(frozen=True)
class Stream:
    name: str
    low: float
    high: float
    mechanism: str
    values: np.ndarray  # (wearers, slots)


def streams(slots: int, seed: int) -> list[Stream]:
    """Each wearer's value per slot (module docstring), for two signals of the
    recordings on the domains a user would configure."""
    recording = load_basic_motions()
    rng = np.random.default_rng(seed)
    magnitude = np.sqrt((recording.acc ** 2).sum(axis=1))  # (cases, 100) m/s²
    pitch = recording.gyro[:, 1]  # rad/s
    cases = {a: np.flatnonzero(recording.cases(a)) for a in ACTIVITIES}
    case = np.empty((WEARERS, slots), dtype=np.int64)
    for wearer in range(WEARERS):
        start = 0
        while start < slots:
            length = int(rng.integers(20, 61))
            activity = ACTIVITIES[int(rng.integers(len(ACTIVITIES)))]
            case[wearer, start:start + length] = rng.choice(cases[activity])
            start += length
    offset = rng.integers(0, 100, size=(WEARERS, 1))
    index = (offset + np.arange(slots)) % 100
    signals = [("pitch rate", pitch, -GYRO_FULL_SCALE, GYRO_FULL_SCALE, "ogpm"),
               ("pitch rate", pitch, -GYRO_FULL_SCALE, GYRO_FULL_SCALE, "pm-c"),
               ("acceleration magnitude", magnitude, 0.0, ACC_FULL_SCALE, "pm-c")]
    return [Stream(name, low, high, mechanism, np.clip(signal[case, index], low, high))
            for name, signal, low, high, mechanism in signals]


def planned(stream: Stream, epsilon: float, w: int):
    """The planner's choice for one channel under ε per w slots (minutes)."""
    config = parse_config({
        "agent_id": "bench", "fleet": "bench", "batch_seconds": 1.0,
        "privacy": {"guarantees": [{"epsilon": epsilon, "per": f"{w}m"}],
                    "state_dir": "/tmp/unused", "range_epsilon_max": 0,
                    "plan_resolution": "1m"},
        "sources": [{"name": "s", "type": "synthetic", "rate_hz": 1}],
        "channels": [{"name": "c", "kind": "linear", "source": "s", "field": "accel_x",
                      "mechanism": stream.mechanism, "domain": [stream.low, stream.high]}]})
    return config.plan.channels[0]


def reporters(spacing: float, slots: int, rng) -> list[np.ndarray]:
    """Per slot, the wearers reporting in it (report times phase + k x spacing)."""
    phase = rng.uniform(0, spacing, WEARERS)
    by_slot: list[list[int]] = [[] for _ in range(slots)]
    for wearer in range(WEARERS):
        for t in np.arange(phase[wearer], slots * SLOT, spacing):
            by_slot[int(t // SLOT)].append(wearer)
    return [np.array(w, dtype=np.int64) for w in by_slot]


@dataclass
class Outcome:
    unbiased: np.ndarray  # per slot: the unbiased estimate's error
    collector: np.ndarray  # the collector's estimate's error
    half_width: np.ndarray
    covered: np.ndarray

    @staticmethod
    def rmse(errors: np.ndarray) -> float:
        return math.sqrt(float(np.mean(errors ** 2)))


def run_design(stream: Stream, epsilon_per_report: float, who: list[np.ndarray],
               seed: int) -> Outcome:
    """Each slot's estimates of the fleet mean against the truth."""
    mechanism = linear_mechanism(stream.mechanism, epsilon=epsilon_per_report,
                                 low=stream.low, high=stream.high, grid_bits=16)
    description = protocol.describe(mechanism)
    source = as_random_source(np.random.default_rng(seed))
    truth = stream.values.mean(axis=0)
    unbiased_name = "raw" if mechanism.unbiased else "inversion"
    rows = []
    for slot, wearers in enumerate(who):
        if not wearers.size:
            continue
        codes = mechanism.perturb_codes(stream.values[wearers, slot], source)
        block = LinearBlock(description, BINS)
        block.update(np.asarray(codes, dtype=np.int64))
        mean = block.get()["mean"]
        low, high = mean["ci95"]
        rows.append((mean["candidates"][unbiased_name]["estimate"] - truth[slot],
                     mean["estimate"] - truth[slot], (high - low) / 2,
                     low <= truth[slot] <= high))
    return Outcome(*(np.array(column) for column in zip(*rows)))


# The planner's stated error per hour against a fleet's: fleet sizes, simulated hours.
FLEETS = (100, 1000, 10_000)
HOURS = 200
HOUR = 3600.0


def planned_for(stream: Stream, guarantees: list[dict], *, fleet: int, spread: float,
                resolution: str = "1h"):
    """The configuration (and its one channel's plan) of a study reading ``resolution``,
    with this fleet size and ``spread`` as plan_spread."""
    config = parse_config({
        "agent_id": "bench", "fleet": "bench", "batch_seconds": 1.0,
        "privacy": {"guarantees": guarantees, "state_dir": "/tmp/unused",
                    "range_epsilon_max": 0, "plan_resolution": resolution,
                    "plan_fleet": fleet, "plan_spread": spread},
        "sources": [{"name": "s", "type": "synthetic", "rate_hz": 1}],
        "channels": [{"name": "c", "kind": "linear", "source": "s", "field": "accel_x",
                      "mechanism": stream.mechanism, "domain": [stream.low, stream.high]}]})
    return config, config.plan.channels[0]


def window_errors(stream: Stream, spacing: float, epsilon: float, *, fleet: int,
                  windows: int, seed: int, resolution: float = HOUR) -> np.ndarray:
    """Each simulated window's error of the unbiased estimate of the fleet's mean:
    ``fleet`` wearers drawn from the recorded ones (with replacement), one of the
    stream's windows of ``resolution`` seconds, each reporting the value of the slot it
    reports in, at its spacing from a random phase; the truth is the mean of every
    wearer's every slot of that window."""
    rng = np.random.default_rng(seed)
    source = as_random_source(rng)
    slots = int(resolution // SLOT)
    errors = np.empty(windows)
    for h in range(windows):
        first = int(rng.integers(stream.values.shape[1] // slots)) * slots
        wearers = rng.integers(WEARERS, size=fleet)
        values = stream.values[wearers, first:first + slots]
        reports = unbiased_reports(stream, values, spacing, epsilon, rng, source)
        errors[h] = (float(np.mean(reports)) if reports.size else
                     (stream.low + stream.high) / 2) - values.mean()
    return errors


def unbiased_reports(stream: Stream, values: np.ndarray, spacing: float, epsilon: float,
                     rng, source) -> np.ndarray:
    """The unbiased value of each report in one window of ``values`` (wearers x slots):
    each wearer reports the value of the slot it reports in, at ``spacing`` from a random
    phase, with the stream's mechanism at ``epsilon``; each report inverted through
    E[M(x)] = a x + b."""
    mechanism = linear_mechanism(stream.mechanism, epsilon=epsilon, low=stream.low,
                                 high=stream.high, grid_bits=16)
    slope, intercept = mechanism.affine_mean()[:2]
    wearers, slots = values.shape
    resolution = slots * SLOT
    phase = rng.uniform(0.0, spacing, wearers)
    count = np.where(phase < resolution,
                     np.floor((resolution - phase) / spacing) + 1, 0).astype(int)
    who = np.repeat(np.arange(wearers), count)
    times = phase[who] + spacing * (np.arange(who.size) - np.repeat(np.cumsum(count) - count,
                                                                   count))
    reported = values[who, (times // SLOT).astype(int)]
    outputs = mechanism.from_codes(mechanism.perturb_codes(reported, source))
    return (outputs - intercept) / slope


def stated_against_measured(stream: Stream, seed: int) -> list[str]:
    """Rows of the stated-against-measured table for one stream (module docstring)."""
    width = stream.high - stream.low
    spread = float(stream.values.std()) / width
    rows = []
    for guarantees in ([{"epsilon": 4, "per": "10m"}, {"epsilon": 48, "per": "1d"}],
                       [{"epsilon": 2, "per": "6h"}]):
        said = " + ".join(f"ε {g['epsilon']} per {g['per']}" for g in guarantees)
        for fleet in FLEETS:
            config, channel = planned_for(stream, guarantees, fleet=fleet, spread=spread)
            errors = window_errors(stream, channel.spacing, channel.epsilon, fleet=fleet,
                                   windows=HOURS, seed=seed + fleet)
            measured = Outcome.rmse(errors) / width
            stated = config.plan.error(channel, HOUR)
            rows.append(f"| {stream.name} | {stream.mechanism} | {said} | {fleet:,} | "
                        f"{channel.reports_per(HOUR):.3g} | {stated:.4f} | {measured:.4f} | "
                        f"{stated / measured:.2f} |")
            print(rows[-1], flush=True)
    return rows


# What plan_spread = "auto" is measured on: guarantees where the spread decides between
# more and fewer reports (a generous ε per window read), with the resolution read.
LEARNED = (([{"epsilon": 40, "per": "1h"}], "1m", SLOT),
           ([{"epsilon": 100, "per": "1d"}], "1h", HOUR),
           ([{"epsilon": 4, "per": "10m"}, {"epsilon": 48, "per": "1d"}], "1h", HOUR))
WINDOWS_MEASURED = 400


def learned_against_assumed(stream: Stream, seed: int) -> list[str]:
    """Rows of the table of what ``plan_spread = "auto"`` gains (module docstring): the
    plan for the assumed spread (``PLAN_SPREAD_ASSUMED``, what an agent starts from)
    against the plan an agent adopts once the collector has described the fleet
    (``planning.replan_channel`` for the fleet's spread and size as
    ``edge_agent.fleet_spreads`` rounds them), each measured over simulated windows of
    the resolution the study reads."""
    width = stream.high - stream.low
    real = float(stream.values.std()) / width
    learned = planned_spread(real)
    rows = []
    for guarantees, resolution, seconds in LEARNED:
        said = " + ".join(f"ε {g['epsilon']} per {g['per']}" for g in guarantees)
        for fleet in FLEETS:
            config, assumed = planned_for(stream, guarantees, fleet=fleet,
                                          spread=PLAN_SPREAD_ASSUMED, resolution=resolution)
            adopted = replan_channel(config, "c", spread=learned, fleet=planned_fleet(fleet))
            errors = [Outcome.rmse(window_errors(stream, plan.spacing, plan.epsilon,
                                                 fleet=fleet, windows=WINDOWS_MEASURED,
                                                 seed=seed + fleet, resolution=seconds))
                      / width for plan in (assumed, adopted)]
            rows.append(f"| {stream.name} | {stream.mechanism} | {said} | {resolution} | "
                        f"{fleet:,} | {real:.3f} | {assumed.spacing:.0f} s, ε {assumed.epsilon:.3g}"
                        f" | {errors[0]:.4f} | {learned:.3f} | {adopted.spacing:.0f} s, ε "
                        f"{adopted.epsilon:.3g} | {errors[1]:.4f} | {errors[0] / errors[1]:.2f}x |")
            print(rows[-1], flush=True)
    return rows


# Wearers' own guarantees: the study's, and the stricter ones some wearers ask for (the
# study's / STRICTER), for the share of wearers asking, chosen at random or as the most
# active (those of the highest mean: readings that differ from the others').
OWN_GUARANTEES = [{"epsilon": 4, "per": "10m"}, {"epsilon": 48, "per": "1d"}]
STRICTER = 4
# What the stricter wearers divide by STRICTER: every guarantee (fewer ε a report), or the
# daily one alone (fewer reports: pooling the reports would then underweight them).
STRICTER_WHICH = {"every": ("10m", "1d"), "daily": ("1d",)}
STRICT_SHARES = (0.1, 0.3)
OWN_HOURS = 200


def own_guarantees(stream: Stream, seed: int) -> list[str]:
    """Rows of the table of wearers' own guarantees (module docstring): per simulated
    hour, the fleet's mean (all 1,000 wearers) of four designs against the truth:
    everyone planned at the strictest guarantee asked for; each wearer at its own and the
    strata weighed by wearers (``collector.estimation.strata``, with each stratum's
    sample standard error, as the collector's); the same reports pooled; and the
    study's stratum alone (what the collector showed before the strata were combined)."""
    width = stream.high - stream.low
    spread = float(stream.values.std()) / width
    _, study = planned_for(stream, OWN_GUARANTEES, fleet=WEARERS, spread=spread)
    slots = int(HOUR // SLOT)
    rows = []
    for which, chosen, share in itertools.product(STRICTER_WHICH, ("at random", "most active"),
                                                  STRICT_SHARES):
        stricter = [{**g, "epsilon": g["epsilon"] / STRICTER}
                    if g["per"] in STRICTER_WHICH[which] else g for g in OWN_GUARANTEES]
        _, strict = planned_for(stream, stricter, fleet=WEARERS, spread=spread)
        rng = np.random.default_rng([seed, int(share * 100), chosen == "at random"])
        source = as_random_source(rng)
        asking = int(share * WEARERS)
        mask = np.zeros(WEARERS, dtype=bool)
        mask[rng.choice(WEARERS, asking, replace=False) if chosen == "at random"
             else np.argsort(stream.values.mean(axis=1))[-asking:]] = True
        errors: dict[str, list[float]] = {"uniform": [], "own": [], "pooled": [],
                                          "study": []}
        covered = 0
        for _ in range(OWN_HOURS):
            first = int(rng.integers(stream.values.shape[1] // slots)) * slots
            values = stream.values[:, first:first + slots]
            truth = float(values.mean())
            uniform = unbiased_reports(stream, values, strict.spacing, strict.epsilon,
                                       rng, source)
            groups = [unbiased_reports(stream, values[~mask], study.spacing,
                                       study.epsilon, rng, source),
                      unbiased_reports(stream, values[mask], strict.spacing,
                                       strict.epsilon, rng, source)]
            combined = stratified_mean(
                [StratumMean(weight, float(np.mean(g)) if g.size else math.nan,
                             float(np.std(g, ddof=1) / math.sqrt(g.size))
                             if g.size > 1 else math.nan, 0.0, g.size)
                 for weight, g in zip((1.0 - share, share), groups)],
                low=-math.inf, high=math.inf)
            covered += combined["ci95"][0] <= truth <= combined["ci95"][1]
            errors["uniform"].append(float(np.mean(uniform)) - truth)
            errors["own"].append(combined["estimate"] - truth)
            errors["pooled"].append(float(np.mean(np.concatenate(groups))) - truth)
            errors["study"].append(float(np.mean(groups[0])) - truth)
        rmse = {name: Outcome.rmse(np.array(e)) / width for name, e in errors.items()}
        asked = " + ".join(f"ε {g['epsilon']:g} per {g['per']}" for g in stricter)
        rows.append(f"| {stream.name} | {stream.mechanism} | {asked} | {share:.0%} {chosen} | "
                    f"{study.spacing:.0f} s, ε {study.epsilon:.3g} | "
                    f"{strict.spacing:.0f} s, ε {strict.epsilon:.3g} | "
                    f"{rmse['uniform']:.4f} | {rmse['own']:.4f} | "
                    f"{covered / OWN_HOURS:.1%} | {rmse['uniform'] / rmse['own']:.2f}x | "
                    f"{rmse['pooled']:.4f} | {rmse['study']:.4f} |")
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=240, help="slots (minutes) per stream")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--markdown", help="write the table here")
    parser.add_argument("--only", choices=["own"], help="one table alone: own (wearers' own "
                                                        "guarantees)")
    args = parser.parse_args()
    began = time.time()
    if args.only == "own":
        lines = own_guarantees_table(args.slots, args.seed)
        lines.insert(0, f"bench_stream --only own: {describe_machine()}; "
                        f"{time.time() - began:.0f} s.")
        write(lines, args.markdown)
        return
    rows = []
    for stream in streams(args.slots, args.seed):
        width = stream.high - stream.low
        for w in WINDOWS:
            for epsilon in EPSILONS:
                plan = planned(stream, epsilon, w)
                rng = np.random.default_rng([args.seed, w, int(epsilon * 10)])
                every = run_design(stream, epsilon / w, [np.arange(WEARERS)] * args.slots,
                                   seed=int(rng.integers(2**31)))
                who = reporters(plan.spacing, args.slots, rng)
                chosen = run_design(stream, plan.epsilon, who, seed=int(rng.integers(2**31)))
                rows.append((stream, w, epsilon, plan, every, chosen, width,
                             float(np.mean([x.size for x in who]))))
                ratio = Outcome.rmse(every.unbiased) / Outcome.rmse(chosen.unbiased)
                print(f"{stream.name} {stream.mechanism} w={w} eps={epsilon:g}: unbiased "
                      f"{Outcome.rmse(every.unbiased):.4g} vs {Outcome.rmse(chosen.unbiased):.4g}"
                      f" ({ratio:.1f}x); coverage {every.covered.mean():.1%} / "
                      f"{chosen.covered.mean():.1%}", flush=True)
    lines = [
        f"Streams under a window guarantee (benchmarks/bench_stream.py): {WEARERS:,} wearers, "
        f"{args.slots} one-minute slots, seed {args.seed}; {describe_machine()}; "
        f"{time.time() - began:.0f} s.", "",
        "Each slot's estimate of the fleet mean: RMSE of the unbiased estimate and of the "
        "collector's, relative to the domain's width; the collector's mean 95% half-width "
        "(relative) and coverage.", "",
        "| signal | mechanism | w | ε per window | every slot at ε/w: unbiased RMSE | "
        "collector RMSE | half-width | coverage | planner: every | ε per report | "
        "reports per slot | unbiased RMSE | collector RMSE | half-width | coverage | "
        "ratio (unbiased) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    ratios, coverage = [], []
    for stream, w, epsilon, plan, every, chosen, width, per_slot in rows:
        ratio = Outcome.rmse(every.unbiased) / Outcome.rmse(chosen.unbiased)
        ratios.append(ratio)
        coverage.append(chosen.covered.mean())
        cells = []
        for outcome in (every, chosen):
            cells.append(f"{Outcome.rmse(outcome.unbiased) / width:.4f} | "
                         f"{Outcome.rmse(outcome.collector) / width:.4f} | "
                         f"{outcome.half_width.mean() / width:.4f} | "
                         f"{outcome.covered.mean():.1%}")
        lines.append(f"| {stream.name} | {stream.mechanism} | {w} | {epsilon:g} | {cells[0]} | "
                     f"{plan.spacing:.0f} s | {plan.epsilon:.4g} | {per_slot:.0f} | {cells[1]} | "
                     f"{ratio:.1f}x |")
    every_coverage = [r[4].covered.mean() for r in rows]
    pooled = np.concatenate([r[5].covered for r in rows]).mean()
    lines += ["", f"Least ratio {min(ratios):.1f}x, median {np.median(ratios):.1f}x (goal >= 3x "
                  f"for w >= 10); planner coverage {min(coverage):.1%} to {max(coverage):.1%}, "
                  f"{pooled:.1%} pooled (goal >= 94%); every slot at ε/w "
                  f"{min(every_coverage):.1%} to {max(every_coverage):.1%}."]
    lines += ["", "The planner's stated error of the fleet's mean per hour (expected, with the "
                  "data's own spread as plan_spread) against the RMSE of "
                  f"the unbiased estimate over {HOURS} simulated hours: fleets drawn from the "
                  "recorded wearers, each reporting the value of the minute it reports in, at "
                  "the plan's spacing from a random phase (relative to the domain's width).",
              "", "| signal | mechanism | guarantee | wearers | reports per wearer an hour | "
                  "stated | measured | stated / measured |",
              "|---|---|---|---:|---:|---:|---:|---:|"]
    for stream in streams(args.slots, args.seed):
        if stream.name == "pitch rate":
            lines += stated_against_measured(stream, args.seed)
    lines += ["", "What `plan_spread = \"auto\"` gains: the plan an agent starts from (the "
                  f"assumed spread, {PLAN_SPREAD_ASSUMED:g} of the width) against the plan it "
                  "adopts once the collector has described the fleet (its spread rounded up "
                  "and its size rounded down as an agent rounds them): the same shares of the "
                  "guarantee, another spacing; the RMSE of the unbiased mean per window of "
                  f"the resolution read, over {WINDOWS_MEASURED} simulated windows each "
                  "(relative to the domain's width).",
              "", "| signal | mechanism | guarantee | resolution | wearers | real spread | "
                  "assumed: every | RMSE | learned spread | learned: every | RMSE | gain |",
              "|---|---|---|---|---:|---:|---|---:|---:|---|---:|---:|"]
    for stream in streams(args.slots, args.seed):
        lines += learned_against_assumed(stream, args.seed)
    lines += own_guarantees_table(args.slots, args.seed)
    write(lines, args.markdown)


def write(lines: list[str], markdown: str | None) -> None:
    text = "\n".join(lines) + "\n"
    print(text)
    if markdown:
        with open(markdown, "w") as file:
            file.write(text)


def own_guarantees_table(slots: int, seed: int) -> list[str]:
    said = " + ".join(f"ε {g['epsilon']} per {g['per']}" for g in OWN_GUARANTEES)
    lines = ["", f"Wearers' own guarantees: the study states {said}; a share of its "
                  f"{WEARERS:,} wearers asks for {STRICTER} times less ε in every guarantee, "
                  "or in the daily one (chosen at random, or the most active: the highest "
                  "mean readings).  The RMSE of the fleet's "
                  f"mean per hour over {OWN_HOURS} simulated hours (relative to the domain's "
                  "width, unbiased estimates) of: everyone planned at the stricter guarantee; "
                  "each wearer at its own, the strata weighed by wearers (the collector's "
                  "fleet_mean, with its 95% coverage); the same reports pooled; the study's "
                  "stratum alone.",
              "", "| signal | mechanism | stricter guarantee | stricter wearers | study: every | "
                  "stricter: every | "
                  "everyone at the stricter | own guarantees, by wearers | coverage | gain | "
                  "pooled reports | study's alone |",
              "|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for stream in streams(slots, seed):
        if stream.mechanism == "pm-c":
            lines += own_guarantees(stream, seed)
    return lines


if __name__ == "__main__":
    main()
