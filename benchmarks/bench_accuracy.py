"""Accuracy of the collector's estimates on real sensor recordings, through the offline replay.

The data: the BasicMotions smart-watch recordings (accelerometer and gyroscope, 10 Hz),
read out of the pinned ``aeon`` wheel on PyPI and checked by sha256; four data sets built
from them (``benchmarks/recordings.py`` says which and why, with what the recordings
contain):

(a) ``rotation rate``: |ω| on [0, 2000 °/s], most readings near the low end;
(b) ``acceleration, walk + run``: |a| on [0, 4 g], bimodal;
(c) ``pitch rate``: a gyroscope axis at the centre of its ±2000 °/s range;
(d) ``acceleration direction``: atan2(a_y, a_x) on [-π, π), spread (circular OGPM).

For every linear data set, mechanism, ε in {0.5, 1, 2, 4, 8} and N in {500, 5,000,
50,000, 200,000}, each repetition draws N readings with replacement from the data set (seeded
numpy generators, one for the draw and one per mechanism: the run is reproducible whatever
``--jobs`` or ``--mechanisms``; the truth is the mean of the N drawn values), perturbs them
with every mechanism (``perturb_codes``), and turns the codes into report messages as an
agent does (``protocol.report``: 500 values a message, spread over 10 agents, one channel
per mechanism).  The messages, as replay lines ``{"topic": ..., "payload": <report>}``, go
through the collector's offline replay (``estimate``: ``collector.tools.replay.replay_lines``),
and every number is read from the channels document it returns (GET /api/channels):

* the mean: mean absolute error and RMSE of ``mean.estimate`` and of the raw average
  ``mean.raw`` against the truth, the ratio of the two mean absolute errors, how often
  each ``mean.method`` was chosen, and the share of ``mean.ci95`` covering the truth
  (with its binomial standard error);
* the histogram: L1 distance from the drawn values' histogram on the collector's bins
  (``histogram.edges``) of the raw report histogram ``histogram.raw`` (reports outside
  the domain are not in it, so its mass can be below 1) and of the reconstruction
  ``histogram.estimate``;
* circular (d): the error of the mean direction (wrapped), of the resultant length
  (``resultant_length.estimate`` and ``.raw``), the histogram distances, and the
  coverage of the direction's and the resultant length's 95 % intervals where the
  channel document has ``ci95`` fields for them (skipped, and said so, where not).

The mechanisms: classical OGPM, PM-C, SW-C, truncated and bounded Laplace by default
(configuration names ``ogpm``, ``pm-c``, ``sw-c``, ``laplace``, ``bounded-laplace``);
PM, OGPM-U and II-PTT (``pm``, ``ogpm-unbiased``, ``ii-ptt``) with ``--mechanisms``, e.g.
``--mechanisms PM,OGPM-U,II-PTT``.  Those are left out of the default run because (1) they
are unbiased,
so the raw average is already an unbiased estimate and the collector has the least to
add, and (2) their output domain is several times the input domain (OGPM-U at ε = 0.5
reports on [-315, 355] for [0, 39.2]), so every channel document runs its EM
reconstructions over many more output bins: with the collector's estimators of this
writing they take about 70 % of the whole grid's time (the seven mechanisms together:
about 95 minutes on 2 cores; the default five: about 30).  Every ε and N is kept, and
200 repetitions per cell, so each coverage is known to about ±1.5 %.

Outputs: markdown tables (stdout, and ``--markdown FILE``) and ``accuracy_mean_error.png``,
``accuracy_coverage.png``, ``accuracy_histogram_l1.png``, ``accuracy_circular.png`` in
``--out``.  ``--quick`` (3 repetitions of the whole grid, about a minute) checks that
everything works and prints what the full run would take on that machine.

Run: ``python -m benchmarks.bench_accuracy [--repetitions 200] [--jobs 2] [--quick]
[--mechanisms OGPM,PM-C,...] [--out docs/benchmarks]
[--markdown docs/benchmarks/bench_accuracy.md] [--errors FILE.json]``.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import msgspec  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.machine import describe_machine  # noqa: E402
from benchmarks.recordings import AEON_VERSION, DataSet, datasets  # noqa: E402
from collector.config import CollectorConfig  # noqa: E402
from collector.tools.replay import replay_lines  # noqa: E402
from edge_agent import protocol  # noqa: E402
from edge_agent.mechanisms import CircularOGPM, Mechanism, linear_mechanism  # noqa: E402

SEED = 20_251
EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0)
SIZES = (500, 5_000, 50_000, 200_000)
# Label -> the configuration name of a linear channel's mechanism (also the channel's name).
LINEAR = {"OGPM": "ogpm", "PM-C": "pm-c", "SW-C": "sw-c", "PM": "pm",
          "OGPM-U": "ogpm-unbiased", "II-PTT": "ii-ptt", "T-Laplace": "laplace",
          "B-Laplace": "bounded-laplace"}
# The default run leaves out PM and OGPM-U (``--mechanisms`` adds them): see the docstring.
DEFAULT_LINEAR = ("OGPM", "PM-C", "SW-C", "T-Laplace", "B-Laplace")
CIRCULAR = {"OGPM-circ": "ogpm-circular"}
GRID_BITS = 16  # the agent's default
BATCH = 500  # values per report message
AGENTS = 10  # message i of a channel comes from agent d<i mod AGENTS>, seq i // AGENTS
BLOCK = 10  # repetitions per task of the process pool
FLEET = "bench"
# The reports' times: fixed, so the replay lines are the same bytes in every run (the
# offline replay checks no clock); on a minute, so one channel's reports share a window.
T0 = 1_750_000_020.0
CONFIG = CollectorConfig(fleet=FLEET)
DEFAULT_REPETITIONS, QUICK_REPETITIONS = 200, 3

COLOURS = {"OGPM": "C0", "PM-C": "C1", "SW-C": "C2", "PM": "C4", "OGPM-U": "C3",
           "II-PTT": "C6", "T-Laplace": "C5", "B-Laplace": "C7", "OGPM-circ": "C9"}


# -- the collector -----------------------------------------------------------------------

def estimate(lines: list[bytes]) -> dict:
    """The collector's channels document (GET /api/channels) after replaying ``lines``
    offline (``collector.tools.replay.replay_lines``): the one place the benchmark meets the
    collector.  Every line must be accepted."""
    result = replay_lines(lines, config=CONFIG)
    if result.accepted != len(lines):
        raise RuntimeError(f"the replay did not accept every report: {result.summary()}")
    return result.channels


# -- reports -------------------------------------------------------------------------------

def report_lines(channel: str, kind: str, mechanism: Mechanism, codes: np.ndarray,
                 t0: float = T0) -> list[bytes]:
    """Replay lines of one channel's codes, in messages of ``BATCH`` as agents send them."""
    description = protocol.describe(mechanism)
    lines = []
    for i, start in enumerate(range(0, codes.size, BATCH)):
        agent, seq = f"d{i % AGENTS}", i // AGENTS
        topic = protocol.data_topic(FLEET, agent, channel)
        payload = protocol.report(agent=agent, channel=channel, kind=kind, seq=seq,
                                  t=t0 + seq, dt=1.0, mechanism=description,
                                  codes=codes[start:start + BATCH].tolist())
        lines.append(b'{"topic":' + msgspec.json.encode(topic) + b',"payload":' + payload
                     + b"}")
    return lines


def mechanisms_for(data: DataSet, epsilon: float,
                   labels=tuple(LINEAR)) -> dict[str, tuple[str, str, Mechanism]]:
    """Label -> (channel, kind, mechanism) for one data set at ``epsilon`` (linear data:
    the mechanisms ``labels``)."""
    if data.kind == "circular":
        return {label: (channel, "circular",
                        CircularOGPM(epsilon=epsilon, period=data.width, origin=data.low,
                                     grid_bits=GRID_BITS))
                for label, channel in CIRCULAR.items()}
    return {label: (LINEAR[label], "linear",
                    linear_mechanism(LINEAR[label], epsilon=epsilon, low=data.low,
                                     high=data.high, grid_bits=GRID_BITS))
            for label in labels}


# -- one block of repetitions ------------------------------------------------------------------

def _number(value) -> float:
    return math.nan if value is None else float(value)


def _l1(histogram: dict, values: np.ndarray, key: str) -> float:
    shares = histogram.get(key)
    if shares is None:
        return math.nan
    edges = np.asarray(histogram["edges"])
    truth = np.histogram(values, bins=edges)[0] / values.size
    return float(np.abs(np.asarray(shares) - truth).sum())


def _wrap(angle: float, period: float) -> float:
    """``angle`` as the signed distance from 0 on the circle, in [-period/2, period/2)."""
    return (angle + period / 2) % period - period / 2


def circular_intervals(entry: dict) -> dict[str, tuple[str, list] | None]:
    """The 95 % intervals of a circular channel's mean direction and resultant length, as
    (key, [low, high]), where its document has them, else None; ``"unrecognised"``: the
    other keys naming a ``ci95`` (to be told about, not guessed at)."""
    def nested(name: str):
        holder = entry.get(name)
        return holder.get("ci95") if isinstance(holder, dict) else None

    options = {
        "direction": [("direction.ci95", nested("direction")),
                      ("circular_mean.ci95", nested("circular_mean")),
                      ("circular_mean_ci95", entry.get("circular_mean_ci95")),
                      ("direction_ci95", entry.get("direction_ci95")),
                      ("ci95", entry.get("ci95"))],
        "resultant_length": [("resultant_length.ci95", nested("resultant_length")),
                             ("resultant_length_ci95", entry.get("resultant_length_ci95"))],
    }
    found = {what: next(((key, value) for key, value in places if value is not None), None)
             for what, places in options.items()}
    known = {key for places in options.values() for key, _ in places}
    named = [key for key in entry if "ci95" in key] + [
        f"{key}.{inner}" for key, value in entry.items() if isinstance(value, dict)
        for inner in value if "ci95" in inner]
    found["unrecognised"] = [key for key in named if key not in known] or None
    return found


def _on_arc(value: float, interval, period: float) -> bool:
    """Whether ``value`` lies on the arc from interval[0] counter-clockwise to interval[1]."""
    low, high = (_number(v) for v in interval)
    if math.isnan(low) or math.isnan(high):
        return False
    if high - low >= period:
        return True
    return (value - low) % period <= (high - low) % period


def score_linear(entry: dict, x: np.ndarray) -> dict:
    truth = float(x.mean())
    mean = entry["mean"]
    interval = mean["ci95"]
    covered = None  # no interval given
    if interval is not None and None not in interval:
        covered = bool(interval[0] <= truth <= interval[1])
    return {"est": _number(mean["estimate"]) - truth, "raw": _number(mean["raw"]) - truth,
            "covered": covered, "method": mean["method"],
            "l1_raw": _l1(entry["histogram"], x, "raw"),
            "l1_est": _l1(entry["histogram"], x, "estimate")}


def score_circular(entry: dict, x: np.ndarray, data: DataSet) -> dict:
    resultant = np.exp(2j * math.pi * (x - data.low) / data.width).mean()
    unit = data.width / (2 * math.pi)
    direction, length = float(np.angle(resultant)) * unit + data.low, float(abs(resultant))
    mean = entry["circular_mean"]
    if isinstance(mean, dict):
        mean = mean.get("estimate")
    lengths = entry["resultant_length"]
    intervals = circular_intervals(entry)
    out = {"direction": _wrap(_number(mean) - direction, data.width),
           "length": _number(lengths["estimate"]) - length,
           "length_raw": _number(lengths["raw"]) - length,
           "l1_raw": _l1(entry["histogram"], x, "raw"),
           "l1_est": _l1(entry["histogram"], x, "estimate"),
           "ci_keys": tuple(hit[0] for what, hit in intervals.items()
                            if hit and what != "unrecognised")
           + tuple(f"{key} (not used)" for key in intervals["unrecognised"] or ())}
    # Where the document has a place for an interval but gave none (the data cannot
    # tell), the repetition counts as "without an interval" (None).
    if intervals["direction"]:
        out["covered"] = _on_arc(direction, intervals["direction"][1], data.width)
    elif isinstance(entry.get("direction"), dict) and "ci95" in entry["direction"]:
        out["covered"] = None
    if intervals["resultant_length"]:
        low, high = (_number(v) for v in intervals["resultant_length"][1])
        out["length_covered"] = bool(low <= length <= high)
    elif "ci95" in lengths:
        out["length_covered"] = None
    return out


def _seed(*parts) -> list[int]:
    """A generator's seed from a cell, a repetition and a mechanism: the same draws and
    noise whatever else the run includes."""
    return [SEED, *(round(1000 * p) if isinstance(p, float) else p for p in parts)]


def run_block(task: tuple) -> tuple[tuple, list[dict], list[float]]:
    """Repetitions ``start``..``stop`` of one (data set, ε, N): every mechanism on the
    same drawn values, in one replay.  Returns the cell, per repetition and mechanism
    the scores, and the CPU seconds each repetition took (its cost whatever else
    runs on the machine)."""
    d, epsilon, n, start, stop, labels = task
    data = list(datasets().values())[d]
    mechanisms = mechanisms_for(data, epsilon, labels)
    order = [*LINEAR, *CIRCULAR]
    records, seconds = [], []
    for rep in range(start, stop):
        started = time.process_time()
        x = np.random.default_rng(_seed(d, epsilon, n, rep)).choice(data.values, size=n,
                                                                     replace=True)
        per_channel = [
            report_lines(channel, kind, mechanism, mechanism.perturb_codes(
                x, np.random.default_rng(_seed(d, epsilon, n, rep, order.index(label)))))
            for label, (channel, kind, mechanism) in mechanisms.items()]
        lines = [line for message in zip(*per_channel) for line in message]
        document = estimate(lines)
        for label, (channel, _, _) in mechanisms.items():
            entry = document["channels"][channel]
            if entry["count"] != n:
                raise RuntimeError(f"{channel}: the collector counted {entry['count']} "
                                   f"values of {n}")
            records.append({"label": label, "rep": rep, **(score_circular(entry, x, data)
                                               if data.kind == "circular"
                                               else score_linear(entry, x))})
        seconds.append(time.process_time() - started)
    return (d, epsilon, n), records, seconds


# -- summaries ---------------------------------------------------------------------------------

def _mae(values) -> float:
    return float(np.mean(np.abs(values)))


def _rmse(values) -> float:
    return float(np.sqrt(np.mean(np.square(values))))


def _share(flags: list[bool | None]) -> tuple[float, float, int] | None:
    """(share of True, its binomial standard error, how many were None) over the
    repetitions that had an interval; None if none had."""
    known = [flag for flag in flags if flag is not None]
    if not known:
        return None
    p = float(np.mean(known))
    return p, math.sqrt(p * (1 - p) / len(known)), len(flags) - len(known)


def summarise(results) -> dict:
    """(data set, label, ε, N) -> the cell's statistics over its repetitions."""
    by_cell: dict = collections.defaultdict(list)
    names = list(datasets())
    for (d, epsilon, n), records, _ in results:
        for record in records:
            by_cell[(names[d], record["label"], epsilon, n)].append(record)
    cells = {}
    for key, records in sorted(by_cell.items(), key=lambda kv: (
            names.index(kv[0][0]), kv[0][2], kv[0][3], list(COLOURS).index(kv[0][1]))):
        column = {name: [r[name] for r in records if name in r] for name in records[0]}
        cell = {"runs": len(records), "l1_raw": float(np.nanmean(column["l1_raw"])),
                "l1_est": float(np.nanmean(column["l1_est"]))}
        if "method" in column:  # linear
            cell.update(mae=_mae(column["est"]), rmse=_rmse(column["est"]),
                        mae_raw=_mae(column["raw"]), rmse_raw=_rmse(column["raw"]),
                        methods=collections.Counter(column["method"]),
                        coverage=_share(column["covered"]))
        else:
            cell.update(direction_mae=_mae(column["direction"]),
                        direction_rmse=_rmse(column["direction"]),
                        length_mae=_mae(column["length"]), length_rmse=_rmse(column["length"]),
                        length_raw_mae=_mae(column["length_raw"]),
                        ci_keys=sorted({k for keys in column["ci_keys"] for k in keys}))
            if "covered" in column:
                cell["coverage"] = _share(column["covered"])
            if "length_covered" in column:
                cell["length_coverage"] = _share(column["length_covered"])
        cell["ratio"] = cell["mae"] / cell["mae_raw"] if "mae" in cell else None
        cells[key] = cell
    return cells


def repetition_errors(results) -> dict:
    """Each linear cell's errors of ``mean.estimate`` and interval hits, by repetition
    (``compare_accuracy --paired``: two runs see the same draws and noise, repetition by
    repetition, so their RMSEs are compared on the same data)."""
    names = list(datasets())
    out: dict = {}
    for (d, epsilon, n), records, _ in results:
        for record in records:
            if "est" in record:
                cell = out.setdefault(f"{names[d]}|{record['label']}|{epsilon:g}|{n}", {})
                cell[record["rep"]] = [record["est"], record["covered"]]
    return {key: [cell[rep] for rep in sorted(cell)] for key, cell in out.items()}


def _coverage_text(coverage) -> str:
    if coverage is None:
        return "n/a"
    p, se, missing = coverage
    return f"{p:.1%} ± {se:.1%}" + (f" ({missing} without)" if missing else "")


def linear_table(cells, data: DataSet) -> str:
    lines = ["| ε | N | mechanism | MAE est | RMSE est | MAE raw | RMSE raw | est/raw (MAE) "
             "| mean.method | ci95 coverage ± SE | L1 raw hist | L1 reconstruction |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for epsilon in EPSILONS:
        for n in SIZES:
            group = [(label, cells[(data.name, label, epsilon, n)]) for label in LINEAR
                     if (data.name, label, epsilon, n) in cells]
            if not group:
                continue
            best = min(cell["rmse"] for _, cell in group)
            for label, c in group:
                rmse = f"**{c['rmse']:.4g}**" if c["rmse"] == best else f"{c['rmse']:.4g}"
                methods = ", ".join(f"{m} {k}" for m, k in sorted(c["methods"].items()))
                lines.append(
                    f"| {epsilon:g} | {n:,} | {label} | {c['mae']:.4g} | {rmse} | "
                    f"{c['mae_raw']:.4g} | {c['rmse_raw']:.4g} | {c['ratio']:.3f} | {methods} | "
                    f"{_coverage_text(c['coverage'])} | {c['l1_raw']:.3f} | {c['l1_est']:.3f} |")
    return "\n".join(lines)


def circular_table(cells, data: DataSet) -> str:
    degrees = 360.0 / data.width
    lines = ["| ε | N | direction MAE (°) | direction RMSE (°) | R̄ est MAE | R̄ est RMSE "
             "| R̄ raw MAE | direction ci95 coverage | R̄ ci95 coverage | L1 raw hist "
             "| L1 reconstruction |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for (name, _, epsilon, n), c in cells.items():
        if name != data.name:
            continue
        lines.append(
            f"| {epsilon:g} | {n:,} | {c['direction_mae'] * degrees:.2f} | "
            f"{c['direction_rmse'] * degrees:.2f} | {c['length_mae']:.4f} | "
            f"{c['length_rmse']:.4f} | {c['length_raw_mae']:.4f} | "
            f"{_coverage_text(c.get('coverage'))} | {_coverage_text(c.get('length_coverage'))} "
            f"| {c['l1_raw']:.3f} | {c['l1_est']:.3f} |")
    return "\n".join(lines)


def facts_line(data: DataSet) -> str:
    f = data.facts()
    if data.kind == "circular":
        return (f"{data.what}; {f['n']:,} readings, mean direction "
                f"{math.degrees(f['mean_direction']):.1f}°, mean resultant length "
                f"{f['resultant_length']:.3f}.")
    return (f"{data.what}; domain [{data.low:.4g}, {data.high:.4g}] {data.unit}, "
            f"{f['n']:,} readings ({f['clipped']} clipped), mean {f['mean']:.3g}, "
            f"5/50/95 % {f['p05']:.3g} / {f['p50']:.3g} / {f['p95']:.3g}; "
            f"{f['lowest_5pct']:.0%} in the lowest 5 % of the domain, "
            f"{f['central_10pct']:.0%} in the central 10 %.")


def tables(cells, header: str) -> str:
    parts = [header]
    for data in datasets().values():
        parts.append(f"\n### {data.name}\n\n{facts_line(data)}\n")
        if data.kind == "circular":
            parts.append(circular_table(cells, data))
            keys = sorted({k for (name, *_), c in cells.items() if name == data.name
                           for k in c["ci_keys"]})
            parts.append("\nInterval fields found in the circular summary: "
                         + (", ".join(keys) if keys else
                            "none (no `ci95` for the direction or the resultant length: "
                            "coverage not measured)") + ".")
        else:
            parts.append(linear_table(cells, data))
    return "\n".join(parts) + "\n"


# -- plots -------------------------------------------------------------------------------------

def _present(cells) -> tuple[list[float], list[str]]:
    """The ε values and the mechanisms the run has."""
    epsilons = sorted({key[2] for key in cells})
    labels = [label for label in (*LINEAR, *CIRCULAR) if any(key[1] == label for key in cells)]
    return epsilons, labels


def _grid(cells, rows: int, title: str):
    epsilons, _ = _present(cells)
    fig, axes = plt.subplots(rows, len(epsilons), figsize=(3.6 * len(epsilons), 3.0 * rows),
                             sharex=True, squeeze=False)
    fig.suptitle(title)
    for ax in axes.flat:
        ax.set_xscale("log")
        ax.grid(alpha=0.3, which="both")
    for ax, epsilon in zip(axes[0], epsilons):
        ax.set_title(f"ε = {epsilon:g}")
    for ax in axes[-1]:
        ax.set_xlabel("N")
    return fig, axes


def _finish(fig, axes, path: Path) -> None:
    handles = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(list(handles.values()), list(handles), loc="lower center",
               ncol=min(8, max(1, len(handles))), fontsize=9)
    fig.tight_layout(rect=(0, 0.05, 1, 0.97))
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _series(cells, name, label, epsilon, key):
    points = sorted((key_[3], cell) for key_, cell in cells.items()
                    if key_[:3] == (name, label, epsilon))
    return [n for n, _ in points], [key(c) for _, c in points]


def plot_mean(cells, path: Path, repetitions: int) -> None:
    epsilons, labels = _present(cells)
    linear = [d for d in datasets().values() if d.kind == "linear"]
    fig, axes = _grid(cells, 2 * len(linear), "Mean: RMSE of the collector's estimate (share "
                      "of the domain width), and its error over the raw average's (MAE ratio), "
                      f"{repetitions} repetitions")
    for row, data in enumerate(linear):
        for col, epsilon in enumerate(epsilons):
            top, bottom = axes[2 * row, col], axes[2 * row + 1, col]
            for label in labels:
                n, rmse = _series(cells, data.name, label, epsilon,
                                  lambda c: c["rmse"] / data.width)
                if not n:
                    continue
                top.plot(n, rmse, "-o", color=COLOURS[label], markersize=3, label=label)
                n, ratio = _series(cells, data.name, label, epsilon, lambda c: c["ratio"])
                bottom.plot(n, ratio, "-o", color=COLOURS[label], markersize=3, label=label)
            top.set_yscale("log")
            bottom.set_yscale("log")
            bottom.axhline(1.0, color="k", linewidth=0.8)
        axes[2 * row, 0].set_ylabel(f"{data.name}\nRMSE / width")
        axes[2 * row + 1, 0].set_ylabel(f"{data.name}\nMAE est / MAE raw")
    _finish(fig, axes, path)


def plot_coverage(cells, path: Path, repetitions: int) -> None:
    epsilons, labels = _present(cells)
    names = [d.name for d in datasets().values()]
    fig, axes = _grid(cells, len(names), "Share of the collector's 95 % intervals covering "
                      f"the truth (± 1 binomial SE, {repetitions} repetitions)")
    for row, name in enumerate(names):
        for col, epsilon in enumerate(epsilons):
            ax = axes[row, col]
            for label in labels:
                n, cover = _series(cells, name, label, epsilon, lambda c: c.get("coverage"))
                shown = [(k, c) for k, c in zip(n, cover) if c is not None]
                if shown:
                    ax.errorbar([k for k, _ in shown], [c[0] for _, c in shown],
                                yerr=[c[1] for _, c in shown], fmt="-o", markersize=3,
                                color=COLOURS[label], label=label, capsize=2)
            if not ax.lines:
                ax.text(0.5, 0.5, "no interval in\nthe document", ha="center", va="center",
                        transform=ax.transAxes)
            ax.axhline(0.95, color="k", linewidth=0.8, linestyle="--")
            ax.set_ylim(-0.02, 1.02)
        axes[row, 0].set_ylabel(f"{name}\ncoverage")
    _finish(fig, axes, path)


def plot_histogram(cells, path: Path, repetitions: int) -> None:
    epsilons, labels = _present(cells)
    names = [d.name for d in datasets().values()]
    fig, axes = _grid(cells, len(names), "Histogram: L1 distance to the drawn values' "
                      "histogram, reconstruction (solid) and raw reports (dotted), "
                      f"{repetitions} repetitions")
    for row, name in enumerate(names):
        for col, epsilon in enumerate(epsilons):
            ax = axes[row, col]
            for label in labels:
                n, est = _series(cells, name, label, epsilon, lambda c: c["l1_est"])
                if not n:
                    continue
                _, raw = _series(cells, name, label, epsilon, lambda c: c["l1_raw"])
                ax.plot(n, est, "-o", color=COLOURS[label], markersize=3, label=label)
                ax.plot(n, raw, ":", color=COLOURS[label])
            ax.set_yscale("log")
        axes[row, 0].set_ylabel(f"{name}\nL1")
    _finish(fig, axes, path)


def plot_circular(cells, path: Path, repetitions: int) -> None:
    epsilons, _ = _present(cells)
    circular = [d for d in datasets().values() if d.kind == "circular"]
    fig, axes = plt.subplots(len(circular), 3, figsize=(14, 4 * len(circular)), squeeze=False)
    for row, data in enumerate(circular):
        for i, epsilon in enumerate(epsilons):
            colour = plt.cm.viridis(i / max(1, len(epsilons) - 1))
            for label in CIRCULAR:
                n, direction = _series(cells, data.name, label, epsilon,
                                       lambda c: c["direction_mae"] * 360 / data.width)
                axes[row, 0].plot(n, direction, "-o", color=colour, markersize=3,
                                  label=f"ε = {epsilon:g}")
                _, length = _series(cells, data.name, label, epsilon, lambda c: c["length_mae"])
                _, raw = _series(cells, data.name, label, epsilon, lambda c: c["length_raw_mae"])
                axes[row, 1].plot(n, length, "-o", color=colour, markersize=3)
                axes[row, 1].plot(n, raw, ":", color=colour)
                for key, style in (("coverage", "-o"), ("length_coverage", "--s")):
                    _, cover = _series(cells, data.name, label, epsilon, lambda c: c.get(key))
                    shown = [(k, c) for k, c in zip(n, cover) if c is not None]
                    if shown:
                        axes[row, 2].plot([k for k, _ in shown], [c[0] for _, c in shown],
                                          style, color=colour, markersize=3)
        axes[row, 0].set_ylabel(f"{data.name}\nmean direction MAE (°)")
        axes[row, 1].set_ylabel("resultant length MAE\n(corrected solid, raw dotted)")
        axes[row, 2].set_ylabel("ci95 coverage (direction solid,\nresultant length dashed)")
        if not axes[row, 2].lines:
            axes[row, 2].text(0.5, 0.5, "no ci95 fields in the\ncircular summary",
                              ha="center", va="center", transform=axes[row, 2].transAxes)
        else:
            axes[row, 2].axhline(0.95, color="k", linewidth=0.8, linestyle="--")
        for ax in axes[row]:
            ax.set_xscale("log")
            ax.set_xlabel("N")
            ax.grid(alpha=0.3, which="both")
        axes[row, 0].set_yscale("log")
        axes[row, 1].set_yscale("log")
        axes[row, 0].legend(fontsize=8)
    fig.suptitle(f"Circular OGPM through the collector, {repetitions} repetitions")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# -- main --------------------------------------------------------------------------------------

def tasks(repetitions: int, epsilons, sizes, labels: tuple[str, ...]) -> list[tuple]:
    """Blocks of repetitions of every cell, the largest N first (the pool's tail stays
    short)."""
    out = []
    for n in sorted(sizes, reverse=True):
        for d in range(len(datasets())):
            for epsilon in epsilons:
                for start in range(0, repetitions, BLOCK):
                    out.append((d, epsilon, n, start, min(start + BLOCK, repetitions), labels))
    return out


def projected_seconds(results, repetitions: int, jobs: int) -> float:
    """Wall time of this grid at ``repetitions`` on ``jobs`` otherwise idle cores, from this
    run's CPU time per repetition: a block's first repetition also builds the process's
    caches (counted once per block, as in the full run, which has more repetitions per
    block), the others are steady."""
    work = 0.0
    for _, _, seconds in results:
        steady = float(np.mean(seconds[1:])) if len(seconds) > 1 else seconds[0]
        work += max(0.0, seconds[0] - steady)
    by_cell = collections.defaultdict(list)
    for cell, _, seconds in results:
        by_cell[cell].extend(seconds[1:] or seconds)
    work += sum(float(np.mean(times)) * repetitions for times in by_cell.values())
    return work / jobs


def _choice(text: str, known, convert=str) -> tuple:
    values = tuple(convert(v.strip()) for v in text.split(",") if v.strip())
    unknown = [v for v in values if v not in known]
    if unknown or not values:
        raise argparse.ArgumentTypeError(f"expected some of {', '.join(map(str, known))}; "
                                         f"got {text!r}")
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=None,
                        help=f"per cell (default {DEFAULT_REPETITIONS}; {QUICK_REPETITIONS} "
                             "with --quick)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: few repetitions, the whole grid, and what the "
                             "full run would take")
    parser.add_argument("--mechanisms", default=",".join(DEFAULT_LINEAR),
                        type=lambda t: _choice(t, LINEAR),
                        help=f"linear mechanisms, of {', '.join(LINEAR)} (default: "
                             f"{', '.join(DEFAULT_LINEAR)})")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)),
                        type=lambda t: _choice(t, SIZES, int), help="values of N")
    parser.add_argument("--epsilons", default=",".join(map(str, EPSILONS)),
                        type=lambda t: _choice(t, EPSILONS, float), help="values of ε")
    parser.add_argument("--out", default="docs/benchmarks", help="directory of the plots")
    parser.add_argument("--markdown", help="also write the tables to this file")
    parser.add_argument("--errors", help="also write every repetition's error of each linear "
                        "cell to this JSON file (for compare_accuracy --paired)")
    args = parser.parse_args()
    repetitions = args.repetitions or (QUICK_REPETITIONS if args.quick
                                       else DEFAULT_REPETITIONS)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        datasets()  # download, check and parse once, before the pool starts
    except (RuntimeError, ValueError) as exc:
        parser.exit(2, f"bench_accuracy: {exc}\n")
    work = tasks(repetitions, args.epsilons, args.sizes, args.mechanisms)
    started = time.perf_counter()
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            results = list(pool.map(run_block, work))
    else:
        results = [run_block(task) for task in work]
    elapsed = time.perf_counter() - started
    cells = summarise(results)

    seconds_by_size = collections.Counter()
    for (_, _, n), _, seconds in results:
        seconds_by_size[n] += sum(seconds)
    header = "\n".join([
        f"Machine: {describe_machine()}",
        "",
        f"BasicMotions from aeon=={AEON_VERSION} (sha256-checked); every estimate from "
        "the channels document of `collector.tools.replay.replay_lines`.",
        f"Linear mechanisms {', '.join(args.mechanisms)}; ε in "
        f"{', '.join(f'{e:g}' for e in args.epsilons)}; N in "
        f"{', '.join(f'{n:,}' for n in args.sizes)}; {repetitions} repetitions per cell; "
        f"reports of {BATCH} values from {AGENTS} agents; {args.jobs} processes, "
        f"{elapsed:.0f} s ({sum(seconds_by_size.values()):.0f} CPU s: "
        + ", ".join(f"N = {n:,} {seconds_by_size[n]:.0f} s" for n in sorted(args.sizes))
        + ").",
        "",
        "Errors are in the data set's unit; MAE/RMSE est: `mean.estimate` against the mean "
        "of the N drawn values, raw: `mean.raw`; best RMSE of each (ε, N) in bold; "
        "coverage: share of `mean.ci95` holding the truth ± its binomial standard error; "
        "L1: distance of `histogram.raw` / `histogram.estimate` from the drawn values' "
        "histogram on `histogram.edges`.",
    ])
    if repetitions != DEFAULT_REPETITIONS:
        full = projected_seconds(results, DEFAULT_REPETITIONS, args.jobs)
        header += (f"\n\nThis grid at {DEFAULT_REPETITIONS} repetitions on {args.jobs} "
                   f"otherwise idle cores would take about {full / 60:.0f} minutes "
                   "(projected from this run's CPU time per repetition).")
    text = tables(cells, header)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text("## Accuracy on real recordings "
                                       "(`python -m benchmarks.bench_accuracy`)\n\n" + text)
    if args.errors:
        Path(args.errors).write_text(json.dumps(repetition_errors(results)))
    plots = {"accuracy_mean_error.png": plot_mean, "accuracy_coverage.png": plot_coverage,
             "accuracy_histogram_l1.png": plot_histogram,
             "accuracy_circular.png": plot_circular}
    for name, plot in plots.items():
        plot(cells, out / name, repetitions)
    print("wrote " + ", ".join(str(out / name) for name in plots)
          + (f" and {args.markdown}" if args.markdown else ""))


if __name__ == "__main__":
    main()
