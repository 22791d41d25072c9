"""Two runs of ``bench_accuracy`` side by side: did a change to the estimators keep the
accuracy?  Reads the markdown tables each run wrote (``--markdown``) and reports, over
the cells (data set, ε, N, mechanism) both have:

* the RMSE ratio new/old of ``mean.estimate``, worst cells first;
* the cells whose 95% interval covers less than ``--coverage``;
* the cells where the shown histogram is at least as close to the data as the raw one
  (it is the raw one where that is expected to be closer).

Run: ``python -m benchmarks.compare_accuracy OLD.md NEW.md [--worse 0.05]``; exits 1 when
a cell is worse by more than ``--worse`` or covers less than ``--coverage``.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--worse", type=float, default=0.05,
                        help="the largest RMSE increase allowed in a cell (0.05: 5%%)")
    parser.add_argument("--coverage", type=float, default=0.94)
    parser.add_argument("--show", type=int, default=10, help="worst cells listed")
    args = parser.parse_args()
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
