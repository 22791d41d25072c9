"""The estimator choice in every regime the issue measured (fixed seeds, properties with
margins), and the reconstruction kernel against a slow obvious reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, stats

from collector.aggregation.blocks import LinearBlock
from collector.aggregation.series import new_series
from collector.estimation import ems
from collector.estimation.estimators import (
    NEGLIGIBLE_SHARE,
    REFIT_STEPS,
    LinearModel,
    _refits,
    _robust_spread,
    linear_estimates,
)
from edge_agent import protocol
from edge_agent.mechanisms import (
    BoundedLaplace,
    ClassicalOGPM,
    PiecewiseMechanism,
    SquareWave,
    TruncatedLaplace,
    TypeIIPTT,
    UnbiasedOGPM,
    linear_mechanism,
)
from edge_agent.mechanisms.randomness import as_random_source
from edge_agent.protocol.descriptions import describe


def summarise(mechanism, x, rng, *, bins=50, kind="linear"):
    series = new_series(channel="c", kind=kind, description=protocol.describe(mechanism), bins=bins)
    codes = mechanism.perturb_codes(x, rng)
    for part in np.array_split(codes, 10):
        series.update(agent="a", t=0.0, codes=part)
    return series.get()


def gravity(rng, n):
    """An accelerometer axis carrying gravity on [-1, 1] g: 64% of the values in
    [0.9, 1], the rest spread below (the issue's first regime)."""
    near = rng.random(n) < 0.64
    return np.clip(np.where(near, rng.normal(0.955, 0.025, n), rng.normal(0.4, 0.35, n)), -1, 1)


def bimodal(rng, n):
    near = rng.random(n) < 0.7
    return np.clip(np.where(near, rng.normal(-0.65, 0.12, n), rng.normal(0.45, 0.15, n)), -1, 1)


def spread(rng, n):
    return rng.uniform(-0.8, 0.8, n)


def coverage_floor(trials: int, level: float = 0.95, alarm: float = 1e-6) -> int:
    """The fewest covering intervals that a true ``level`` gives with probability
    above ``alarm`` (a one-sided binomial bound)."""
    return int(stats.binom.ppf(alarm, trials, level))


def rms(values) -> float:
    return float(np.sqrt(np.mean(np.square(values))))


# -- the reconstruction kernel ------------------------------------------------------------------

def smooth(p, circular):
    """Binomial (1, 2, 1) / 4 smoothing; the ends reflect, a circle wraps."""
    if circular:
        left, right = np.roll(p, 1), np.roll(p, -1)
    else:
        left = np.concatenate([p[:1], p[:-1]])
        right = np.concatenate([p[1:], p[-1:]])
    out = 0.25 * left + 0.5 * p + 0.25 * right
    return out / out.sum()


def slow_em(counts, matrix, smoothing, circular, steps):
    """Plain EM (and smoothing) iterations, written the obvious way."""
    weights = counts / counts.sum()
    p = np.full(matrix.shape[1], 1.0 / matrix.shape[1])
    for _ in range(steps):
        p = p * (matrix.T @ (weights / (matrix @ p)))
        p /= p.sum()
        p = (1 - smoothing) * p + smoothing * smooth(p, circular)
    return p


def ogpm_reports(*, epsilon: float, bins: int, seed: int, circular: bool = False):
    """(M, counts): classical OGPM's matrix on ``bins`` bins of [-1, 1], and the output
    counts of 5,000 reports of a random distribution over them."""
    rng = np.random.default_rng(seed)
    edges = np.linspace(-1, 1, bins + 1)
    matrix = ems.transition_matrix(ClassicalOGPM(epsilon=epsilon, low=-1, high=1), edges,
                                   edges, circular=circular)
    return matrix, rng.multinomial(5000, matrix @ rng.dirichlet(np.ones(bins))).astype(float)


@pytest.mark.parametrize("smoothing", [1.0, 0.1, 0.0])
@pytest.mark.parametrize("circular", [False, True])
def test_accelerated_em_reaches_the_fixed_point_of_plain_em(smoothing, circular):
    matrix, counts = ogpm_reports(epsilon=2.0, bins=20, seed=3, circular=circular)
    fast = ems.reconstruct(counts, matrix, smoothing=smoothing, circular=circular,
                           tolerance=1e-13, max_steps=20_000)
    slow = slow_em(counts, matrix, smoothing, circular, steps=60_000)
    weights = counts / counts.sum()
    likelihood = lambda p: weights @ np.log(matrix @ p)  # noqa: E731
    # The same fixed point: the likelihoods agree, and so do the fits where the
    # likelihood is not flat (smoothing makes the fixed point unique).
    assert likelihood(fast) >= likelihood(slow) - 1e-9
    if smoothing > 0:
        assert np.abs(fast - slow).sum() < 1e-4


@pytest.mark.parametrize("smoothing", [1.0, 0.1, 0.01])
@pytest.mark.parametrize("circular", [False, True])
def test_newton_polish_lands_on_the_fixed_point_in_fewer_steps(smoothing, circular):
    """A smoothed fit ends with Newton steps from POLISH_FROM: it lands on the fixed
    point (of plain smoothed EM, run slowly) within 100 times the tolerance (L1), or as
    closely as accelerated EM to the same tolerance, with fewer EM steps; where Newton
    fails, accelerated EM finishes."""
    matrix, counts = ogpm_reports(epsilon=1.0, bins=25, seed=31, circular=circular)
    exact = ems.reconstruct(counts, matrix, smoothing=smoothing, circular=circular,
                            tolerance=1e-15, max_steps=200_000, polish=False)
    assert np.abs(exact - slow_em(counts, matrix, smoothing, circular, steps=20_000)).sum() \
        < 1e-6
    steps = []
    original = ems._squarem

    def counting(*args):
        steps.append(original(*args))
        return steps[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ems, "_squarem", counting)
        polished = ems.reconstruct(counts, matrix, smoothing=smoothing, circular=circular)
        polished_steps = sum(steps)
        steps.clear()
        plain = ems.reconstruct(counts, matrix, smoothing=smoothing, circular=circular,
                                polish=False)
        plain_steps = sum(steps)
        steps.clear()
        patch.setattr(ems, "_polish", lambda *args: None)  # Newton fails: EM finishes
        finished = ems.reconstruct(counts, matrix, smoothing=smoothing, circular=circular)
    assert np.abs(polished - exact).sum() < max(1e-7, np.abs(plain - exact).sum())
    assert polished_steps < plain_steps
    assert np.abs(finished - plain).sum() < 1e-7
    assert polished.min() >= 0 and math.isclose(polished.sum(), 1.0, rel_tol=1e-12)


@pytest.mark.parametrize("epsilon, seed", [(0.5, 0), (1.0, 4)])
def test_near_a_flat_end_newton_is_tried_again_until_it_lands_on_the_fixed_point(epsilon,
                                                                                 seed):
    """Reports of data near an end of classical OGPM, whose flat ends give bins equal
    columns of M, and weak smoothing: Newton's first step from POLISH_FROM leaves the
    simplex.  Accelerated EM steps bring the fit closer and Newton is tried again, so the
    fit lands on the fixed point well within the step budget (it ran to the budget)."""
    rng = np.random.default_rng(seed)
    edges = np.linspace(-1, 1, 41)
    matrix = ems.transition_matrix(ClassicalOGPM(epsilon=epsilon, low=-1, high=1), edges,
                                   edges)
    assert ems._distinct_columns(matrix).size < 30  # flat ends
    truth = np.histogram(rng.normal(0.7, 0.15, 20_000).clip(-1, 1), edges)[0] / 20_000
    counts = rng.multinomial(2500, matrix @ truth).astype(float)
    exact = ems.reconstruct(counts, matrix, smoothing=0.01, tolerance=1e-15,
                            max_steps=200_000, polish=False)
    attempts, steps = [], []
    original_polish, original_squarem = ems._polish, ems._squarem

    def polish(*args):
        attempts.append(original_polish(*args))
        return attempts[-1]

    def counting(*args):
        steps.append(original_squarem(*args))
        return steps[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ems, "_polish", polish)
        patch.setattr(ems, "_squarem", counting)
        fitted = ems.reconstruct(counts, matrix, smoothing=0.01)
    assert attempts[0] is None and attempts[-1] is not None
    assert sum(steps) < 1000
    # Equal columns make the fixed point ill-conditioned along them (only the weak
    # smoothing tells them apart): two converged fits agree to about 1e-7 in L1, by how
    # the machine rounds (1.7e-7 on an Intel Xeon, below 1e-7 on an AMD EPYC; an EM of
    # 4 million steps stops at the same place), far below an estimate's error.
    assert np.abs(fitted - exact).sum() < 1e-6


def test_reconstruct_refuses_bad_arguments():
    matrix = np.eye(3)
    with pytest.raises(ValueError, match="smoothing"):
        ems.reconstruct([1, 2, 3], matrix, smoothing=1.5)
    with pytest.raises(ValueError, match="counts"):
        ems.reconstruct([1, 2], matrix)
    assert np.allclose(ems.reconstruct([0, 0, 0], matrix), 1 / 3)



def slsqp_maximum_likelihood(counts, matrix):
    """The maximum likelihood over the simplex by a general constrained solver (SciPy's
    SLSQP, to ftol 1e-15): slow, and independent of ours.  (Plain and accelerated
    projected gradient did not reach a tight tolerance in minutes on these cases.)"""
    weights = counts / counts.sum()
    seen, k = weights > 0, matrix.shape[1]
    rows, shares = matrix[seen], weights[seen]
    found = optimize.minimize(
        lambda p: -shares @ np.log(np.maximum(rows @ p, 1e-300)), np.full(k, 1 / k),
        jac=lambda p: -(rows.T @ (shares / np.maximum(rows @ p, 1e-300))), method="SLSQP",
        bounds=[(0, 1)] * k, options={"ftol": 1e-15, "maxiter": 10_000},
        constraints=[{"type": "eq", "fun": lambda p: p.sum() - 1, "jac": lambda p: np.ones(k)}])
    assert found.success, found.message
    return found.x


@pytest.mark.parametrize("where", ["low end", "middle", "high end"])
@pytest.mark.parametrize("bins, epsilon", [(21, 1.0), (51, 1.0), (21, 4.0)])
def test_the_maximum_likelihood_is_the_constrained_optimum(where, bins, epsilon):
    """Classical OGPM with the data at either end (mass in its flat regions, most bins of
    the fit at 0) and in the middle: the projected Newton fit is the optimum an
    independent solver finds (L1 1e-5, the same likelihood), its Frank-Wolfe duality gap
    (max_i g_i - g . p, which bounds how far its log-likelihood is from the maximum)
    is below 1e-10, and accelerated EM at its old 2,000-step cap is no better."""
    rng = np.random.default_rng([bins, int(epsilon), len(where)])
    mechanism = ClassicalOGPM(epsilon=epsilon, low=-1, high=1)
    edges = np.linspace(-1, 1, bins)
    matrix = ems.transition_matrix(mechanism, edges, edges)
    values = {"low end": -1 + 2 * rng.beta(1.3, 9, 5000),
              "middle": np.clip(rng.normal(0, 0.3, 5000), -1, 1),
              "high end": 1 - 2 * rng.beta(1.3, 9, 5000)}[where]
    counts = rng.multinomial(5000, matrix @ np.histogram(values, edges)[0] / 5000)
    fit = ems.maximum_likelihood(counts, matrix)
    # Bins with equal columns (inside a flat end) are one bin to any fit: compared on the
    # first of each, where ours puts their mass.
    distinct = ems._distinct_columns(matrix)
    assert np.all(np.delete(fit, distinct) == 0)
    reduced = matrix[:, distinct]
    reference = slsqp_maximum_likelihood(counts, reduced)
    weights = counts / counts.sum()
    likelihood = lambda p: weights[weights > 0] @ np.log((matrix @ p)[weights > 0])  # noqa: E731
    assert np.abs(fit[distinct] - reference).sum() < 1e-5
    assert likelihood(fit) >= likelihood(_spread(reference, distinct, bins - 1)) - 1e-12
    gradient = matrix.T @ (weights / (matrix @ fit))
    assert gradient.max() - gradient @ fit < 1e-10
    assert fit.min() >= 0 and math.isclose(fit.sum(), 1.0, rel_tol=1e-12)
    assert (fit == 0).any()  # on the boundary: EM's slow case
    capped = ems.reconstruct(counts, matrix, smoothing=0.0, max_steps=2_000)
    assert likelihood(fit) >= likelihood(capped) - 1e-12


def _spread(reduced_fit, distinct, k):
    """A fit over the distinct columns as a fit over all bins (each on the first of its
    run)."""
    full = np.zeros(k)
    full[distinct] = reduced_fit
    return full


def test_maximum_likelihood_fits_each_resample_from_a_start():
    """Rows of counts are fitted one by one, from ``start`` where it gives every reported
    bin a positive probability (else from uniform): the same fits as one at a time."""
    matrix, counts = ogpm_reports(epsilon=1.0, bins=30, seed=41)
    fit = ems.maximum_likelihood(counts, matrix)
    resampled = np.random.default_rng(5).multinomial(int(counts.sum()), counts / counts.sum(),
                                                     size=6)
    together = ems.maximum_likelihood(resampled, matrix, start=fit)
    for row, one in zip(together, resampled):
        assert np.abs(row - ems.maximum_likelihood(one, matrix)).sum() < 1e-6
    nowhere = np.zeros(matrix.shape[1])
    nowhere[0] = 1.0  # gives reported bins probability 0: ignored
    assert np.abs(ems.maximum_likelihood(counts, matrix, start=nowhere) - fit).sum() < 1e-6
    assert np.allclose(ems.maximum_likelihood(np.zeros(matrix.shape[0]), matrix),
                       1 / matrix.shape[1])


def test_maximum_likelihood_refuses_bad_arguments():
    with pytest.raises(ValueError, match="counts must have 3 entries"):
        ems.maximum_likelihood([1, 2], np.eye(3))
    with pytest.raises(ValueError, match="counts must have 3 entries"):
        ems.maximum_likelihood(np.ones((2, 2, 3)), np.eye(3))

def test_cross_validation_chooses_stronger_smoothing_with_fewer_reports():
    """Few reports need more smoothing than many: the data decides."""
    mechanism = ClassicalOGPM(epsilon=2.0, low=-1, high=1)
    edges = np.linspace(-1, 1, 51)
    matrix = ems.transition_matrix(mechanism, edges, edges)
    chosen = {}
    for n in (300, 300_000):
        picks = []
        for seed in range(5):
            rng = np.random.default_rng([seed, n])
            truth = np.histogram(bimodal(rng, 100_000), edges)[0] / 100_000
            counts = rng.multinomial(n, matrix @ truth)
            picks.append(ems.choose_smoothing(counts, matrix, seed=seed))
        chosen[n] = np.median(picks)
    assert chosen[300] > chosen[300_000]


@pytest.mark.parametrize("smoothing", [1.0, 0.1, 0.01])
@pytest.mark.parametrize("circular", [False, True])
def test_the_fit_response_is_the_derivative_of_the_smoothed_fit(smoothing, circular):
    """J from ``fit_response`` without a step budget (2^20 steps) against finite
    differences of converged fits: the gap is second order (a hundredth of the step gives
    a ten-thousandth of the gap)."""
    rng = np.random.default_rng(11)
    mechanism = ClassicalOGPM(epsilon=1.0, low=-1, high=1)
    edges = np.linspace(-1, 1, 31)
    matrix = ems.transition_matrix(mechanism, edges, edges, circular=circular)
    counts = rng.multinomial(4000, matrix @ rng.dirichlet(np.ones(30))).astype(float)
    fit = dict(smoothing=smoothing, circular=circular, tolerance=1e-15, max_steps=50_000)
    p = ems.reconstruct(counts, matrix, **fit)
    response = ems.fit_response(counts, matrix, p, smoothing=smoothing, circular=circular,
                                steps=2**20)
    direction = rng.normal(size=counts.size)
    direction -= direction.mean()
    gaps = []
    for step in (1e-3, 1e-5):
        moved = ems.reconstruct(counts + step * direction * counts.sum(), matrix, start=p, **fit)
        gaps.append(np.abs(moved - p - response @ (step * direction)).max())
        assert gaps[-1] < 0.1 * np.abs(moved - p).max()
    assert gaps[1] < 1e-3 * gaps[0]


@pytest.mark.parametrize("smoothing", [0.3, 0.0])
def test_the_budgeted_response_is_the_response_of_that_many_em_steps(smoothing):
    """K steps of the smoothed EM map from p, linearised: sum_{k<K} F_p^k F_w, which
    ``fit_response`` sums by doubling; checked against K explicit steps of a perturbed
    fit (first order: the gap shrinks with the square of the perturbation)."""
    matrix, counts = ogpm_reports(epsilon=2.0, bins=20, seed=12)
    rng = np.random.default_rng(13)  # the perturbation's direction
    p = ems.reconstruct(counts, matrix, smoothing=smoothing, tolerance=1e-15,
                        max_steps=50_000)
    response = ems.fit_response(counts, matrix, p, smoothing=smoothing, steps=8)
    direction = rng.normal(size=counts.size)
    direction -= direction.mean()
    gaps = []
    for step in (1e-4, 1e-6):
        moved = p.copy()
        for _ in range(8):  # plain EM steps (and smoothing) at the perturbed counts
            moved = slow_em_step(counts + step * direction * counts.sum(), matrix, moved,
                                 smoothing)
        gaps.append(np.abs(moved - slow_em_fixed(p, counts, matrix, smoothing, 8)
                           - response @ (step * direction)).max())
    assert gaps[1] < 1e-3 * gaps[0]


def slow_em_step(counts, matrix, p, smoothing):
    p = p * (matrix.T @ (counts / counts.sum() / (matrix @ p)))
    p /= p.sum()
    return (1 - smoothing) * p + smoothing * smooth(p, False)


def slow_em_fixed(p, counts, matrix, smoothing, steps):
    """Where ``steps`` steps at the unperturbed counts take p (p itself at a fixed point,
    to rounding)."""
    for _ in range(steps):
        p = slow_em_step(counts, matrix, p, smoothing)
    return p


def test_fit_response_refuses_bad_arguments():
    with pytest.raises(ValueError, match="smoothing"):
        ems.fit_response([1, 2, 3], np.eye(3), np.full(3, 1 / 3), smoothing=1.5)
    with pytest.raises(ValueError, match="power of two"):
        ems.fit_response([1, 2, 3], np.eye(3), np.full(3, 1 / 3), smoothing=0.1, steps=1000)


@pytest.mark.parametrize("make", [lambda: ClassicalOGPM(epsilon=1.0, low=-1, high=1),
                                  lambda: SquareWave(epsilon=2.0, low=-1, high=1,
                                                     compressed=True)])
@pytest.mark.parametrize("n", [2000, 20000])
def test_resampled_fits_from_the_response_spread_like_refits(make, n):
    """The bootstrap's smoothed replicates from the budgeted linear response: their
    spread (of the reconstruction's mean, and in L1) is the refits' within 15%, on the
    same 300 resamples."""
    mechanism = make()
    rng = np.random.default_rng(n)
    edges = np.linspace(-1, 1, 21)
    out_edges = edges if mechanism.output_low == -1 else np.linspace(
        mechanism.output_low, mechanism.output_high, 41)
    matrix = ems.transition_matrix(mechanism, edges, out_edges)
    counts = rng.multinomial(n, matrix @ rng.dirichlet(np.full(20, 0.5)))
    smoothing = ems.choose_smoothing(counts, matrix, seed=n)
    fitted = ems.reconstruct(counts, matrix, smoothing=smoothing)
    assert ems.fit_response(counts, matrix, fitted, smoothing=smoothing) is not None
    resampled = rng.multinomial(n, counts / n, size=300)
    linear = _refits(counts, matrix, fitted, smoothing, resampled)
    refits = np.array([ems.reconstruct(one, matrix, smoothing=smoothing, start=fitted,
                                       max_steps=REFIT_STEPS) for one in resampled])
    centres = 0.5 * (edges[1:] + edges[:-1])
    assert 0.85 < np.std(linear @ centres) / np.std(refits @ centres) < 1.15
    l1 = [np.abs(fits - fitted).sum(axis=1).mean() for fits in (linear, refits)]
    assert 0.85 < l1[0] / l1[1] < 1.15


def test_where_plain_steps_leave_the_fit_the_replicates_are_refits():
    """Classical OGPM near an end at eps = 1: the maximum-likelihood fit (stopped at its
    cap) is one that plain EM steps leave, F_p^1024 grows, no linear response is given
    and the replicates are the refits themselves."""
    mechanism, n = ClassicalOGPM(epsilon=1.0, low=-2, high=2), 5000
    rng = np.random.default_rng([n, 7])
    block = LinearBlock(describe(mechanism), 50)
    block.update(mechanism.perturb_codes(-2 + 4 * rng.beta(1.3, 9, n), rng))
    model = block.model()
    counts = model.fit_counts(block.out.get())
    ml = model.placed(ems.reconstruct(counts, model.matrix, smoothing=0.0))
    f_p, _ = ems._fixed_point_derivatives(counts, model.matrix, ml, 0.0, False)
    assert np.abs(np.linalg.matrix_power(f_p, 1024)).max() > 10
    assert ems.fit_response(counts, model.matrix, ml, smoothing=0.0) is None
    resampled = np.random.default_rng(3).multinomial(n, counts / n, size=4)
    refits = [ems.reconstruct(one, model.matrix, smoothing=0.0, start=ml,
                              max_steps=REFIT_STEPS) for one in resampled]
    assert np.array_equal(_refits(counts, model.matrix, ml, 0.0, resampled), refits)


def test_cross_validation_stops_past_the_best_score_without_losing_it():
    """From the strongest smoothing down, the search stops once the score falls: over
    varied data it picks what the full search picks, or one scoring within 0.02 of it."""
    mechanism = ClassicalOGPM(epsilon=1.0, low=-1, high=1)
    edges = np.linspace(-1, 1, 51)
    matrix = ems.transition_matrix(mechanism, edges, edges)
    same = 0
    for seed in range(24):
        rng = np.random.default_rng([seed, 5])
        truth = rng.dirichlet(np.full(50, [0.2, 1.0, 5.0][seed % 3]))
        counts = rng.multinomial([500, 5000, 50_000][seed // 8 % 3], matrix @ truth)
        folds = []
        for split in range(2):
            first, second = ems.halves(counts, seed + split)
            folds += [(first, second), (second, first)]
        scores, starts = {}, [None] * 4
        for smoothing in sorted(ems.SMOOTHING_CHOICES, reverse=True):
            score = 0.0
            for f, (fit, held) in enumerate(folds):
                starts[f] = ems.reconstruct(fit, matrix, smoothing=smoothing, start=starts[f],
                                            tolerance=ems.CROSS_VALIDATION_TOLERANCE,
                                            max_steps=ems.CROSS_VALIDATION_STEPS)
                score += ems._log_likelihood(held / held.sum(), matrix, starts[f])
            scores[smoothing] = score
        chosen = ems.choose_smoothing(counts, matrix, seed=seed)
        best = max(scores, key=lambda s: (scores[s], s))
        same += chosen == best
        assert scores[chosen] >= scores[best] - 0.02
    assert same >= 20


def test_the_maximum_likelihood_refits_are_skipped_only_where_they_change_nothing():
    """Classical OGPM with the data in the middle: the fit has next to no mass where
    E[M(x)] is flat, so the inversion is (raw - b) / a whatever the refits; forcing them
    changes the numbers by a few thousandths of a standard error at most (the mass is
    below NEGLIGIBLE_SHARE of it).  With data near an end the refits are made."""
    rng = np.random.default_rng(29)
    mechanism = ClassicalOGPM(epsilon=1.0, low=-2.0, high=2.0)
    block = LinearBlock(describe(mechanism), 50)
    block.update(mechanism.perturb_codes(np.clip(rng.normal(0.2, 0.3, 2500), -2, 2), rng))
    shared = block.model()
    refitting = LinearModel(mechanism, shared.in_edges, shared.out_edges,
                            ems.transition_matrix(mechanism, shared.in_edges, shared.out_edges))
    refitting.outside_affine = np.ones(shared.centres.size, dtype=bool)
    calls = []
    original = ems.maximum_likelihood

    def counting(counts, matrix, **kwargs):
        calls.append(np.asarray(counts).size // matrix.shape[0])
        return original(counts, matrix, **kwargs)

    def estimates(model, block):
        """The estimates, and how many maximum-likelihood fits they took."""
        calls.clear()
        moments = block.moments.get()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(ems, "maximum_likelihood", counting)
            found = linear_estimates(model, out_counts=block.out.get(), n=block.count.get(),
                                     raw_mean=moments["mean"],
                                     report_variance=moments["variance"])
        return found["mean"], sum(calls)

    (skipped, fits), (general, refits) = estimates(shared, block), estimates(refitting, block)
    assert (fits, refits) == (1, 1 + 30)
    assert skipped["method"] == general["method"]
    for key in ("estimate", "stderr", "bias_bound"):
        assert abs(skipped[key] - general[key]) <= 5 * NEGLIGIBLE_SHARE * general["stderr"], key
    # Near an end the fit has mass where E[M(x)] is flat: it is refitted.
    near = LinearBlock(describe(mechanism), 50)
    near.update(mechanism.perturb_codes(-2 + 4 * rng.beta(1.3, 9, 2500), rng))
    assert estimates(shared, near)[1] == 1 + 30


# -- the mean ---------------------------------------------------------------------------------

def test_inversion_is_the_affine_inversion_where_the_mean_is_affine():
    rng = np.random.default_rng(5)
    mechanism = PiecewiseMechanism(epsilon=1.0, low=-1, high=1, compressed=True)
    a, b, _, _ = mechanism.affine_mean()
    mean = summarise(mechanism, spread(rng, 5000), rng)["mean"]
    assert mean["candidates"]["inversion"]["estimate"] == pytest.approx(
        (mean["raw"] - b) / a, abs=1e-9)


def test_an_unbiased_mechanism_has_no_inversion():
    rng = np.random.default_rng(6)
    mean = summarise(UnbiasedOGPM(epsilon=1.0, low=-1, high=1), spread(rng, 5000), rng)["mean"]
    assert set(mean["candidates"]) == {"raw", "reconstruction"}


@pytest.mark.parametrize("grid_bits", [8, 16])
def test_ii_ptt_has_no_inversion_and_its_interval_covers_near_an_end(grid_bits):
    """II-PTT is unbiased on the whole domain (its tent's centre is randomized between
    ticks, so even a coarse grid's mean is exactly x): the raw average needs no
    inversion, and its interval covers the truth where the data crowds an end."""
    mechanism = TypeIIPTT(epsilon=1.0, low=-1, high=1, grid_bits=grid_bits)
    trials, covered = 60, 0
    for seed in range(trials):
        rng = np.random.default_rng([seed, grid_bits, 29])
        x = gravity(rng, 5000)
        mean = summarise(mechanism, x, rng)["mean"]
        assert set(mean["candidates"]) == {"raw", "reconstruction"}
        covered += mean["ci95"][0] <= x.mean() <= mean["ci95"][1]
    assert covered >= coverage_floor(trials)


@pytest.mark.parametrize("make", [TypeIIPTT, UnbiasedOGPM], ids=lambda m: m.__name__)
def test_an_unbiased_mechanism_reports_the_estimate_of_least_estimated_error_and_covers(make):
    """Few reports at a small epsilon: an unbiased mechanism's raw average is unbiased
    but noisy (its reports range far beyond the domain), and the reconstruction, which
    knows that readings lie in the domain, errs less.  The collector reports the
    candidate of least estimated error (the raw average before: II-PTT end to end, raw
    0.026 where the reconstruction's estimated error was 0.015), and its interval,
    which holds the raw average's, covers."""
    mechanism = make(epsilon=0.5, low=-1, high=1)
    trials, covered, chosen, raw, methods = 60, 0, [], [], []
    for seed in range(trials):
        rng = np.random.default_rng([seed, 47])
        x = spread(rng, 300)
        mean = summarise(mechanism, x, rng)["mean"]
        rmse = {name: c["rmse"] for name, c in mean["candidates"].items()}
        assert mean["method"] == min(rmse, key=rmse.get)
        covered += mean["ci95"][0] <= x.mean() <= mean["ci95"][1]
        chosen.append(mean["estimate"] - x.mean())
        raw.append(mean["raw"] - x.mean())
        methods.append(mean["method"])
    assert covered >= coverage_floor(trials)
    assert methods.count("reconstruction") > trials // 2
    assert rms(chosen) < 0.9 * rms(raw)


@pytest.mark.parametrize("make, epsilon, n, factor", [
    (ClassicalOGPM, 2.0, 6000, 0.5),       # regime 1: OGPM with the data near an end
    # All of this data is where OGPM at eps 0.5 cannot place it, and 500 reports leave
    # the raw average's bias (0.65) only 2-5 standard errors from the others: the
    # choice moves away from it only partly.
    (ClassicalOGPM, 0.5, 500, 0.85),
    (BoundedLaplace, 2.0, 50_000, 0.5),    # regime 4: intervals at large N
    (TruncatedLaplace, 4.0, 200_000, 0.5),
    (PiecewiseMechanism, 0.5, 2000, 0.5),
], ids=lambda v: getattr(v, "__name__", str(v)))
def test_near_an_end_the_chosen_mean_beats_the_raw_average_and_its_interval_covers(
        make, epsilon, n, factor):
    options = {"compressed": True} if make is PiecewiseMechanism else {}
    mechanism = make(epsilon=epsilon, low=-1, high=1, **options)
    trials, covered, chosen, raw = 60, 0, [], []
    for seed in range(trials):
        rng = np.random.default_rng([seed, n, int(epsilon * 10)])
        x = gravity(rng, n)
        mean = summarise(mechanism, x, rng)["mean"]
        low, high = mean["ci95"]
        covered += low <= x.mean() <= high
        chosen.append(mean["estimate"] - x.mean())
        raw.append(mean["raw"] - x.mean())
    assert covered >= coverage_floor(trials)
    # The raw average is pulled towards the middle by 0.2-0.6 here.
    assert rms(chosen) < factor * rms(raw)


def test_data_near_an_ogpm_end_is_flagged_and_its_interval_allows_for_it():
    rng = np.random.default_rng(8)
    mechanism = ClassicalOGPM(epsilon=1.0, low=-1, high=1)
    x = gravity(rng, 20_000)
    mean = summarise(mechanism, x, rng)["mean"]
    assert "reports the same distribution" in mean["note"]
    lo, hi = mechanism.affine_mean()[2:]
    # Most of the data is in (hi, 1], which OGPM cannot tell apart: at least a
    # share of half that region's width goes into the bound.
    assert mean["bias_bound"] >= 0.5 * (1 - hi) / 2
    assert mean["ci95"][0] <= x.mean() <= mean["ci95"][1]
    clean = summarise(mechanism, spread(rng, 20_000) * 0.5, rng)["mean"]
    assert clean["note"] is None


@pytest.mark.parametrize(("name", "epsilon"), [("pm-c", 2.0), ("pm-c", 4.0), ("sw", 2.0),
                                               ("ptt", 0.5)])
def test_a_mechanism_without_flat_ends_adds_nothing_for_them_near_an_end(name, epsilon):
    """Mechanisms whose mean is affine over the whole domain, where rounding once made the
    affine region end a few 1e-16 short of it (the fast demo's accel_z, PM-C at eps 2, had
    its bias bound widened by the reconstruction's distance from the inversion)."""
    rng = np.random.default_rng([int(epsilon * 10), len(name)])
    mechanism = linear_mechanism(name, epsilon=epsilon, low=-1.0, high=3.0, grid_bits=16)
    edges = np.linspace(-1.0, 3.0, 51)
    model = LinearModel(mechanism, edges, edges, ems.transition_matrix(mechanism, edges, edges))
    assert model.flat_ends == []
    for x in (1.0 + 2.0 * gravity(rng, 20_000), 1.0 - 2.0 * gravity(rng, 20_000)):
        mean = summarise(mechanism, x, rng)["mean"]
        candidates = mean["candidates"]
        reference = candidates.get("inversion", candidates["raw"])["estimate"]
        assert mean["note"] is None
        assert mean["bias_bound"] == pytest.approx(
            abs(candidates[mean["method"]]["estimate"] - reference), abs=1e-12)


@pytest.mark.parametrize("offset", [0.0, 0.15])
@pytest.mark.parametrize("make", [ClassicalOGPM, PiecewiseMechanism])
def test_small_epsilon_near_the_middle_the_choice_is_not_worse_than_the_raw_average(make,
                                                                                    offset):
    """Regime 2: eps = 0.5 on a wide domain ([-2, 2] g) with the data at or near its
    middle, where removing the bias costs more variance than the bias it removes."""
    options = {"compressed": True} if make is PiecewiseMechanism else {}
    mechanism = make(epsilon=0.5, low=-2, high=2, **options)
    chosen, raw = [], []
    for seed in range(40):
        rng = np.random.default_rng([seed, 2])
        x = np.clip(rng.normal(offset, 0.4, 20_000), -2, 2)
        mean = summarise(mechanism, x, rng)["mean"]
        chosen.append(mean["estimate"] - x.mean())
        raw.append(mean["raw"] - x.mean())
    assert rms(chosen) <= rms(raw)


@pytest.mark.parametrize("make", [ClassicalOGPM, PiecewiseMechanism, SquareWave])
def test_with_clear_evidence_the_candidate_with_the_smallest_estimated_error_is_chosen(make):
    rng = np.random.default_rng(9)
    options = {} if make is ClassicalOGPM else {"compressed": True}
    mean = summarise(make(epsilon=1.0, low=-1, high=1, **options), bimodal(rng, 5000),
                     rng)["mean"]
    rmse = {name: c["rmse"] for name, c in mean["candidates"].items()}
    assert mean["method"] == min(rmse, key=rmse.get)
    assert mean["estimate"] == pytest.approx(mean["candidates"][mean["method"]]["estimate"])


def test_the_estimate_does_not_depend_on_how_the_reports_arrived():
    """A state always gives the same answer (the bootstrap is seeded from the counts)."""
    mechanism = BoundedLaplace(epsilon=2.0, low=-1, high=1)
    codes = mechanism.perturb_codes(gravity(np.random.default_rng(1), 4000),
                                    np.random.default_rng(2))
    views = []
    for parts in (1, 7):
        series = new_series(channel="c", kind="linear", description=protocol.describe(mechanism))
        for part in np.array_split(codes, parts):
            series.update(agent="a", t=0.0, codes=part)
        views.append(series.get()["mean"])
    assert views[0] == views[1]


# -- the histogram ------------------------------------------------------------------------------

@pytest.mark.parametrize("epsilon", [0.5, 2.0, 8.0])
@pytest.mark.parametrize("data", [gravity, bimodal, spread])
@pytest.mark.parametrize("make", [ClassicalOGPM, SquareWave])
def test_the_shown_histogram_is_not_worse_than_the_raw_one(epsilon, data, make):
    """Regime 3: EMS's fixed smoothing blurred sharp data at large eps; the chosen
    smoothing (or the raw histogram itself) is at least as close, on average."""
    options = {} if make is ClassicalOGPM else {"compressed": True}
    mechanism = make(epsilon=epsilon, low=-1, high=1, **options)
    shown, raw = [], []
    for seed in range(6):
        rng = np.random.default_rng([seed, int(epsilon * 10)])
        x = data(rng, 6000)
        histogram = summarise(mechanism, x, rng)["histogram"]
        truth = np.histogram(x, histogram["edges"])[0] / x.size
        shown.append(np.abs(np.array(histogram["estimate"]) - truth).sum())
        raw.append(np.abs(np.array(histogram["raw"]) - truth).sum())
    assert np.mean(shown) <= 1.02 * np.mean(raw)


def test_mean_quantiles_and_histogram_come_from_one_fit():
    """The polar radius showed mean 0.078 next to median 0.232 and a histogram whose
    mean was 0.273 (truth about 0.23): now the reconstruction's mean is the
    histogram's, the quantiles are the histogram's, and the chosen mean lies in the
    interval with them."""
    from edge_agent.mechanisms import PolarOGPM

    rng = np.random.default_rng(12)
    mechanism = PolarOGPM(epsilon=4.0, radius_max=2.0)  # the demo's accel_polar channel
    radius = np.clip(rng.gamma(4.0, 0.058, 8000), 0, 2)
    angle = rng.uniform(-math.pi, math.pi, 8000)
    series = new_series(channel="wind", kind="polar", description=protocol.describe(mechanism))
    series.update(agent="a", t=0.0, codes=mechanism.perturb_codes(radius, angle, rng))
    view = series.get()["radius"]
    edges, shown = np.array(view["histogram"]["edges"]), np.array(view["histogram"]["estimate"])
    centres = 0.5 * (edges[1:] + edges[:-1])
    assert view["mean"]["candidates"]["reconstruction"]["estimate"] == pytest.approx(
        shown @ centres)
    assert view["quantiles"] == ems.quantiles(edges, shown, [0.05, 0.25, 0.5, 0.75, 0.95])
    low, high = view["mean"]["ci95"]
    assert low <= radius.mean() <= high
    assert low <= shown @ centres <= high
    # eps_radius = 0.9 makes OGPM blind within 0.39 of 0, where all this data is: the
    # summary says so rather than showing a confident number.
    assert view["mean"]["note"] is not None


def test_model_placement_moves_only_what_the_mechanism_cannot_locate():
    mechanism = ClassicalOGPM(epsilon=1.0, low=-1, high=1)
    edges = np.linspace(-1, 1, 51)
    model = LinearModel(mechanism, edges, edges, ems.transition_matrix(mechanism, edges, edges))
    _, _, lo, hi = mechanism.affine_mean()
    p = np.zeros(50)
    p[25] = 0.5  # the middle: identifiable, stays
    p[np.searchsorted(edges, hi) - 1] = 0.5  # the bin where the upper flat region starts
    placed = model.placed(p)
    assert placed[25] == 0.5 and placed.sum() == pytest.approx(1.0)
    inside = model.centres > hi
    assert np.allclose(placed[inside], 0.5 / inside.sum())
    mass, bound = model.unidentifiable(p)
    assert mass == pytest.approx(0.5)
    assert bound == pytest.approx(0.5 * ((1 - hi) / 2 + 0.04))


@pytest.mark.parametrize("epsilon", [0.5, 2.0, 8.0])
@pytest.mark.parametrize("kappa", [0.5, 20.0])
def test_the_shown_circular_histogram_is_not_worse_than_the_raw_one(epsilon, kappa):
    from edge_agent.mechanisms import CircularOGPM

    mechanism = CircularOGPM(epsilon=epsilon, origin=-math.pi)
    shown, raw = [], []
    for seed in range(6):
        rng = np.random.default_rng([seed, int(epsilon * 10), int(kappa)])
        theta = rng.vonmises(1.0, kappa, 6000)
        histogram = summarise(mechanism, theta, rng, kind="circular")["histogram"]
        truth = np.histogram(theta, histogram["edges"])[0] / theta.size
        shown.append(np.abs(np.array(histogram["estimate"]) - truth).sum())
        raw.append(np.abs(np.array(histogram["raw"]) - truth).sum())
        assert histogram["method"] in ("raw", "reconstruction")
    assert np.mean(shown) <= 1.02 * np.mean(raw)


@pytest.mark.parametrize("name", ["pm-c", "sw-c", "pm", "ogpm-unbiased"])
def test_an_affine_mechanism_skips_the_maximum_likelihood_fit_with_the_same_estimates(name):
    """Where E[M(x)] is affine over the whole domain the inversion is (raw - b) / a for
    any fit: skipping the maximum-likelihood fit and its refits changes no number."""
    rng = np.random.default_rng(23)
    mechanism = linear_mechanism(name, epsilon=1.0, low=0.0, high=4.0, grid_bits=16)
    block = LinearBlock(describe(mechanism), 50)
    block.update(mechanism.perturb_codes(np.clip(rng.normal(0.5, 0.3, 3000), 0, 4), rng))
    shared = block.model()
    assert shared.affine_everywhere
    fitting = LinearModel(mechanism, shared.in_edges, shared.out_edges,
                          ems.transition_matrix(mechanism, shared.in_edges, shared.out_edges))
    fitting.affine_everywhere = False  # the general path: fit and refit the ML
    moments = block.moments.get()
    found = [linear_estimates(model, out_counts=block.out.get(), raw_mean=moments["mean"],
                              report_variance=moments["variance"], n=block.count.get())
             for model in (shared, fitting)]
    skipped, general = (f["mean"] for f in found)
    assert skipped["method"] == general["method"]
    for key in ("estimate", "stderr", "bias_bound"):
        assert math.isclose(skipped[key], general[key], rel_tol=1e-8, abs_tol=1e-12), key
    for name_, candidate in general["candidates"].items():
        assert math.isclose(skipped["candidates"][name_]["rmse"], candidate["rmse"],
                            rel_tol=1e-8, abs_tol=1e-12), name_
    assert np.allclose(found[0]["histogram"], found[1]["histogram"], rtol=0, atol=1e-12)


def test_only_a_mean_affine_over_the_whole_domain_skips_the_fit():
    for name, affine in (("ogpm", False), ("laplace", False), ("pm-c", True)):
        mechanism = linear_mechanism(name, epsilon=1.0, low=0.0, high=4.0, grid_bits=16)
        edges = np.linspace(0.0, 4.0, 21)
        model = LinearModel(mechanism, edges, edges,
                            ems.transition_matrix(mechanism, edges, edges))
        assert model.affine_everywhere is affine, name


def test_a_window_that_hears_from_a_few_wearers_of_a_spread_fleet_covers_the_fleets_mean():
    """Population division on a small fleet: each window hears from 17 random wearers of
    300 whose values are bimodal (resting near 0.1, running near 0.7 of [0, 1]).  The
    interval, from the reports' own variance and Student's t on 16 degrees of freedom,
    covers the fleet's mean (1,500 windows: at 95% below 0.93 with probability < 1e-4)."""
    rng = np.random.default_rng(12)
    fleet = np.where(rng.random(300) < 0.7, rng.normal(0.1, 0.03, 300),
                     rng.normal(0.7, 0.08, 300)).clip(0, 1)
    mechanism = linear_mechanism("pm-c", epsilon=8.0, low=0.0, high=1.0, grid_bits=12)
    source = as_random_source(rng)
    hits = []
    for _ in range(1500):
        sample = fleet[rng.permutation(fleet.size)[:17]]
        block = LinearBlock(describe(mechanism), 50)
        block.update(mechanism.perturb_codes(sample, source))
        low, high = block.get()["mean"]["ci95"]
        hits.append(low <= fleet.mean() <= high)
    assert np.mean(hits) > 0.93, np.mean(hits)


def test_the_evidences_spread_leaves_out_only_a_replicate_far_outside_the_others():
    """Normal replicates: the sample standard deviation in all but about 1% of 2,000 sets
    of 30 (the median absolute deviation of 30 errs, so a point now and then lands beyond
    5 of its robust standard deviations: 15 of 2,000 with this seed); one replicate 8
    standard deviations out: left out, where it would widen the standard deviation."""
    rng = np.random.default_rng(17)
    same = sum(_robust_spread(values) == np.std(values, ddof=1)
               for values in rng.normal(size=(2000, 30)))
    assert same >= 1960
    values = rng.normal(size=30)
    spread = np.std(values, ddof=1)
    values[0] = np.median(values) + 8 * 1.4826 * np.median(np.abs(values - np.median(values)))
    assert _robust_spread(values) == np.std(values[1:], ddof=1)
    assert np.std(values, ddof=1) > 1.5 * spread
    assert _robust_spread(np.ones(30)) == 0.0


@pytest.mark.parametrize("make", [ClassicalOGPM, PiecewiseMechanism])
def test_the_spread_a_planner_reads_errs_wide_and_is_close_for_a_wide_fleet(make):
    """The readings' standard deviation (``spread``: the reconstruction's, with its
    bootstrap interval) as ``plan_spread = "auto"`` reads it, upper end first: at least
    nearly the truth for narrow and wide fleets alike (the smoothing widens a fleet a few
    bins wide, which plans more reports than needed, never fewer), and close where the
    fleet is much wider than a bin."""
    options = {"compressed": True} if make is PiecewiseMechanism else {}
    mechanism = make(epsilon=2.0, low=-1, high=1, **options)
    for sigma, centre in ((0.05, 0.0), (0.15, 0.3), (0.4, 0.0)):
        ratios = []
        for seed in range(8):
            rng = np.random.default_rng([seed, int(100 * sigma)])
            x = np.clip(rng.normal(centre, sigma, 20_000), -1, 1)
            spread = summarise(mechanism, x, rng)["spread"]
            low, high = spread["ci95"]
            assert 0.0 <= low <= spread["estimate"] <= high
            assert high >= 0.95 * x.std(), (sigma, seed, spread, x.std())
            ratios.append(spread["estimate"] / x.std())
        assert max(ratios) < 3.0, (sigma, ratios)
        if sigma == 0.4:
            assert 0.93 < min(ratios) and max(ratios) < 1.07, ratios
