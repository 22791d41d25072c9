"""Two runs of ``bench_accuracy`` side by side: did a change to the estimators keep the
accuracy?  Reads the markdown tables each run wrote (``--markdown``) and reports, over
the cells (data set, ε, N, mechanism) both have:

* the RMSE ratio new/old of ``mean.estimate``, worst cells first;
* the cells whose 95% interval covers less than ``--coverage``;
* the cells where the shown histogram is at least as close to the data as the raw one
  (it is the raw one where that is expected to be closer).

Run: ``python -m benchmarks.compare_accuracy OLD.md NEW.md [--worse 0.05]``; exits 1 when
a cell is worse by more than ``--worse`` or covers less than ``--coverage``.

``--paired OLD.json NEW.json`` (``bench_accuracy --errors``): both runs' errors repetition
by repetition, on the same draws and noise.  A cell's RMSE ratio then has a Monte Carlo
error of its own (the delta method on the paired squared errors: the repetitions' common
part cancels), and a cell counts as worse only where its ratio exceeds ``1 + --worse`` by
more than ``--z`` of those errors.  200 repetitions give each cell's RMSE alone about 5%;
paired, a ratio is known to about 1-2% where the two estimators mostly agree.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

import numpy as np


def cells(path: Path) -> dict[tuple, dict]:
    """{(data set, ε, N, mechanism): {"rmse", "coverage", "l1_raw", "l1_estimate"}}."""
    found, section = {}, None
    for line in path.read_text().splitlines():
        if line.startswith("### "):
            section = line[4:].strip()
            continue
        parts = [part.strip() for part in line.strip().strip("|").split("|")]
        if section is None or len(parts) != 12 or not re.fullmatch(r"[\d.]+", parts[0]):
            continue
        epsilon, n, mechanism = parts[0], parts[1].replace(",", ""), parts[2]
        coverage = float(parts[9].split("%")[0]) / 100
        found[(section, float(epsilon), int(n), mechanism)] = {
            "rmse": float(parts[4].strip("*")), "coverage": coverage,
            "l1_raw": float(parts[10]), "l1_estimate": float(parts[11])}
    return found


def paired_ratio(old: list[float], new: list[float]) -> tuple[float, float]:
    """(RMSE new / old, the standard error of its logarithm) from errors of the same
    repetitions: log R = (log mean b - log mean a) / 2 with a, b the squared errors, whose
    variance is Var(b / mean b - a / mean a) / n to first order."""
    a, b = np.square(old), np.square(new)
    if len(a) != len(b) or len(a) < 2:
        raise ValueError("paired errors need the same repetitions, at least two")
    ma, mb = float(a.mean()), float(b.mean())
    if ma == 0 or mb == 0:
        return (1.0 if ma == mb else math.inf), 0.0
    spread = float(np.std(b / mb - a / ma, ddof=1)) / math.sqrt(len(a))
    return math.sqrt(mb / ma), 0.5 * spread


def paired(args) -> int:
    old, new = (json.loads(path.read_text()) for path in (args.old, args.new))
    common = sorted(set(old) & set(new))
    if not common:
        raise SystemExit("no cell in common")
    rows = []
    for key in common:
        ratio, log_se = paired_ratio([e for e, _ in old[key]], [e for e, _ in new[key]])
        # How far beyond 1 + worse, in Monte Carlo errors (on the log scale).
        beyond = (math.log(ratio) - math.log1p(args.worse)) / log_se if log_se else (
            math.inf if ratio > 1 + args.worse else -math.inf)
        hits = [h for _, h in new[key] if h is not None]
        coverage = sum(hits) / len(hits) if hits else float("nan")
        rows.append((beyond, ratio, log_se, coverage, len(hits), key))
    rows.sort(reverse=True)
    ratios = sorted(r[1] for r in rows)
    print(f"{len(common)} cells in both, paired ({len(old[common[0]])} repetitions)")
    print(f"RMSE new/old: worst {ratios[-1]:.3f}, median {ratios[len(ratios) // 2]:.3f}, "
          f"best {ratios[0]:.3f}; more than {args.worse:.0%} worse: "
          f"{sum(r > 1 + args.worse for r in ratios)}, more than {args.worse:.0%} better: "
          f"{sum(r < 1 - args.worse for r in ratios)}")
    print(f"cells furthest above {1 + args.worse:.2f} (ratio, its Monte Carlo error, "
          f"coverage):")
    for beyond, ratio, log_se, coverage, _, key in rows[:args.show]:
        print(f"  {ratio:.3f} ± {ratio * log_se:.3f} ({beyond:+.1f} errors)  "
              f"covers {coverage:.1%}  {key}")
    worse = [row for row in rows if row[0] > args.z]
    print(f"cells worse than {1 + args.worse:.2f} by more than {args.z:g} Monte Carlo "
          f"errors: {len(worse)}")
    low = [row for row in rows if row[3] < args.coverage]
    print(f"cells covering less than {args.coverage:.0%}: {len(low)}")
    for _, _, _, coverage, count, key in sorted(low, key=lambda row: row[3]):
        error = math.sqrt(coverage * (1 - coverage) / count)
        print(f"  {coverage:.1%} ± {error:.1%}  {key}")
    return 1 if worse or low else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--worse", type=float, default=0.05,
                        help="the largest RMSE increase allowed in a cell (0.05: 5%%)")
    parser.add_argument("--coverage", type=float, default=0.94)
    parser.add_argument("--show", type=int, default=10, help="worst cells listed")
    parser.add_argument("--paired", action="store_true",
                        help="OLD and NEW are bench_accuracy --errors files: compare "
                             "repetition by repetition")
    parser.add_argument("--z", type=float, default=3.0,
                        help="paired: Monte Carlo errors beyond 1 + worse that count as "
                             "worse")
    args = parser.parse_args(argv)
    if args.paired:
        return paired(args)
    old, new = cells(args.old), cells(args.new)
    common = sorted(set(old) & set(new))
    if not common:
        raise SystemExit("no cell in common")
    ratios = sorted(((new[key]["rmse"] / old[key]["rmse"], key) for key in common),
                    reverse=True)
    print(f"{len(common)} cells in both ({len(old)} old, {len(new)} new)")
    print(f"RMSE new/old: worst {ratios[0][0]:.3f}, median {ratios[len(ratios) // 2][0]:.3f}, "
          f"best {ratios[-1][0]:.3f}")
    for ratio, key in ratios[:args.show]:
        print(f"  {ratio:.3f}  {key}")
    low = [(new[key]["coverage"], key) for key in common if new[key]["coverage"] < args.coverage]
    print(f"cells covering less than {args.coverage:.0%}: {len(low)}")
    for coverage, key in sorted(low):
        print(f"  {coverage:.1%}  {key}")
    wins = sum(new[key]["l1_estimate"] <= new[key]["l1_raw"] for key in common)
    old_wins = sum(old[key]["l1_estimate"] <= old[key]["l1_raw"] for key in common)
    print(f"shown histogram at least as close as the raw one: {wins} of {len(common)} "
          f"(old: {old_wins})")
    worse = [key for ratio, key in ratios if ratio > 1 + args.worse]
    print(f"cells worse by more than {args.worse:.0%}: {len(worse)}")
    return 1 if worse or low else 0


if __name__ == "__main__":
    raise SystemExit(main())
