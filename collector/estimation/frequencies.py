"""Category shares from a frequency oracle's support counts (the collector's estimator for
categorical channels; the oracles are ``edge_agent.mechanisms.categorical``).

* **Unbiased shares**: f_v = (C_v / n - q) / (p - q) (``FrequencyOracle.estimate``); they can
  be negative and need not sum to 1.
* **Standard errors** of the fleet's shares: the reporters are treated as a sample of
  the fleet, as the linear and circular estimates treat them (with the planner's
  population division each window holds a random share of the wearers).  A report
  supports v with probability π_v = f_v p + (1 - f_v) q, independently across sampled
  reporters, so Var f̂_v = π_v (1 - π_v) / (n (p - q)²): the oracle's closed-form
  variance for a fixed composition plus the sampling term f_v (1 - f_v) / n.  It is
  estimated from the support shares C_v / n, and never taken below the closed form at
  the estimated shares (clipped to [0, 1]; a category no report supported still has
  the mechanism's noise).  95% intervals f_v ± 1.96 se, clipped to [0, 1].
* **Memoized reports** (L-GRR: a permanent memo per value, an instantaneous response on
  top) are not independent: a wearer's reports of one value share one memo, so many
  reports of few wearers are worth about as much as one report each.  For a memoized
  channel's total the collector keeps the support counts per agent, and the variance
  is the cluster-robust (sandwich) one with each agent a cluster
  (``cluster_robust_variance``), used wherever it is larger than the one above.
* **Consistent shares** (Norm-Sub, Wang, Lopuhaä, Li et al., "Locally differentially private
  frequency estimation with consistency", NDSS 2020): subtract one constant from every
  estimate and set the negative ones to 0, the constant chosen so the shares sum to 1.
  They are what a bar chart shows; the unbiased ones are what an analysis averages.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from collector.estimation.estimators import Z95


def norm_sub(estimates: Any) -> np.ndarray:
    """Shares f'_v = max(f_v + c, 0) with the one c that makes them sum to 1."""
    f = np.asarray(estimates, dtype=np.float64)
    if f.ndim != 1 or not f.size:
        raise ValueError("estimates must be a non-empty 1-D array")
    if not np.all(np.isfinite(f)):
        raise ValueError("estimates must be finite")
    # With the k largest kept, c = (1 - sum of them) / k; the right k is the largest one
    # whose smallest kept estimate stays positive after adding c.
    ordered = np.sort(f)[::-1]
    kept_sums = np.cumsum(ordered)
    counts = np.arange(1, f.size + 1)
    shifts = (1.0 - kept_sums) / counts
    valid = ordered + shifts > 0
    k = int(np.flatnonzero(valid)[-1]) + 1 if valid.any() else 1
    return np.maximum(f + shifts[k - 1], 0.0)


def cluster_robust_variance(oracle, agent_support: Any, agent_reports: Any) -> np.ndarray | None:
    """The variance of each unbiased share with every agent's reports taken as one cluster
    (Liang and Zeger, "Longitudinal data analysis using generalized linear models",
    Biometrika 1986; the G/(G − 1) factor as in Cameron and Miller, "A practitioner's guide
    to cluster-robust inference", J. Human Resources 2015).  ``agent_support``: agents by
    categories, how many of each agent's reports support each category; ``agent_reports``:
    each agent's number of reports.  None with fewer than two agents (no spread between
    agents to measure).

    The unbiased share f_v = (C_v / n - q) / (p - q) is the mean of one term per report,
    (supports v - q) / (p - q), with the oracle's own p and q.  An agent g's terms add up
    to T_g = (C_gv - n_g q) / (p - q), so T_g - n_g f_v = (C_gv - n_g C_v / n) / (p - q):
    q cancels, and Var f_v = G / (G - 1) · Σ_g (T_g - n_g f_v)² / n².  Agents are
    independent of one another whatever their reports share, so it holds the memos' noise,
    the instantaneous noise and which wearers there are, however many reports each sent."""
    support = np.asarray(agent_support, dtype=np.float64)
    reports = np.asarray(agent_reports, dtype=np.float64)
    clusters = reports.size
    if clusters < 2:
        return None
    n = reports.sum()
    p, q = (float(x) for x in oracle.support_probabilities)
    deviations = support - np.outer(reports, support.sum(axis=0) / n)  # (p - q)(T_g - n_g f)
    return (clusters / (clusters - 1) * np.einsum("gv,gv->v", deviations, deviations)
            / (n * (p - q)) ** 2)


def frequency_summary(oracle, counts: Any, n: int,
                      cluster_variance: Any = None) -> dict[str, Any]:
    """Everything a view shows of one categorical window: ``n`` reports, the unbiased
    shares, their standard errors and 95% intervals, and the consistent shares.

    ``cluster_variance``: the shares' cluster-robust variance (``cluster_robust_variance``:
    a memoized channel's total), or None.  The standard errors are then the larger of it
    and the independent reports' (which holds the mechanism's own noise), and
    ``cluster_stderr`` is its square root."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
        raise ValueError(f"n: must be a non-negative integer, got {n!r}")
    k = oracle.categories
    if n == 0:
        empty = [None] * k
        return {"n": 0, "estimate": empty, "stderr": empty, "ci95": empty, "shares": empty,
                "cluster_stderr": None}
    estimate = oracle.estimate(counts, n)
    p, q = (float(x) for x in oracle.support_probabilities)
    supported = np.asarray(counts, dtype=np.float64) / n
    sampled = supported * (1.0 - supported) / (n * (p - q) ** 2)
    variance = np.maximum(oracle.variance(np.clip(estimate, 0.0, 1.0), n), sampled)
    cluster_stderr = None
    if cluster_variance is not None:
        variance = np.maximum(variance, cluster_variance)
        cluster_stderr = np.sqrt(cluster_variance).tolist()
    stderr = np.sqrt(variance)
    low = np.clip(estimate - Z95 * stderr, 0.0, 1.0)
    high = np.clip(estimate + Z95 * stderr, 0.0, 1.0)
    return {"n": int(n), "estimate": estimate.tolist(), "stderr": stderr.tolist(),
            "ci95": np.stack([low, high], axis=1).tolist(),
            "shares": norm_sub(estimate).tolist(), "cluster_stderr": cluster_stderr}
