"""Reconstructing the distribution of true values from perturbed reports.

EMS (expectation-maximisation with smoothing, Li et al., "Estimating
Numerical Distributions under Local Differential Privacy", SIGMOD 2020):
given counts c_j of reports in output bins j and the mechanism's transition
matrix M[j, i] = P(report in output bin j | true value in input bin i),
iterate

    E-step   P(i | j) = M[j, i] p_i / sum_k M[j, k] p_k
    M-step   p_i = sum_j c_j P(i | j) / N
    S-step   p <- p smoothed with the binomial kernel (1, 2, 1) / 4

until the log-likelihood stops improving.  Smoothing is what keeps plain EM
from fitting the noise into spikes; on a circle the kernel wraps.
"""

from __future__ import annotations

import numpy as np


def transition_matrix(mechanism, in_edges: np.ndarray, out_edges: np.ndarray, *,
                      circular: bool = False, points_per_bin: int = 16) -> np.ndarray:
    """M[j, i]: probability of a report in out bin j for x spread evenly over in bin i.

    Built from the mechanism's closed-form CDF, averaged over
    ``points_per_bin`` midpoints of each input bin.
    """
    fractions = (np.arange(points_per_bin) + 0.5) / points_per_bin
    xs = in_edges[:-1, None] + fractions[None, :] * np.diff(in_edges)[:, None]  # (k_in, m)
    if getattr(mechanism, "name", "") == "duchi":
        # Two atoms: the "bins" are the two codes.
        upper = mechanism.pdf(xs, mechanism.output_high).mean(axis=1)
        return np.stack([1.0 - upper, upper])
    cdf = mechanism.cdf(xs[None, :, :], out_edges[:, None, None])  # (k_out + 1, k_in, m)
    matrix = np.diff(cdf, axis=0).mean(axis=2)
    if not circular:
        # Atoms at the ends (truncated Laplace) belong to the edge bins.
        matrix[0] += cdf[0].mean(axis=1)
        matrix[-1] += 1.0 - cdf[-1].mean(axis=1)
    matrix = np.clip(matrix, 0.0, None)
    return matrix / matrix.sum(axis=0, keepdims=True)


def smooth(p: np.ndarray, circular: bool) -> np.ndarray:
    """Binomial (1, 2, 1) / 4 smoothing; the ends reflect, a circle wraps."""
    if circular:
        left, right = np.roll(p, 1), np.roll(p, -1)
    else:
        left = np.concatenate([p[:1], p[:-1]])
        right = np.concatenate([p[1:], p[-1:]])
    out = 0.25 * left + 0.5 * p + 0.25 * right
    return out / out.sum()


def ems(counts: np.ndarray, matrix: np.ndarray, *, circular: bool = False,
        max_iterations: int = 10_000, tolerance: float = 1e-7) -> np.ndarray:
    """Reconstructed probabilities of the input bins (sum 1); uniform with no data.

    Stops when the log-likelihood per report improves by less than
    ``tolerance`` (Li et al. use a small threshold on the improvement).
    """
    counts = np.asarray(counts, dtype=np.float64)
    k_in = matrix.shape[1]
    total = counts.sum()
    p = np.full(k_in, 1.0 / k_in)
    if total <= 0:
        return p
    weights = counts / total
    tiny = 1e-300
    previous = -np.inf
    for _ in range(max_iterations):
        predicted = matrix @ p  # P(report in j)
        likelihood = float(weights @ np.log(np.maximum(predicted, tiny)))
        if likelihood - previous < tolerance:
            break
        previous = likelihood
        # E and M steps together: p_i <- p_i sum_j w_j M[j, i] / predicted_j
        p = p * (matrix.T @ (weights / np.maximum(predicted, tiny)))
        p = smooth(p / p.sum(), circular)
    return p


def quantiles(edges: np.ndarray, probabilities: np.ndarray, levels) -> dict[str, float]:
    """Quantiles of a binned distribution, linear within bins."""
    cumulative = np.concatenate([[0.0], np.cumsum(probabilities)])
    cumulative /= cumulative[-1] if cumulative[-1] > 0 else 1.0
    out = {}
    for level in levels:
        i = int(np.clip(np.searchsorted(cumulative, level, side="left"), 1, edges.size - 1))
        lo_c, hi_c = cumulative[i - 1], cumulative[i]
        share = 0.0 if hi_c <= lo_c else (level - lo_c) / (hi_c - lo_c)
        out[f"{level:g}"] = float(edges[i - 1] + share * (edges[i] - edges[i - 1]))
    return out
