"""Reconstructing the distribution of true values from perturbed reports.

EM under the mechanism's exact transition matrix M[j, i] = P(report in output
bin j | true value in input bin i), given the counts c_j of reports per output
bin, with optional smoothing (EMS, Li et al., "Estimating Numerical
Distributions under Local Differential Privacy", SIGMOD 2020):

    E and M  p_i <- p_i sum_j (c_j / N) M[j, i] / (M p)_j
    S        p <- (1 - s) p + s K p,   K the binomial kernel (1, 2, 1) / 4

s = 1 is Li et al.'s EMS; s = 0 is plain EM, whose fixed point is the
maximum-likelihood distribution over the input bins.  Smoothing keeps EM from
fitting the noise into spikes when reports are few or epsilon is small, and
biases the shape (and the mean) when they are many or epsilon is large, so
``choose_smoothing`` picks s from the data by cross-validated likelihood:
the reports are split in two by binomial thinning, each half is fitted and
the other half scores it.  On a circle the kernel wraps.

The iterations are SQUAREM-accelerated (Varadhan and Roland, "Simple and
globally convergent methods for accelerating the convergence of any EM
algorithm", Scand. J. Statistics 2008, scheme S3 with the monotone fallback):
plain EM needs tens of thousands of steps to reach the maximum likelihood
when M blurs heavily.  A smoothed fit (s > 0) is then finished by Newton steps
on its fixed point, p <- p + (I - F_p)^-1 (F(p) - p) (``_polish``), which
converge quadratically where SQUAREM converges linearly.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# Smoothing weights the cross-validation chooses a histogram's from (1 = EMS).  Not 0:
# the maximum likelihood fits the noise into spikes, and was never the closest
# histogram in our trials even at eps = 8 (it serves the mean's inversion instead).
SMOOTHING_CHOICES = (1.0, 0.3, 0.1, 0.03, 0.01)
# Accelerated steps of each cross-validation fit: each starts from its neighbouring
# smoothing's fit, and the choice needs no tight convergence (50 picked the same smoothing
# as 300 in 99% of splits tried, at a third of the cost; docs/benchmarks/BENCHMARKS.md).
CROSS_VALIDATION_STEPS = 50
# ... and stop where they move less than this (L1) in a step: 1e-7 before, the same
# smoothing in 60 of 60 windows tried (the scale benchmark's mechanism, means across its
# domain, N = 500-20,000) at 82% of the cost; 1e-4 changed one of them (2026-12-05).
CROSS_VALIDATION_TOLERANCE = 1e-5
# A fit to a tight tolerance is taken by SQUAREM to POLISH_FROM, then by Newton steps on
# its fixed point (``_polish``): SQUAREM converges linearly, slowly where M blurs much (an
# EMS fit at eps = 1 took 100-230 accelerated steps to 1e-6), while Newton converges
# quadratically, a 50 x 50 solve a step.  Measured on 62 fits of the scale benchmark's
# windows: 0.65 ms a fit instead of 1.50, median distance to the exact fixed point 2e-11
# instead of 1e-8 (L1); starting Newton from 1e-6 or 1e-5 cost 0.95 ms, from 1e-3 the
# worst fit ended farther away.
POLISH_FROM = 1e-4
POLISH_STEPS = 4
# Where Newton fails from POLISH_FROM (its step leaves the simplex: near a flat end, bins of
# equal columns hold tiny masses that only the smoothing shapes), it is tried again after
# this many accelerated steps, not after the rest of the step budget: on the 35 such fits
# of 120 windows near an end (weak smoothing, 0.01-0.1), 1.5 ms a fit instead of 14, 50-1,750
# steps instead of 62-2,000 (seven at the cap), each as close to the fixed point or closer.
POLISH_RETRY_STEPS = 50
_TINY = 1e-300


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


# -- kernels --------------------------------------------------------------------------------
# nogil: the API's snapshots compute these in their own thread; holding the GIL for the
# tens of milliseconds a fit takes would stall the ingest thread meanwhile.
# The two products of an EM step run along contiguous rows, of M and of its transpose, and
# REASSOCIATE lets LLVM sum them in SIMD lanes (three times faster than the strided,
# in-order loops: benchmarks/bench_estimation.py).  Only reassociation and its relatives:
# no flag that assumes away NaN or infinity, so the comparisons keep their meaning.
REASSOCIATE = {"reassoc", "contract", "nsz", "arcp"}


@njit(cache=True, nogil=True, fastmath=REASSOCIATE)
def _log_likelihood(weights, matrix, p):
    predicted = np.empty(matrix.shape[0])
    _predict(matrix, p, predicted)
    return _log_likelihood_of(weights, predicted)


@njit(cache=True, nogil=True, fastmath=REASSOCIATE)
def _predict(matrix, p, predicted):
    """predicted = M p: the reports' distribution under p."""
    for j in range(matrix.shape[0]):
        total = 0.0
        for i in range(matrix.shape[1]):
            total += matrix[j, i] * p[i]
        predicted[j] = total


@njit(cache=True, nogil=True)
def _log_likelihood_of(weights, predicted):
    total = 0.0
    for j in range(predicted.size):
        if weights[j] > 0.0:
            total += weights[j] * np.log(max(predicted[j], _TINY))
    return total


@njit(cache=True, nogil=True, fastmath=REASSOCIATE)
def _em_step(weights, matrix, transposed, p, smoothing, circular, out, ratio, scratch):
    """One EM step then the smoothing, from p into out (no allocation); ``transposed``
    is M.T, contiguous."""
    _predict(matrix, p, ratio)
    _em_step_predicted(weights, transposed, p, smoothing, circular, out, ratio, scratch)


@njit(cache=True, nogil=True, fastmath=REASSOCIATE)
def _em_step_predicted(weights, transposed, p, smoothing, circular, out, ratio, scratch):
    """``_em_step`` with M p given in ``ratio`` (overwritten)."""
    k_in, k_out = transposed.shape
    for j in range(k_out):
        ratio[j] = weights[j] / max(ratio[j], _TINY)
    total = 0.0
    for i in range(k_in):
        acc = 0.0
        for j in range(k_out):
            acc += transposed[i, j] * ratio[j]
        scratch[i] = p[i] * acc
        total += scratch[i]
    for i in range(k_in):
        scratch[i] /= total
    if smoothing == 0.0:
        for i in range(k_in):
            out[i] = scratch[i]
        return
    total = 0.0
    for i in range(k_in):
        if circular:
            left, right = scratch[(i - 1) % k_in], scratch[(i + 1) % k_in]
        else:
            left, right = scratch[max(i - 1, 0)], scratch[min(i + 1, k_in - 1)]
        kernel = 0.25 * left + 0.5 * scratch[i] + 0.25 * right
        out[i] = (1.0 - smoothing) * scratch[i] + smoothing * kernel
        total += out[i]
    for i in range(k_in):
        out[i] /= total


@njit(cache=True, nogil=True)
def _squarem(weights, matrix, transposed, p, smoothing, circular, tolerance, max_steps):
    """SQUAREM (S3) iterations of ``_em_step`` from p, in place; returns the steps taken.

    Stops when the log-likelihood gains less than ``tolerance`` per report and
    p moves by less than ``tolerance`` in L1 over one accelerated step.  M p of the point each step
    moves to is kept from its likelihood for the next step's EM step (7 products
    with M an iteration instead of 8)."""
    k_out, k_in = matrix.shape
    p1, p2, q = np.empty(k_in), np.empty(k_in), np.empty(k_in)
    ratio, scratch = np.empty(k_out), np.empty(k_in)
    at_p, at_p1, at_p2 = np.empty(k_out), np.empty(k_out), np.empty(k_out)
    _predict(matrix, p, at_p)
    current = _log_likelihood_of(weights, at_p)
    for step in range(max_steps):
        ratio[:] = at_p
        _em_step_predicted(weights, transposed, p, smoothing, circular, p1, ratio, scratch)
        _em_step(weights, matrix, transposed, p1, smoothing, circular, p2, ratio, scratch)
        rr, vv = 0.0, 0.0
        for i in range(k_in):
            r = p1[i] - p[i]
            v = p2[i] - 2.0 * p1[i] + p[i]
            rr += r * r
            vv += v * v
        if vv == 0.0:
            for i in range(k_in):
                p[i] = p2[i]
            return step + 1
        alpha = min(-np.sqrt(rr / vv), -1.0)
        total = 0.0
        for i in range(k_in):
            r = p1[i] - p[i]
            v = p2[i] - 2.0 * p1[i] + p[i]
            q[i] = max(p[i] - 2.0 * alpha * r + alpha * alpha * v, 0.0)
            total += q[i]
        for i in range(k_in):
            q[i] /= total
        # A stabilising EM step from the extrapolated point (into p1, free now).
        _em_step(weights, matrix, transposed, q, smoothing, circular, p1, ratio, scratch)
        _predict(matrix, p1, at_p1)
        _predict(matrix, p2, at_p2)
        extrapolated = _log_likelihood_of(weights, at_p1)
        plain = _log_likelihood_of(weights, at_p2)
        best, at_best = p1, at_p1
        if not extrapolated >= plain:  # monotone: fall back to two plain steps
            best, at_best, extrapolated = p2, at_p2, plain
        moved = 0.0
        for i in range(k_in):
            moved += abs(best[i] - p[i])
            p[i] = best[i]
        at_p[:] = at_best
        gain = extrapolated - current
        current = extrapolated
        if gain < tolerance and moved < tolerance:
            return step + 1
    return max_steps


# -- reconstruction ---------------------------------------------------------------------------

def reconstruct(counts, matrix: np.ndarray, *, smoothing: float = 1.0, circular: bool = False,
                start: np.ndarray | None = None, tolerance: float = 1e-9,
                max_steps: int = 2_000, polish: bool = True) -> np.ndarray:
    """Reconstructed probabilities of the input bins (sum 1); uniform with no data.

    ``smoothing`` in [0, 1] (1: EMS, 0: maximum likelihood); ``start``: where
    the iterations begin (a previous fit converges in a few steps).  ``polish``: a
    smoothed fit to a tolerance below POLISH_FROM ends with Newton steps on its fixed point
    (``_polish``); False keeps to accelerated EM steps, for fits whose step budget is part
    of their meaning (the bootstrap's refits).  The maximum likelihood itself is
    ``maximum_likelihood``'s: smoothing 0 here is plain (accelerated) EM, which converges
    slowly where that fit lies on the simplex's boundary."""
    if not 0.0 <= smoothing <= 1.0:
        raise ValueError(f"smoothing must be in [0, 1], got {smoothing!r}")
    counts = np.asarray(counts, dtype=np.float64)
    matrix = np.ascontiguousarray(matrix, dtype=np.float64)
    if counts.shape != (matrix.shape[0],):
        raise ValueError(f"counts must have {matrix.shape[0]} entries, got {counts.shape}")
    k_in = matrix.shape[1]
    total = counts.sum()
    p = np.full(k_in, 1.0 / k_in) if start is None else np.array(start, dtype=np.float64)
    if total <= 0:
        return p
    p /= p.sum()
    # The maximum likelihood (smoothing 0) is not polished: its fixed point lies on the
    # simplex's boundary, where Newton steps leave it.
    polish = polish and smoothing > 0.0 and tolerance < POLISH_FROM
    weights, transposed = counts / total, np.ascontiguousarray(matrix.T)
    steps = _squarem(weights, matrix, transposed, p, float(smoothing), bool(circular),
                     POLISH_FROM if polish else tolerance, max_steps)
    while polish and steps < max_steps:
        polished = _polish(weights, matrix, transposed, p, float(smoothing), bool(circular),
                           tolerance)
        if polished is not None:
            return polished
        # Newton left the simplex or did not converge: accelerated EM steps bring p closer,
        # and Newton tries again from there.
        taken = _squarem(weights, matrix, transposed, p, float(smoothing), bool(circular),
                         tolerance, min(POLISH_RETRY_STEPS, max_steps - steps))
        if taken < POLISH_RETRY_STEPS:
            break  # at the tolerance by EM steps alone, or at the step cap
        steps += taken
    return p


def _polish(weights, matrix, transposed, p, smoothing, circular, tolerance):
    """Newton steps on the fixed point p = F(p) of the smoothed EM step F = S o G from a
    fit near it, until ||F(p) - p||_1 <= ``tolerance``:
        p <- p + (I - F_p)^-1 (F(p) - p)
    (F_p as in ``fit_response``; its normalisation makes 1^T F_p = 0, so I - F_p is
    invertible and the step keeps the sum).  None where a step leaves the simplex or
    does not shrink the residual, or after POLISH_STEPS."""
    k_in = p.size
    out, ratio, scratch = np.empty(k_in), np.empty(matrix.shape[0]), np.empty(k_in)

    def residual(x):
        _em_step(weights, matrix, transposed, x, smoothing, circular, out, ratio, scratch)
        return out - x

    current = residual(p)
    size = np.abs(current).sum()
    for _ in range(POLISH_STEPS):
        if size <= tolerance:
            return p
        f_p = _fixed_point_derivatives(weights, matrix, p, smoothing, circular, shares=False)[0]
        try:
            moved = p + np.linalg.solve(np.eye(k_in) - f_p, current)
        except np.linalg.LinAlgError:
            return None
        if not moved.min() >= 0.0:
            return None
        moved /= moved.sum()
        following = residual(moved)
        following_size = np.abs(following).sum()
        if not following_size < size:
            return None
        p, current, size = moved, following, following_size
    return p if size <= tolerance else None


# -- the maximum likelihood -------------------------------------------------------------------
# The distribution over the input bins that makes the reports most likely is on the simplex's
# boundary wherever M blurs (a mixture's maximum likelihood has few support points), where
# EM converges sublinearly: near a domain's end it ran to its 2,000-step cap.  It is the
# minimum over p >= 0 of the convex
#     phi(p) = -sum_j w_j log (M p)_j + sum_i p_i,
# whose minimum has sum p = 1 (at a stationary point sum_i p_i dphi/dp_i = 0 gives
# sum p = sum w), so the simplex is only the bounds p >= 0 (the support reduction of
# Groeneboom, Jongbloed and Wellner, "The support reduction algorithm for computing
# non-parametric function estimates in mixture models", Scand. J. Statistics 2008).
# Those bounds are handled by projected Newton steps (Bertsekas, "Projected Newton methods
# for optimization problems with simple constraints", SIAM J. Control Optim. 1982): a
# Newton step on the bins not held at 0, a gradient step on the others, projected on
# p >= 0, with Armijo backtracking along the projection.  It identifies the support in a
# few steps and then converges quadratically.
ML_TOLERANCE = 1e-10  # max_i |p_i - max(p_i - dphi/dp_i, 0)|: the optimality conditions
ML_MAX_STEPS = 100
_ARMIJO = 1e-4
_HOLD_BELOW = 1e-3  # bins closer to 0 than this (and the residual) whose gradient is positive


@njit(cache=True, nogil=True, fastmath=REASSOCIATE)
def _objective(weights, matrix, p, q):
    """phi(p) (see above), with q = M p written; +inf where a report gets probability 0."""
    k_out, k = matrix.shape
    value = 0.0
    for i in range(k):
        value += p[i]
    for j in range(k_out):
        total = 0.0
        for i in range(k):
            total += matrix[j, i] * p[i]
        q[j] = total
        if weights[j] > 0.0:
            if total <= 0.0:
                return np.inf
            value -= weights[j] * np.log(total)
    return value


@njit(cache=True, nogil=True, fastmath=REASSOCIATE)
def _free_hessian(weights, matrix, q, free, nf, hessian):
    """hessian[:nf, :nf] = d2 phi / dp_a dp_b over the free bins: M_F^T diag(w / q^2) M_F."""
    hessian[:nf, :nf] = 0.0
    for j in range(matrix.shape[0]):
        if weights[j] > 0.0:
            c = weights[j] / (q[j] * q[j])
            for a in range(nf):
                ma = c * matrix[j, free[a]]
                for b in range(a + 1):
                    hessian[a, b] += ma * matrix[j, free[b]]
    for a in range(nf):
        for b in range(a):
            hessian[b, a] = hessian[a, b]


@njit(cache=True, nogil=True)
def _cholesky(hessian, nf, factor):
    """factor[:nf, :nf] lower triangular with L L^T = hessian[:nf, :nf] + ridge I, the
    ridge the smallest of 0, 1e-12, 1e-10, ... times the largest diagonal entry that
    keeps every pivot positive (bins whose columns of M nearly coincide make the
    Hessian nearly singular)."""
    scale = 0.0
    for a in range(nf):
        scale = max(scale, hessian[a, a])
    ridge = 0.0
    while True:
        positive = True
        for a in range(nf):
            for b in range(a + 1):
                s = hessian[a, b] + (ridge if a == b else 0.0)
                for c in range(b):
                    s -= factor[a, c] * factor[b, c]
                if a == b:
                    if not s > 0.0:
                        positive = False
                        break
                    factor[a, a] = np.sqrt(s)
                else:
                    factor[a, b] = s / factor[b, b]
            if not positive:
                break
        if positive:
            return
        ridge = 1e-12 * scale if ridge == 0.0 else ridge * 100.0


@njit(cache=True, nogil=True)
def _solve_cholesky(factor, nf, rhs, out, scratch):
    """out[:nf] = (L L^T)^-1 rhs[:nf]."""
    for a in range(nf):
        s = rhs[a]
        for b in range(a):
            s -= factor[a, b] * scratch[b]
        scratch[a] = s / factor[a, a]
    for a in range(nf - 1, -1, -1):
        s = scratch[a]
        for b in range(a + 1, nf):
            s -= factor[b, a] * out[b]
        out[a] = s / factor[a, a]


@njit(cache=True, nogil=True, fastmath=REASSOCIATE)
def _projected_newton(weights, matrix, transposed, p, tolerance, max_steps):
    """Projected Newton steps on phi from p (p >= 0), in place; returns the steps taken
    (max_steps if the optimality conditions did not reach ``tolerance``).  ``transposed``
    is M.T, contiguous."""
    k_out, k = matrix.shape
    q, trial_q, ratio = np.empty(k_out), np.empty(k_out), np.empty(k_out)
    gradient, trial, direction = np.empty(k), np.empty(k), np.empty(k)
    rhs, solved, scratch = np.empty(k), np.empty(k), np.empty(k)
    hessian, factor = np.empty((k, k)), np.empty((k, k))
    free = np.empty(k, dtype=np.int64)
    value = _objective(weights, matrix, p, q)
    for step in range(max_steps):
        for j in range(k_out):
            ratio[j] = weights[j] / q[j] if weights[j] > 0.0 else 0.0
        for i in range(k):
            acc = 0.0
            for j in range(k_out):
                acc += transposed[i, j] * ratio[j]
            gradient[i] = 1.0 - acc
        residual = 0.0
        for i in range(k):
            residual = max(residual, abs(p[i] - max(p[i] - gradient[i], 0.0)))
        if residual <= tolerance:
            return step
        # Held at 0: the bins next to it that the gradient pushes there; the others free.
        hold = min(_HOLD_BELOW, residual)
        nf = 0
        for i in range(k):
            direction[i] = -gradient[i]
            if not (p[i] <= hold and gradient[i] > 0.0):
                free[nf] = i
                rhs[nf] = -gradient[i]
                nf += 1
        _free_hessian(weights, matrix, q, free, nf, hessian)
        _cholesky(hessian, nf, factor)
        _solve_cholesky(factor, nf, rhs, solved, scratch)
        for a in range(nf):
            direction[free[a]] = solved[a]
        # Armijo along the projection arc; the rounding of phi is allowed for, so that
        # the last steps, whose decrease is below it, are taken.
        alpha, new = 1.0, np.inf
        for _ in range(60):
            decrease = 0.0
            for i in range(k):
                trial[i] = max(p[i] + alpha * direction[i], 0.0)
                decrease += gradient[i] * (p[i] - trial[i])
            new = _objective(weights, matrix, trial, trial_q)
            if value - new >= _ARMIJO * decrease - 1e-14 * abs(value):
                break
            alpha *= 0.5
        else:
            return step  # no step decreases phi beyond its rounding: as close as it gets
        p[:] = trial
        q[:] = trial_q
        value = new
    return max_steps


def _distinct_columns(matrix: np.ndarray) -> np.ndarray:
    """The first of each run of equal columns of M (bins whose reports are distributed
    alike, as inside a flat end of classical OGPM): no fit can tell them apart, and the
    maximum likelihood puts their mass on the first of them."""
    same = np.all(np.abs(np.diff(matrix, axis=1)) <= 1e-12, axis=0)
    return np.flatnonzero(np.concatenate([[True], ~same]))


def maximum_likelihood(counts, matrix: np.ndarray, *, start: np.ndarray | None = None,
                       on_support: bool = False, tolerance: float = ML_TOLERANCE,
                       max_steps: int = ML_MAX_STEPS) -> np.ndarray:
    """The input bins' probabilities that make the reports most likely (see above); where
    neighbouring bins have equal columns of M, their mass is on the first of them.
    ``counts``: one row of report counts per output bin, or many (one fit a row: the
    bootstrap's resamples).  ``start``: where the steps begin (a fit of similar reports
    converges in a few steps), uniform where it is not given or gives a reported bin
    probability 0.  ``on_support``: only the bins ``start`` gives mass are fitted, the
    others stay at 0 (the bootstrap's refits: EM's steps from a fit, which keep its zeros,
    gave the estimators' intervals the coverage they have).  Uniform with no reports."""
    counts = np.asarray(counts, dtype=np.float64)
    matrix = np.ascontiguousarray(matrix, dtype=np.float64)
    if counts.shape[-1:] != (matrix.shape[0],) or counts.ndim > 2:
        raise ValueError(f"counts must have {matrix.shape[0]} entries a row, got {counts.shape}")
    k_in = matrix.shape[1]
    distinct = _distinct_columns(matrix)
    begin = np.full(distinct.size, 1.0 / distinct.size)
    if start is not None:
        given = np.add.reduceat(np.asarray(start, dtype=np.float64), distinct)
        reported = counts.reshape(-1, matrix.shape[0]).any(axis=0)
        if (matrix[:, distinct] @ given)[reported].min() > 0.0:  # else phi is infinite there
            begin = given
            if on_support:
                distinct, begin = distinct[given > 0.0], given[given > 0.0]
    reduced = np.ascontiguousarray(matrix[:, distinct])
    transposed = np.ascontiguousarray(reduced.T)
    fits = np.zeros((counts.size // matrix.shape[0], k_in))
    for row, one in zip(fits, counts.reshape(fits.shape[0], -1)):
        total = one.sum()
        if total <= 0:
            row[:] = 1.0 / k_in
            continue
        p = begin.copy()
        _projected_newton(one / total, reduced, transposed, p, float(tolerance), int(max_steps))
        row[distinct] = p / p.sum()
    return fits if counts.ndim == 2 else fits[0]


def fit_response(counts, matrix: np.ndarray, p: np.ndarray, *, smoothing: float,
                 circular: bool = False, steps: int = 1024) -> np.ndarray | None:
    """J with p'(w + dw) ~ p + J dw: how far ``steps`` smoothed EM steps from the fit p
    move it when the reports' shares w = counts / N change by dw (the delta method for a
    fit with a step budget; dw from a resample of the reports gives a bootstrap
    replicate without refitting).

    p is a fixed point of F = S o G (G: the EM step, S: the smoothing), so each step
    moves the error by dp' = F_p dp + F_w dw, and after K steps from p
        J_K = sum_{k<K} F_p^k F_w            (= (I - F_p)^-1 F_w as K grows),
    summed by doubling (S_2m = S_m + F_p^m S_m), with G's derivatives
        g_i = p_i r_i,  r_i = sum_j M[j, i] w_j / q_j,  q = M p:
        dg/dp = diag(r) - diag(p) M^T diag(w / q^2) M,   dg/dw = diag(p) M^T diag(1 / q),
    each step's normalisation projecting by I - (its output) 1^T.  The budget matters
    where the likelihood is nearly flat (F_p has eigenvalues near 1: weak smoothing and
    many reports): there the fixed point moves far along directions that fits within a
    step budget hardly move along, and the bootstrap describes the fits the collector
    makes (the maximum likelihood, smoothing 0, most of all).  ``steps`` (a power of
    two): 1,024 plain steps move as far as refits of 60 accelerated ones (measured,
    docs/benchmarks/BENCHMARKS.md).  None where plain steps move away from p (F_p^K grows)."""
    if not 0.0 <= smoothing <= 1.0:
        raise ValueError(f"smoothing must be in [0, 1], got {smoothing!r}")
    if steps < 1 or steps & (steps - 1):
        raise ValueError(f"steps must be a power of two, got {steps!r}")
    f_p, f_w = _fixed_point_derivatives(counts, matrix, p, smoothing, circular)
    power, response, done = f_p, f_w, 1
    while done < steps:
        response = response + power @ response
        power = power @ power
        done *= 2
    if np.abs(power).max() > 1.0:
        # F_p^K grows: plain steps leave p (weak smoothing can make a fixed point
        # repelling, and accelerated fits still find it), so no linear response
        # describes what a refit does: the caller refits.  (Measured on one such fit:
        # refits' spread 0.29, the budgeted sum's 5e11, the fixed point's 0.088.)
        return None
    return response


def _fixed_point_derivatives(counts, matrix, p, smoothing, circular, *, shares=True):
    """(F_p, F_w): the derivatives of one smoothed EM step F = S o G at p (see
    ``fit_response``); F_w None unless ``shares``."""
    counts = np.asarray(counts, dtype=np.float64)
    matrix = np.asarray(matrix, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    w = counts / counts.sum()
    q = np.maximum(matrix @ p, _TINY)
    r = matrix.T @ (w / q)
    g = p * r
    g /= g.sum()
    g_p = np.diag(r) - (p[:, None] * matrix.T) @ ((w / (q * q))[:, None] * matrix)
    f = _smooth_columns(g[:, None], smoothing, circular)[:, 0]

    def step(derivative):  # d(normalised S(normalised g)) from dg
        x = derivative - g[:, None] * derivative.sum(axis=0)[None, :]
        x = _smooth_columns(x, smoothing, circular)
        return x - f[:, None] * x.sum(axis=0)[None, :]

    if not shares:
        return step(g_p), None
    return step(g_p), step(p[:, None] * (matrix.T / q[None, :]))


def _smooth_columns(x: np.ndarray, smoothing: float, circular: bool) -> np.ndarray:
    """The smoothing S applied to each column of x (as ``_em_step`` applies it to p)."""
    if circular:
        left, right = np.roll(x, 1, axis=0), np.roll(x, -1, axis=0)
    else:
        left, right = np.vstack([x[:1], x[:-1]]), np.vstack([x[1:], x[-1:]])
    return (1.0 - smoothing) * x + smoothing * (0.25 * left + 0.5 * x + 0.25 * right)


def halves(counts, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Split report counts in two at random (binomial thinning): each report lands in the
    first half with probability 1/2.  Seeded from the counts by the caller, so a state
    always gives the same split."""
    counts = np.asarray(counts, dtype=np.int64)
    first = np.random.default_rng(seed).binomial(counts, 0.5)
    return first, counts - first


def choose_smoothing(counts, matrix: np.ndarray, *, circular: bool = False,
                     choices=SMOOTHING_CHOICES, seed: int = 0, splits: int = 2) -> float:
    """The smoothing whose fits to half of the reports best predict the other half
    (two-fold cross-validated log-likelihood, summed over ``splits`` random splits to
    steady the choice); ties go to the stronger smoothing."""
    counts = np.asarray(counts, dtype=np.int64)
    matrix = np.ascontiguousarray(matrix, dtype=np.float64)
    folds = []
    for split in range(splits):
        first, second = halves(counts, seed + split)
        if first.sum() and second.sum():
            folds += [(first, second), (second, first)]
    if not folds:
        return max(choices)
    # From the strongest smoothing down, each fit starting from the previous one's:
    # neighbouring smoothings have nearby fits, and the choice needs no tight convergence.
    ordered = sorted(choices, reverse=True)
    starts = [None] * len(folds)
    scores = []
    for smoothing in ordered:
        score = 0.0
        for f, (fit, held) in enumerate(folds):
            starts[f] = reconstruct(fit, matrix, smoothing=smoothing, circular=circular,
                                    start=starts[f], tolerance=CROSS_VALIDATION_TOLERANCE,
                                    max_steps=CROSS_VALIDATION_STEPS, polish=False)
            score += _log_likelihood(held / held.sum(), matrix, starts[f])
        if scores and score < max(scores):
            # Past the best: the score rises then falls with the smoothing (all but 6% of
            # 288 trials, and those within 0.01 of flat), and the weakest smoothings, the
            # slowest fits, need not be tried.
            break
        scores.append(score)
    best = max(scores)
    return max(s for s, score in zip(ordered, scores) if score >= best - 1e-12)


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
