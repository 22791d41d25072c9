"""``mechanism = "auto"`` scored on the accuracy benchmark's own cells.

For every linear data set of ``benchmarks/bench_accuracy.py`` (real recordings:
rotation rate near the low end, a bimodal acceleration magnitude, a pitch rate at the
centre) and every ε and N of its table, the mechanism ``auto`` chooses
(``edge_agent.mechanisms.registry.mechanism_for_data``: the data set's least and largest
value as the discovered range, its domain fixed, a fleet of N reports), and how the
collector's mean estimate with that mechanism did against the best of OGPM, PM-C and
SW-C: the ratio of their mean absolute errors, read from the table bench_accuracy wrote
(``--table``, default docs/benchmarks/bench_accuracy.md).  Goal (issue 30): within 1.5x of the best
at ε 1 and 4 on data near an end.

Run: ``python -m benchmarks.auto_choice [--table docs/benchmarks/bench_accuracy.md]
[--markdown FILE]``.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from benchmarks.bench_accuracy import GRID_BITS, LINEAR
from benchmarks.recordings import datasets
from edge_agent.mechanisms.registry import (
    AUTO,
    AUTO_CANDIDATES,
    linear_mechanism,
    mechanism_for_data,
)

LABELS = {LINEAR[label]: label for label in ("OGPM", "PM-C", "SW-C")}  # config name -> label
assert set(LABELS) == set(AUTO_CANDIDATES)


def table_cells(text: str) -> dict[str, dict[tuple[float, int], dict[str, float]]]:
    """Per data set, per (ε, N): the estimate's MAE of each mechanism in the table."""
    cells: dict = {}
    for section in re.split(r"^### ", text, flags=re.M)[1:]:
        name = section.splitlines()[0].strip()
        for line in section.splitlines():
            parts = [p.strip().strip("*") for p in line.split("|")]
            if len(parts) > 5 and parts[3] in LABELS.values():
                try:
                    key = (float(parts[1]), int(parts[2].replace(",", "")))
                    cells.setdefault(name, {}).setdefault(key, {})[parts[3]] = float(parts[4])
                except ValueError:
                    continue
    return cells


def choice_label(data, epsilon: float, reports: int) -> str:
    values = data.values
    chosen = mechanism_for_data(AUTO, epsilon=epsilon, data=(float(values.min()),
                                                             float(values.max())),
                                bounds=(data.low, data.high), grid_bits=GRID_BITS,
                                reports=reports)
    for name in AUTO_CANDIDATES:
        if chosen == linear_mechanism(name, epsilon=epsilon, low=data.low, high=data.high,
                                      grid_bits=GRID_BITS):
            return LABELS[name]
    raise AssertionError(f"auto chose {chosen!r}, not a candidate")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", default="docs/benchmarks/bench_accuracy.md")
    parser.add_argument("--markdown", help="also write the tables to this file")
    args = parser.parse_args()
    cells = table_cells(Path(args.table).read_text())
    lines = [f"`mechanism = \"auto\"` on the cells of {args.table} (MAE of the collector's "
             "mean estimate; ratio to the best of OGPM, PM-C and SW-C in the same cell)", ""]
    for name, data in datasets().items():
        if data.kind != "linear" or name not in cells:
            continue
        lines += [f"### {name}", "", "| ε | N | auto chooses | auto / best | OGPM / best |",
                  "|---:|---:|---|---:|---:|"]
        for (epsilon, reports), maes in sorted(cells[name].items()):
            if set(maes) != set(LABELS.values()):
                continue
            label = choice_label(data, epsilon, reports)
            best = min(maes.values())
            lines.append(f"| {epsilon:g} | {reports:,} | {label} | {maes[label] / best:.2f}x "
                         f"| {maes['OGPM'] / best:.2f}x |")
        lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)


if __name__ == "__main__":
    main()
