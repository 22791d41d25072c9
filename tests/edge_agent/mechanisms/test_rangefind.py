"""Range discovery logic: exact randomized response, the paper's parameters, the search."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from edge_agent.mechanisms.randomized_response import RandomizedResponse
from edge_agent.mechanisms.rangefind import (
    CONFIDENCE,
    RangeSearch,
    assess,
    assigned_round,
    pair_conflict,
    plan_search,
    share_interval,
    simulate,
    true_answer,
    uninformed_reason,
)

ALPHA = 1e-6


# -- randomized response ----------------------------------------------------------------
@pytest.mark.parametrize("epsilon", [0.01, 0.1, 0.25, 1.0, 2.5, 4.0, 10.0, 20.0])
def test_rr_privacy_is_exact_and_tight(epsilon):
    rr = RandomizedResponse(epsilon=epsilon)
    loss = rr.exact_privacy_loss()
    assert loss.at_most(epsilon)
    # one more unit of flip weight moved to keep would break the bound: the weights are tight
    assert not (type(loss)(Fraction(rr.keep_weight + 1, rr.flip_weight - 1)).at_most(epsilon))
    # the ratio of the two pmfs for either answer is exactly the loss
    for answer in (-1, 1):
        ratio = rr.pmf(answer, answer) / rr.pmf(answer, -answer)
        assert max(ratio, 1 / ratio) == loss.ratio
    ideal = math.exp(epsilon) / (1 + math.exp(epsilon))
    assert float(rr.keep_probability) == pytest.approx(ideal, rel=1e-14)


def test_rr_rejects_bad_parameters():
    with pytest.raises(TypeError):
        RandomizedResponse(epsilon="1")
    with pytest.raises(ValueError, match=r"epsilon: must be in \[1e-09, 20\], got 0"):
        RandomizedResponse(epsilon=0)
    with pytest.raises(ValueError, match=r"epsilon: must be in \[1e-09, 20\], got 1e-12"):
        RandomizedResponse(epsilon=1e-12)
    with pytest.raises(ValueError, match="only -1 and"):
        RandomizedResponse(epsilon=1).respond(np.array([0, 1]))


@pytest.mark.parametrize("epsilon", [0.2, 1.0, 3.0])
def test_rr_flip_rate_matches_the_exact_probability(epsilon):
    """Binomial test at alpha = 1e-6, with power against a 10% wrong epsilon."""
    rr = RandomizedResponse(epsilon=epsilon)
    n = 400_000
    answers = rr.respond(np.ones(n, dtype=np.int8), np.random.default_rng(int(epsilon * 10)))
    kept = int((answers == 1).sum())
    p = float(rr.keep_probability)
    assert stats.binomtest(kept, n, p).pvalue > ALPHA
    wrong = RandomizedResponse(epsilon=epsilon * 1.1).keep_probability
    assert stats.binomtest(kept, n, float(wrong)).pvalue < ALPHA
    # and the unbiased estimate of the share below recovers 1
    assert rr.estimate_share_below(int(answers.sum(dtype=np.int64)), n) == pytest.approx(
        1.0, abs=5 * math.sqrt(rr.estimate_variance(n)))


def test_rr_debias_factor_is_the_papers_for_the_ideal_probability():
    rr = RandomizedResponse(epsilon=1.0)
    e = math.exp(1.0)
    assert rr.debias_factor == pytest.approx((e + 1) / (e - 1), rel=1e-12)


# -- parameters (Section 6.1, Corollaries 1 and 2) --------------------------------------
@pytest.mark.parametrize("n", [256, 1000, 4096, 16384])
def test_plan_follows_the_corollaries(n):
    unknown = plan_search(participants=n, epsilon=1.0)
    assert unknown.rounds == math.ceil(math.log2(n) ** 2 / (2 * math.log2(1000)))
    assert unknown.h == pytest.approx(math.log(n) ** 2 / (2 * math.log(1000)))
    known = plan_search(participants=n, epsilon=1.0, alpha_min=1.0)
    assert known.rounds == math.ceil(math.log2(n) / 2)
    assert known.h == pytest.approx(math.log(n) / 2)
    e = math.exp(1.0 / unknown.rounds)
    assert unknown.gamma(n) == pytest.approx(
        math.sqrt(4 * e * (1 + e) * unknown.h / ((e - 1) ** 2 * n)))
    split = plan_search(participants=n, epsilon=1.0, strategy="split")
    assert split.answer_epsilon == 1.0 and split.answers_per_agent == 1
    assert unknown.answer_epsilon * unknown.answers_per_agent == pytest.approx(1.0)


def test_plan_validation_names_the_parameter():
    with pytest.raises(ValueError, match="strategy: must be one of sequential, split"):
        plan_search(participants=10, epsilon=1.0, strategy="parallel")
    with pytest.raises(ValueError, match=r"rounds: must be in \[1, 64\]"):
        plan_search(participants=10, epsilon=1.0, rounds=0)
    with pytest.raises(ValueError, match="participants"):
        plan_search(participants=0, epsilon=1.0)
    with pytest.raises(TypeError):
        plan_search(participants=10.0, epsilon=1.0)


def test_split_assignment_is_deterministic_and_balanced():
    rounds = 8
    agents = [f"w{i}" for i in range(16_000)]
    first = [assigned_round("run-1", a, rounds) for a in agents]
    assert first == [assigned_round("run-1", a, rounds) for a in agents]
    counts = np.bincount(first, minlength=rounds)
    assert stats.chisquare(counts).pvalue > ALPHA
    other = [assigned_round("run-2", a, rounds) for a in agents]
    assert np.mean(np.array(first) == np.array(other)) < 0.2  # a new run reshuffles


# -- the search ---------------------------------------------------------------------------
def test_with_expected_answers_the_search_is_algorithm_1():
    """Fed the expected answer sums, Phi' is the exact share below and the search is exact."""
    values = np.array([0.137, 0.5, 0.9])
    plan = plan_search(participants=3, epsilon=1.0, rounds=20, h=1e-12)
    for side, truth in (("min", 0.137), ("max", 0.9)):
        search = RangeSearch(low=-1, high=1, side=side, plan=plan)
        while not search.done:
            signs = [true_answer(v, search.threshold(), side) for v in values]
            expected_sum = sum(signs) / search.mechanism.debias_factor
            record = search.decide(expected_sum, len(values))
            assert record["phi"] == pytest.approx(np.mean([z > 0 for z in signs]), abs=1e-9)
        assert abs(search.estimate() - truth) <= 2 / 2 ** 20


def test_threshold_halves_the_interval_and_max_mirrors_min():
    plan = plan_search(participants=100, epsilon=1.0, rounds=3)
    low = RangeSearch(low=0.0, high=8.0, side="min", plan=plan)
    high = RangeSearch(low=0.0, high=8.0, side="max", plan=plan)
    assert low.threshold() == high.threshold() == 4.0
    low.decide(answer_sum=100, answers=100)  # all below 4: keep [0, 4]
    high.decide(answer_sum=100, answers=100)  # all above 4: keep [4, 8]
    assert (low.threshold(), high.threshold()) == (2.0, 6.0)
    low.decide(answer_sum=-100, answers=100)
    high.decide(answer_sum=-100, answers=100)
    assert (low.threshold(), high.threshold()) == (3.0, 5.0)
    low.decide(answer_sum=-100, answers=100)
    assert low.done and low.estimate() == 3.5
    with pytest.raises(RuntimeError):
        low.decide(answer_sum=1, answers=1)
    with pytest.raises(ValueError, match="side"):
        RangeSearch(low=0, high=1, side="median", plan=plan)


def _mae(strategy, n, epsilon, runs, rng, alpha_min=1.0):
    plan = plan_search(participants=n, epsilon=epsilon, strategy=strategy, alpha_min=alpha_min)
    errors = []
    for run in range(runs):
        # the paper's setting: uniform on [x_min, x_min + 0.3] inside [-1, 1] (alpha = 1)
        x_min = rng.uniform(-1.0, 0.7)
        values = x_min + 0.3 * rng.random(n)
        search = simulate(values, low=-1, high=1, side="min", plan=plan, rng=rng,
                          run_id=f"run{run}")
        errors.append(abs(search.estimate() - values.min()))
    return float(np.mean(errors))


@pytest.mark.parametrize("strategy", ["sequential", "split"])
def test_error_shrinks_with_n_at_the_papers_rate(strategy):
    """Corollary 1 with alpha = 1: MAE = O((ln^3 N / (eps^2 N))^(1/2)).

    The log-log slope of the MAE over N = 2^8 .. 2^14 must match the slope of
    the predicted rate (-0.30 over this range) within 0.12; 80 runs per N give
    the MAE to about 5%, i.e. the slope to about 0.02.
    """
    rng = np.random.default_rng(5 if strategy == "split" else 6)
    ns = [2 ** 8, 2 ** 10, 2 ** 12, 2 ** 14]
    maes = [_mae(strategy, n, 4.0, 80, rng) for n in ns]
    rate = [math.sqrt(math.log(n) ** 3 / (16.0 * n)) for n in ns]
    slope = np.polyfit(np.log(ns), np.log(maes), 1)[0]
    predicted = np.polyfit(np.log(ns), np.log(rate), 1)[0]
    assert abs(slope - predicted) < 0.12, (maes, slope, predicted)
    assert all(a > b for a, b in zip(maes, maes[1:])), maes


def test_split_beats_sequential_at_small_epsilon_and_laplace_fails():
    rng = np.random.default_rng(9)
    n = 4096
    sequential = _mae("sequential", n, 1.0, 60, rng)
    split = _mae("split", n, 1.0, 60, rng)
    assert split < 0.7 * sequential
    # the paper's baseline: everyone adds Laplace(2/eps), the server takes the minimum
    laplace = np.mean([abs((x := rng.uniform(-1, 0.7) + 0.3 * rng.random(n)).min()
                           - (x + rng.laplace(0, 2.0, n)).min()) for _ in range(20)])
    assert laplace > 1.0 > sequential


@pytest.mark.parametrize("epsilon", [0.1, 1.0, 0.7, 3.3, 4.0, 19.9])
@pytest.mark.parametrize("rounds", [1, 3, 7, 10, 13, 64])
def test_sequential_answers_compose_to_at_most_epsilon_exactly(epsilon, rounds):
    plan = plan_search(participants=1000, epsilon=epsilon, rounds=rounds)
    share = plan.answer_epsilon
    assert Fraction(share) * rounds <= Fraction(epsilon)
    assert share == pytest.approx(epsilon / rounds, rel=1e-15)
    loss = RandomizedResponse(epsilon=share).exact_privacy_loss()
    total = loss
    for _ in range(rounds - 1):
        total = total + loss
    assert total.at_most(epsilon)


# -- the search's own error bound ---------------------------------------------------------
def misses_allowed(runs: int, level: float = CONFIDENCE) -> int:
    """The most misses in ``runs`` that a true coverage of ``level`` exceeds with
    probability <= ALPHA: the test fails wrongly at most once in a million."""
    return int(stats.binom.isf(ALPHA, runs, 1 - level))


def paper_data(rng, n):
    """The paper's setting: uniform on [x_min, x_min + 0.3] inside [-1, 1]."""
    return rng.uniform(-1.0, 0.7) + 0.3 * rng.random(n)


def spread_data(rng, n):
    """Uniform over the whole domain: the edge of the bound's fatness assumption."""
    return rng.uniform(-1.0, 1.0, n)


@pytest.mark.parametrize("epsilon", [0.3, 1.0, 4.0])
@pytest.mark.parametrize("answers", [5, 60, 700])
def test_share_interval_holds_each_side_at_its_delta(epsilon, answers):
    """Step 1 of the bound: each side of a round's share interval fails at most delta.

    The count of +1 answers takes only answers + 1 values, so the interval is computed
    once per count and looked up for 20,000 simulated rounds per true share."""
    delta = 0.02
    rr = RandomizedResponse(epsilon=epsilon)
    bounds = np.array([share_interval(k / answers, answers, epsilon, delta)
                       for k in range(answers + 1)])
    rng = np.random.default_rng(answers + int(10 * epsilon))
    trials = 20_000
    for share in (0.0, 0.05, 0.5, 1.0):
        beyond = round(share * answers)
        truth = np.where(np.arange(answers) < beyond, 1, -1).astype(np.int8)
        answered = rr.respond(np.tile(truth, (trials, 1)), rng)
        counts = (answered == 1).sum(axis=1)
        true_share = beyond / answers
        for failed in (bounds[counts, 0] > true_share, bounds[counts, 1] < true_share):
            misses = int(failed.sum())
            assert misses <= stats.binom.isf(ALPHA, trials, delta), (share, misses)


COVERAGE_CASES = [("split", 64, 1.0, None), ("split", 512, 4.0, 1.0),
                  ("split", 4096, 1.0, None), ("sequential", 256, 4.0, 1.0),
                  ("sequential", 2048, 1.0, None)]


@pytest.mark.parametrize("side", ["min", "max"])
@pytest.mark.parametrize("case", range(len(COVERAGE_CASES)))
def test_the_bound_covers_the_true_extreme(side, case):
    """Over 200 simulated runs (half the paper's data, half spread over the domain) the
    interval holds the agents' true min (max) in at least 95% of them, tested with a
    1e-6 false-alarm rate; and |estimate - truth| <= error_bound whenever it does."""
    strategy, n, epsilon, alpha_min = COVERAGE_CASES[case]
    rng = np.random.default_rng(100 + 2 * case + (side == "max"))
    plan = plan_search(participants=n, epsilon=epsilon, strategy=strategy, alpha_min=alpha_min)
    runs, misses = 200, 0
    for run in range(runs):
        values = (paper_data if run % 2 else spread_data)(rng, n)
        search = simulate(values, low=-1, high=1, side=side, plan=plan, rng=rng,
                          run_id=f"cover-{run}")
        assessment = search.assess()
        truth = values.min() if side == "min" else values.max()
        low, high = assessment.interval
        covered = low <= truth <= high
        misses += not covered
        if covered:
            assert abs(search.estimate() - truth) <= assessment.error_bound + 1e-12
        assert -1 <= low <= high <= 1 and assessment.confidence == CONFIDENCE
    assert misses <= misses_allowed(runs), f"{misses} of {runs} runs missed"


def test_the_bound_assumes_fat_data_as_the_paper_does():
    """Theorem 1: an isolated minimum cannot be found privately; the bound's fatness
    assumption (docs) excludes it, and indeed the interval misses it."""
    rng = np.random.default_rng(12)
    plan = plan_search(participants=2048, epsilon=4.0, strategy="split", alpha_min=1.0)
    values = np.full(2048, 0.9)
    values[0] = -0.9
    search = simulate(values, low=-1, high=1, side="min", plan=plan, rng=rng)
    assert not search.assess().interval[0] <= -0.9 <= search.assess().interval[1]


def test_a_healthy_run_with_many_agents_is_ok_and_narrower_than_the_domain():
    rng = np.random.default_rng(21)
    plan = plan_search(participants=4096, epsilon=4.0, strategy="split", alpha_min=1.0)
    values = paper_data(rng, 4096)
    for side, truth in (("min", values.min()), ("max", values.max())):
        search = simulate(values, low=-1, high=1, side=side, plan=plan, rng=rng)
        assessment = search.assess()
        assert assessment.ok and assessment.status == "ok" and assessment.reason is None
        assert 2 * assessment.error_bound < 2 / 4  # within a quarter of the domain
        assert assessment.interval[0] <= truth <= assessment.interval[1]
        assert abs(search.estimate() - truth) <= assessment.error_bound


def test_four_agents_are_insufficient_and_the_reason_says_why():
    """The field report: 4 agents on [-1, 1] gave min 1.0 and max -1.0.

    With many rounds (here 12, sequential, eps 1: eps/12 per answer) no round can
    tell 4 answers from noise: the run is refused before anyone answers.  With the
    paper's L (one round) the run happens, and its bound says it is not worth reading.
    """
    plan = plan_search(participants=4, epsilon=1.0, strategy="sequential", rounds=12)
    assert uninformed_reason(plan, [4] * 12) == (
        "4 agents joined: too few for even one informative round (4 answers at "
        "\u03b5 0.0833 each cannot be told from noise at 95% confidence)")
    values = np.array([-0.7, -0.2, 0.4, 0.95])
    search = simulate(values, low=-1, high=1, side="min", plan=plan,
                      rng=np.random.default_rng(1))
    assert search.estimate() > 0.9  # what the field saw, near the top of the domain
    assert search.assess().status == "insufficient"

    plan = plan_search(participants=4, epsilon=1.0, strategy="split")
    assert plan.rounds == 1 and uninformed_reason(plan, [4]) is None
    rng = np.random.default_rng(4)
    statuses = []
    for run in range(100):
        search = simulate(values, low=-1, high=1, side="min", plan=plan, rng=rng,
                          run_id=f"four-{run}")
        assessment = search.assess()
        statuses.append(assessment.status)
        if assessment.ok:  # an honest half-domain statement: min below the middle
            assert assessment.interval == (-1.0, 0.0)
        else:
            assert assessment.reason == (
                "4 agents: the search's error bound \u00b11.5 is wider than the domain "
                "[-1, 1]")
    assert statuses.count("insufficient") >= 70


def test_min_above_max_is_a_conflict():
    assert pair_conflict(1.0, -1.0) == "min 1 exceeds max -1"
    assert pair_conflict(-0.25, 0.75) is None and pair_conflict(0.5, 0.5) is None
    assert pair_conflict(None, -1.0) is None


def test_rounds_that_contradict_each_other_are_insufficient():
    """All 1,000 answers say "below 0", then all say "not below 0.5": min < 0 and, with
    fat data, min > 0.5 - (small share) x 2.  Both cannot hold."""
    plan = plan_search(participants=1000, epsilon=4.0, rounds=2)
    history = [{"threshold": 0.0, "answers": 1000, "phi": 1.0},
               {"threshold": 0.5, "answers": 1000, "phi": 0.0}]
    assessment = assess(history, low=-1, high=1, side="min",
                        answer_epsilon=plan.answer_epsilon, participants=1000, estimate=0.25)
    assert assessment.status == "insufficient"
    assert assessment.reason.startswith("the rounds contradict each other: the min would be "
                                        "below 0 and above 0.")
    assert assessment.interval == (-1.0, 1.0)


def test_max_is_assessed_in_the_mirror():
    plan = plan_search(participants=1000, epsilon=4.0, rounds=1)
    # every answer says "above 2" on [-4, 4]: max > 2, estimate 2 (middle of [0, 4])
    history = [{"threshold": 0.0, "answers": 1000, "phi": 1.0}]
    assessment = assess(history, low=-4, high=4, side="max",
                        answer_epsilon=plan.answer_epsilon, participants=1000, estimate=2.0)
    assert assessment.interval == (0.0, 4.0) and assessment.error_bound == 2.0
    assert assessment.ok
    with pytest.raises(RuntimeError, match="not finished"):
        RangeSearch(low=0, high=1, side="max", plan=plan).assess()
