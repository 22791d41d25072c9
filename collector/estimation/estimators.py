"""A linear channel's mean and histogram, chosen by estimated error (the math only:
``collector.aggregation.series`` feeds it sums and serves the result).

The mean's candidates, all computed from the same reports:

* ``raw``: the average of the reports.  Unbiased where the mechanism is
  (OGPM-U, PTT, II-PTT, Duchi); otherwise pulled towards the middle of the domain, which
  costs nothing when the data sits there and a lot when it does not.
* ``inversion``: the raw average with the mechanism's bias removed.  Where
  E[M(x)] = a x + b (PM, SW, their compressed forms, OGPM away from its ends)
  this is (raw - b) / a exactly; elsewhere one Newton step on E[M(x)] from the
  maximum-likelihood reconstruction (the Laplace variants, OGPM near an end).
  It is the reference: unbiased wherever the mechanism lets any estimator be.
* ``reconstruction``: the mean of the displayed histogram (the EM
  reconstruction, or the raw histogram where that is closer), so the mean, the
  quantiles and the histogram agree.

Each candidate's mean squared error is estimated as its variance plus its
squared bias, the bias measured against the inversion and corrected for the
noise in that measurement (E[d^2] = bias^2 + Var d, so d^2 - Var d is unbiased
for bias^2).  Variances come from a bootstrap over the reports: the output-bin
counts are resampled (multinomial) and the raw average moves with them, so
every candidate's replicate is computed from the same resample and their
covariances are kept.  The smoothed fit is not refitted to each resample: it
moves by its linear response to the resample within the step budget a refit
would have (the delta method, ``ems.fit_response``; without the budget the
response is several times too wide where the likelihood is nearly flat).  The
maximum-likelihood fit (projected Newton steps, ``ems.maximum_likelihood``) is
refitted, in a few steps from the full fit, and only where it has mass where
E[M(x)] is not affine, the only mass the inversion depends on.

The raw average is the default, and the others replace it only on evidence.
No estimator is better than the raw average for every distribution of the data
(it is a fixed shrinkage towards the middle, which is admissible), and where
the data sits near the middle at small eps the bias-free estimators have 5-10
times its variance: picking one of them on a chance fluctuation there costs
far more than it can save (measured on real recordings: 2-5 times the raw
average's error when the smallest estimated error always won).  So the
evidence that the raw average is biased is each other estimate's distance
from it in that distance's standard errors (of the resamples, without any far
outside the others), the smaller of the two (the
reconstruction's spread is understated with few reports at small eps, the
inversion's is not); below SHRINK_FROM the raw average stays, from SHRINK_TO
on the other candidate with the smallest estimated error replaces it, and in
between the estimate moves from one to the other in proportion
(``shrinkage``).  docs/benchmarks/BENCHMARKS.md shows how it does.

The 95% interval is estimate +- (t sd + bias bound), clipped to the domain, with
t Student's 97.5% quantile on n - 1 degrees of freedom (1.96 beyond 1,000 reports:
sd is estimated from the reports themselves, and with population division a window
may hear from a few dozen wearers), sd the inversion's standard error and the bias bound the chosen
estimate's distance from the inversion plus what no estimator can know:
classical OGPM reports the same distribution for every x within C of an end
(Theorem 3.7), so the data's position inside those regions is unidentifiable
(``LinearModel.placed`` puts it in the middle, and the bound allows half the
region's width for it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import numpy as np
from scipy import special

from collector.estimation import ems
from edge_agent.mechanisms import Mechanism

Z95 = 1.959963984540054
BOOTSTRAP_REPLICATES = 30
# A bootstrap refit of the smoothed fit starts from the full fit and takes this many
# accelerated steps; ``_refits`` gives what such refits give from the fit's response within
# that budget (``ems.fit_response``'s 1,024 plain steps move as far), and refits only where
# no response exists.
REFIT_STEPS = 60
# Mass of the maximum-likelihood fit where E[M(x)] is not affine moves the inversion by
# at most a small multiple of that mass times (high - low) / a, and the inversion's standard
# error is at least sqrt(report variance / n) / a: below NEGLIGIBLE_SHARE of that error in
# the first bound (and below NEGLIGIBLE_MASS whatever it is) the mass cannot matter, and
# the fit is not refitted to the resamples.
NEGLIGIBLE_SHARE = 1e-3
NEGLIGIBLE_MASS = 1e-9
# The raw average is kept until both other estimates are SHRINK_FROM standard errors of
# their distance from it away, then shrunk towards the better of them, entirely from
# SHRINK_TO on (see _choose_mean).
SHRINK_FROM, SHRINK_TO = 3.0, 5.0
# A replicate this many robust standard deviations from the others' median is left out
# of the spread the evidence against the raw average is measured in (``_robust_spread``).
OUTLYING = 5.0
# Resamples that measure a circular reconstruction's spread (it needs no mean).
CIRCULAR_REFITS = 12
# The fits join output bins beyond this many per input bin (see LinearModel).
OUTPUT_BINS_PER_INPUT_BIN = 2
# Say so in the summary when more than this share of the data is unidentifiable.
NOTE_SHARE = 0.05


@dataclass(eq=False)
class LinearModel:
    """What stays fixed for one mechanism and one set of bins."""

    mechanism: Mechanism
    in_edges: np.ndarray
    out_edges: np.ndarray
    matrix: np.ndarray  # M[j, i] = P(report in out bin j | true value in in bin i)
    centres: np.ndarray = field(init=False)
    out_centres: np.ndarray = field(init=False)
    mean_output: np.ndarray = field(init=False)  # E[M(x)] at the centres
    mean_slope: np.ndarray = field(init=False)  # its derivative there

    def __post_init__(self):
        m = self.mechanism
        centres = 0.5 * (self.in_edges[:-1] + self.in_edges[1:])
        out_centres = 0.5 * (self.out_edges[:-1] + self.out_edges[1:])
        if m.name == "duchi":  # two atoms, one per output "bin"
            out_centres = np.array([m.output_low, m.output_high])
        h = 1e-4 * (m.high - m.low)
        slope = (m.mean_output(centres + h) - m.mean_output(centres - h)) / (2 * h)
        self.centres, self.out_centres = centres, out_centres
        self.mean_output, self.mean_slope = m.mean_output(centres), slope
        # Enlarged output domains (PM, SW, OGPM-U at small eps: up to 17 times the input
        # domain) make hundreds of output bins and EM slow; the fits join neighbouring
        # output bins so that there are at most OUTPUT_BINS_PER_INPUT_BIN per input bin.
        # (Only the fits: the kept counts, and so every saved state, stay as they are.)
        k_out, k_in = self.matrix.shape
        self.joined = None
        if k_out > OUTPUT_BINS_PER_INPUT_BIN * k_in:
            group = math.ceil(k_out / (OUTPUT_BINS_PER_INPUT_BIN * k_in))
            self.joined = np.arange(0, k_out, group)
            sizes = np.diff(np.append(self.joined, k_out))
            self.matrix = np.add.reduceat(self.matrix, self.joined, axis=0)
            self.out_centres = np.add.reduceat(out_centres, self.joined) / sizes

    def fit_counts(self, out_counts: np.ndarray) -> np.ndarray:
        """The output-bin counts as the fits see them (joined like ``matrix``)."""
        counts = np.asarray(out_counts, dtype=np.int64)
        return counts if self.joined is None else np.add.reduceat(counts, self.joined)

    @property
    def raw_is_a_histogram(self) -> bool:
        """Whether the reports' own histogram is over the input bins (the output
        domain is the input domain), so it can stand for the data's."""
        return self.out_edges.shape == self.in_edges.shape and bool(
            np.allclose(self.out_edges, self.in_edges))

    def inversion(self, p: np.ndarray, raw):
        """(estimate, slope): the raw mean inverted through E[M(x)] by one Newton step
        from the reconstruction p; exactly (raw - b) / a where p lies where E[M(x)] is
        affine, and exactly the raw mean for an unbiased mechanism.  Also for many at
        once: p of shape (..., bins) with raw of shape (...)."""
        # Shifting the values that E[M(x)] responds to by d moves the mean by (their
        # mass) d and E[M] by (p @ slope) d: the step divides by their average slope.
        # (Mass where E[M(x)] is flat cannot move it; ``placed`` has put it.)  A fit with
        # no mass where E[M(x)] responds (the maximum likelihood can put all of it in a
        # flat end) gives no average: the values that could move are then the nearest
        # the mass, at the slope E[M(x)] has where it responds.
        responds = self.mean_slope > 0
        movable = p[..., responds].sum(axis=-1)
        slope = np.where(movable > 1e-12, (p @ self.mean_slope) / np.maximum(movable, 1e-12),
                         self.responding_slope)
        slope = np.maximum(slope, 1e-3)
        return p @ self.centres + (raw - p @ self.mean_output) / slope, slope

    @cached_property
    def responding_slope(self) -> float:
        """The average slope of E[M(x)] over the bins where it responds to x."""
        responds = self.mean_slope > 0
        return float(self.mean_slope[responds].mean()) if responds.any() else 1e-3

    @cached_property
    def affine_everywhere(self) -> bool:
        """Whether E[M(x)] = a x + b over the whole domain (PM, SW, their compressed
        forms, the unbiased mechanisms): the inversion is then (raw - b) / a whatever
        the fit, and needs no maximum-likelihood fit at all."""
        return not self.outside_affine.any()

    @cached_property
    def outside_affine(self) -> np.ndarray:
        """The input bins reaching where E[M(x)] is not affine (all of them for the
        Laplace variants, none for PM, SW, their compressed forms)."""
        affine, m = self.mechanism.affine_mean(), self.mechanism
        if affine is None:
            return np.ones(self.centres.size, dtype=bool)
        slack = 1e-9 * (m.high - m.low)  # the region's ends are computed, not given
        return (self.in_edges[:-1] < affine[2] - slack) | (self.in_edges[1:] > affine[3] + slack)

    @cached_property
    def flat_ends(self) -> list[tuple[np.ndarray, np.ndarray, float]]:
        """Per end where E[M(x)] is flat (classical OGPM, Theorem 3.7): the input bins a
        fit cannot tell from that region (every bin reaching into it), the bins inside
        it, and how far a value placed at its middle can be from the truth."""
        affine = self.mechanism.affine_mean()
        if affine is None:
            return []
        m, (_, _, lo, hi) = self.mechanism, affine
        left, right = self.in_edges[:-1], self.in_edges[1:]
        width = float(right[0] - left[0])
        ends = []
        for touching, inside, span in ((left < lo, right <= lo, lo - m.low),
                                       (right > hi, left >= hi, m.high - hi)):
            if span <= 0:
                continue
            # A region narrower than a bin holds no whole bin to spread its mass over:
            # the fit's mass stays where it is, at most the region's width from the truth.
            ends.append((touching, inside, span / 2 + width if inside.any() else span))
        return ends

    def placed(self, p: np.ndarray) -> np.ndarray:
        """p with the mass it cannot locate spread evenly over the region it may be in.

        Inside a flat region every value gives the same reports, so a fit puts that
        mass anywhere there, or in the bin where the region ends; its middle is the
        choice whose error is smallest in the worst case.  Also for many at once (p of
        shape (..., bins))."""
        if not self.flat_ends:
            return p
        p = p.copy()
        for touching, inside, _ in self.flat_ends:
            if not inside.any():
                continue
            mass = p[..., touching].sum(axis=-1, keepdims=True)
            p[..., touching] = 0.0
            p[..., inside] = mass / np.count_nonzero(inside)
        return p

    def unidentifiable(self, p: np.ndarray) -> tuple[float, float]:
        """(mass, bias bound): how much of p the mechanism cannot locate, and how far
        that can move the mean (``placed`` puts it in the middle of its region)."""
        mass = bound = 0.0
        for touching, _, reach in self.flat_ends:
            share = float(p[touching].sum())
            mass += share
            bound += share * reach
        return mass, bound


@dataclass
class _Fits:
    """Fits of one set of reports, or of many (the resamples: one row each): the raw
    average, the maximum likelihood and the displayed histogram."""

    raw: float | np.ndarray
    ml: np.ndarray
    shown: np.ndarray

    def candidates(self, model: LinearModel) -> dict:
        out = {"raw": self.raw, "reconstruction": self.shown @ model.centres}
        if not model.mechanism.unbiased:
            out["inversion"] = model.inversion(self.ml, self.raw)[0]
        return out


def _seed(counts: np.ndarray) -> np.random.Generator:
    """Randomness for the bootstrap and the cross-validation, from the counts: a given
    state always gives the same answer."""
    return np.random.default_rng(np.frombuffer(np.ascontiguousarray(counts, np.int64).tobytes(),
                                               dtype=np.uint32))


def linear_estimates(model: LinearModel, *, out_counts: np.ndarray, raw_mean: float,
                     report_variance: float, n: int) -> dict:
    """The mean (with its candidates and interval) and the histogram to show.

    ``out_counts``: reports per output bin; ``raw_mean`` and ``report_variance``:
    the reports' exact mean and variance (from sums of codes); ``n`` reports."""
    rng = _seed(out_counts)
    counts = model.fit_counts(out_counts)
    smoothing = ems.choose_smoothing(counts, model.matrix, seed=int(rng.integers(2**32)))
    fitted = ems.reconstruct(counts, model.matrix, smoothing=smoothing)
    # The maximum-likelihood fit serves the inversion only; where E[M(x)] is affine
    # everywhere the inversion does not depend on the fit (any fit gives (raw - b) / a),
    # so neither it nor its refits are computed (a third of the work, same estimates).
    # Nor is it taken further, nor do its replicates move, where it has (next to) no mass
    # where E[M(x)] is not affine: the inversion is then (raw - b) / a, whatever the rest
    # of the fit, to within that mass.
    fit_ml = not model.affine_everywhere
    m = model.mechanism
    negligible = max(NEGLIGIBLE_MASS, NEGLIGIBLE_SHARE * math.sqrt(report_variance / n)
                     / (m.high - m.low))
    unplaced = ems.maximum_likelihood(counts, model.matrix, start=fitted) if fit_ml else fitted
    ml = model.placed(unplaced)
    ml_moves = fit_ml and float(ml[model.outside_affine].sum()) >= negligible
    # One resample a row (the same draws as one call per resample, in one call).
    resampled = rng.multinomial(n, counts / n, size=BOOTSTRAP_REPLICATES)
    refits = _refits(counts, model.matrix, fitted, smoothing, resampled)
    # The raw mean moves with the resample (each report at its bin's centre).
    raw_star = raw_mean + (resampled - counts) @ model.out_centres / n
    # The maximum likelihood is refitted to each resample on its own support (a few Newton
    # steps each from the fit; the bins it leaves at 0 stay there, as EM's steps from it
    # keep them).  Refitted on every bin, resamples of data in the middle moved up to 5%
    # of their mass into a flat end, and the inversion's spread with it: 2026-12-05, the
    # estimators' tests of OGPM near an end at eps 0.5 erred 9% more.  Its linear response
    # from its observed information on its support (H_FF dp_F = A_F dw, exact to second
    # order) moved the inversion up to 80 times as far as these refits next to a flat end,
    # where the data say little about the mass on bins whose reports differ little from
    # the flat region's (the scale benchmark's data).
    ml_star = model.placed(ems.maximum_likelihood(resampled, model.matrix, start=unplaced,
                                                  on_support=True)) \
        if ml_moves else np.broadcast_to(ml, refits.shape)
    shown, method = _raw_or_fit(counts, model.matrix, fitted, smoothing, refits,
                                raw_is_a_histogram=model.raw_is_a_histogram)
    fits = _Fits(raw_mean, ml, shown)
    boots = _Fits(raw_star, ml_star, resampled / n if method == "raw" else refits)
    mean = _choose_mean(model, fits, boots, report_variance, n)
    return {"mean": mean, "histogram": shown, "histogram_method": method,
            "smoothing": smoothing, "spread": _spread(model, fitted, refits)}


def _standard_deviations(edges: np.ndarray, p: np.ndarray) -> np.ndarray:
    """The standard deviation of each row of bin probabilities ``p`` (readings spread
    evenly within a bin)."""
    centres, widths = 0.5 * (edges[:-1] + edges[1:]), np.diff(edges)
    p = np.atleast_2d(p) / np.atleast_2d(p).sum(axis=1, keepdims=True)
    mean = p @ centres
    variance = p @ (centres ** 2 + widths ** 2 / 12.0) - mean ** 2
    return np.sqrt(np.maximum(variance, 0.0))


def _spread(model: LinearModel, fitted: np.ndarray, refits: np.ndarray) -> dict:
    """How widely the readings spread: the standard deviation of the reconstruction,
    with a 95% interval from its bootstrap refits' (normal: 30 replicates are too few
    for percentiles), cut at 0.  What a planner needs of a fleet (``plan_spread =
    "auto"``, which reads the upper end), not a precise statistic: the smoothing widens a
    fleet about a bin wide up to 2-3 times (more reports planned than needed, never
    fewer), and its interval holds only the sampling error; within 5% of the truth for a
    fleet ten bins wide (tests/collector/estimation/test_estimators.py)."""
    estimate = float(_standard_deviations(model.in_edges, fitted)[0])
    half = Z95 * float(np.std(_standard_deviations(model.in_edges, refits), ddof=1))
    return {"estimate": estimate, "ci95": (max(0.0, estimate - half), estimate + half)}


def _refits(counts: np.ndarray, matrix: np.ndarray, fit: np.ndarray, smoothing: float,
            resampled: np.ndarray, *, circular: bool = False) -> np.ndarray:
    """The fit of each resample (a row of ``resampled``), as a refit from ``fit`` within
    the collector's step budget would give it: ``fit`` moved by its linear response to
    the resample within that budget (``ems.fit_response``: ten 50 x 50 matrix products
    instead of a refit per resample), or refitted where no response exists.  The spread
    of the means they give matches the refits' (smoothed fits: 0.77-1.32 times it over
    96 cells, median 1.00, on 30 resamples whose own noise is about 13%), where the
    response without a budget is up to 6 times too wide (docs/benchmarks/BENCHMARKS.md)."""
    response = ems.fit_response(counts, matrix, fit, smoothing=smoothing, circular=circular)
    if response is None:  # plain steps leave the fit (0.2% of smoothed fits, measured)
        return _refit_each(matrix, fit, smoothing, resampled, circular=circular)
    # Not clipped at 0: the replicates serve spreads (of the mean, and in L1), which a
    # clip would bias where the fit is near 0 (sharp fits, few reports; measured: the
    # mean up to 33% worse in the accuracy benchmark's cells at N = 500, eps = 4-8).
    return fit + ((resampled - counts) / counts.sum()) @ response.T


def _refit_each(matrix: np.ndarray, fit: np.ndarray, smoothing: float, resampled: np.ndarray,
                *, circular: bool = False) -> np.ndarray:
    """Each resample's fit, refitted from ``fit`` within REFIT_STEPS accelerated steps."""
    return np.array([ems.reconstruct(one, matrix, smoothing=smoothing, circular=circular,
                                     start=fit, max_steps=REFIT_STEPS, polish=False)
                     for one in resampled])


def _raw_or_fit(counts: np.ndarray, matrix: np.ndarray, fitted: np.ndarray, smoothing: float,
                refits: np.ndarray, *, raw_is_a_histogram: bool,
                circular: bool = False) -> tuple[np.ndarray, str]:
    """The histogram to show: the reconstruction, or the raw one where its blur is
    smaller than the reconstruction's spread over the resamples (``refits``).  The blur,
    M p - p, is measured on the smoothest fit (EMS): a sharper one carries its own
    noise into it."""
    if not raw_is_a_histogram:
        return fitted, "reconstruction"
    smooth = fitted if smoothing == 1.0 else ems.reconstruct(counts, matrix, circular=circular)
    blur = float(np.abs(matrix @ smooth - smooth).sum())
    spread = float(np.abs(refits - fitted).sum(axis=1).mean())
    if blur < spread:
        return counts / counts.sum(), "raw"
    return fitted, "reconstruction"


def circular_histogram(counts, matrix: np.ndarray) -> dict:
    """A circular channel's histogram (its output bins are its input bins): the
    reconstruction with smoothing chosen from the data, or the raw histogram."""
    rng = _seed(counts)
    counts = np.asarray(counts, dtype=np.int64)
    n = int(counts.sum())
    smoothing = ems.choose_smoothing(counts, matrix, circular=True,
                                     seed=int(rng.integers(2**32)))
    fitted = ems.reconstruct(counts, matrix, smoothing=smoothing, circular=True)
    refits = _refits(counts, matrix, fitted, smoothing,
                     rng.multinomial(n, counts / n, size=CIRCULAR_REFITS),
                     circular=True)
    shown, method = _raw_or_fit(counts, matrix, fitted, smoothing, refits,
                                raw_is_a_histogram=True, circular=True)
    return {"estimate": shown, "method": method, "smoothing": smoothing}


@lru_cache(maxsize=1024)
def student95(degrees: int) -> float:
    # scipy.special's inverse of Student's t, not scipy.stats's: importing scipy.stats
    # loads much of scipy (about 47 MB in the collector and in each estimate worker).
    return float(special.stdtrit(degrees, 0.975))


def quantile95(n: int) -> float:
    """The two-sided 95% quantile for a mean over ``n`` reports whose variance is
    estimated from them: Student's t with n - 1 degrees of freedom (the normal's beyond
    a thousand, where they differ by less than 0.1%)."""
    return student95(n - 1) if 1 < n <= 1000 else Z95


def _robust_spread(values: np.ndarray) -> float:
    """The standard deviation of ``values`` without those more than OUTLYING robust
    standard deviations (1.4826 median absolute deviations) from their median: a resample
    whose maximum-likelihood fit moves to another configuration of its few support points
    (Bounded Laplace near an end: one of 30 moved the inversion eight standard deviations)
    would widen it, and weaken the evidence, for no change in what the others show.  Of
    normal replicates none is left out (the median absolute deviation alone, 2.7 times as
    noisy, made centred cells of the accuracy benchmark up to 1.6 times worse, 2026-12-05)."""
    values = np.asarray(values, dtype=np.float64)
    centre = float(np.median(values))
    scale = 1.4826 * float(np.median(np.abs(values - centre)))
    kept = values[np.abs(values - centre) <= OUTLYING * scale] if scale > 0 else values
    return float(np.std(kept if kept.size > 2 else values, ddof=1))


def _choose_mean(model: LinearModel, fits: _Fits, boots: _Fits, report_variance: float,
                 n: int) -> dict:
    m = model.mechanism
    estimates = {name: float(value) for name, value in fits.candidates(model).items()}
    replicate = boots.candidates(model)
    reference = "raw" if m.unbiased else "inversion"
    slope = 1.0 if m.unbiased else float(model.inversion(fits.ml, fits.raw)[1])
    # The reference's variance: for an unbiased mechanism the raw average's, exactly; else
    # the bootstrap's, or the exact report variance carried through the slope if larger
    # (the bootstrap places reports at bin centres).
    ref_var = report_variance / n if m.unbiased else max(
        float(np.var(replicate[reference], ddof=1)), report_variance / n / slope**2)

    def mse(name: str) -> float:
        """Variance plus squared bias, the bias measured against the reference less the
        noise of that measurement (E[d^2] = bias^2 + Var d)."""
        if name == reference:
            return ref_var
        gap = estimates[name] - estimates[reference]
        gap_var = float(np.var(replicate[name] - replicate[reference], ddof=1))
        return float(np.var(replicate[name], ddof=1)) + max(0.0, gap * gap - gap_var)

    errors = {name: mse(name) for name in estimates}
    # From the raw average towards the better of the others, as the evidence that the
    # raw average is biased grows: each other estimate's distance from it, in its own
    # standard errors; both must show it (the reconstruction's spread is understated
    # when reports are few and eps small, the inversion's is not).
    raw, toward = estimates["raw"], min((name for name in estimates if name != "raw"),
                                        key=errors.get, default="raw")
    weight = 0.0
    if not m.unbiased:
        evidence = min(abs(raw - estimates[name]) / max(_robust_spread(
            replicate["raw"] - replicate[name]), 1e-300)
            for name in estimates if name != "raw")
        weight = float(np.clip((evidence - SHRINK_FROM) / (SHRINK_TO - SHRINK_FROM), 0, 1))
    if 0.0 < weight < 1.0:
        estimates["shrinkage"] = raw + weight * (estimates[toward] - raw)
        replicate["shrinkage"] = replicate["raw"] + weight * (replicate[toward]
                                                             - replicate["raw"])
        errors["shrinkage"] = mse("shrinkage")
    chosen = "raw" if weight == 0.0 else toward if weight == 1.0 else "shrinkage"
    if m.unbiased and errors[toward] < errors["raw"]:
        # The raw average is unbiased, but the reconstruction, which knows that readings
        # lie in the domain, can err less where reports are few and noisy (its variance
        # is smaller; its bias is measured against the raw average as above): the one of
        # least estimated error.  The interval below still holds the raw average's.
        chosen = toward
    mass, bias = model.unidentifiable(fits.ml)
    if model.flat_ends:
        # Next to a flat region the reports change only slowly with x, so a fit can
        # move mass between the region and its neighbourhood almost freely; the
        # smoothed and the maximum-likelihood fits then disagree, and their
        # disagreement counts as possible bias too.
        bias += abs(estimates["reconstruction"] - estimates[reference])
    # The interval: the reference's, widened by the chosen estimate's distance from it,
    # so that estimate +- (1.96 stderr + bias bound) holds the reference's interval.
    sd = math.sqrt(ref_var)
    # The variance is the reports' own (sample variance, or the bootstrap's), so a few
    # reports take Student's t quantile rather than the normal's: with population division
    # a window of a small fleet hears from a few dozen wearers (bench_stream: 17 reports
    # a slot covered 93% with 1.96 on a skewed signal).
    z = quantile95(n)
    unknowable = bias
    bias += abs(estimates[chosen] - estimates[reference])
    estimate = float(np.clip(estimates[chosen], m.low, m.high))  # the truth is in the domain
    half = z * sd + bias
    note = None
    if mass > NOTE_SHARE:
        note = (f"{mass:.0%} of the data lies where {m.name} at epsilon {m.epsilon:g} "
                f"reports the same distribution for every value (near an end of "
                f"[{m.low:g}, {m.high:g}]); the interval allows {unknowable:.3g} for where it is "
                f"there (docs/reference/API.md, 'Data near an end')")
    return {"raw": fits.raw, "estimate": estimate, "stderr": sd, "bias_bound": bias,
            "ci95": [max(m.low, estimate - half), min(m.high, estimate + half)],
            "method": chosen,
            "candidates": {name: {"estimate": value, "rmse": math.sqrt(errors[name])}
                           for name, value in estimates.items()},
            "note": note}
