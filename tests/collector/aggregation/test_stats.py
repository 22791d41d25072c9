"""Generic properties of every statistic: incremental = batch, merge = both streams, pickle,
empty."""

from __future__ import annotations

import inspect
import math
import pickle

import msgspec
import numpy as np
import pytest

from collector.aggregation.blocks import LinearBlock
from collector.aggregation.series import SERIES_TYPES, new_series
from collector.aggregation.stats import (
    AgentSupportCounts,
    BinCounts,
    CodeMoments,
    Count,
    PolarCross,
    StateError,
    Statistic,
    SupportCounts,
    TrigMoments,
)
from edge_agent import protocol
from edge_agent.mechanisms import (
    CircularOGPM,
    ClassicalOGPM,
    Duchi,
    PiecewiseMechanism,
    PolarOGPM,
    TruncatedLaplace,
    UnbiasedOGPM,
)
from edge_agent.mechanisms.categorical import ORACLES, LongitudinalGRR
from edge_agent.mechanisms.multidimensional import DuchiVector, SampledDuchi

N_CODES = 1 << 16


def _codes(rng, n):
    return rng.integers(0, N_CODES, n)


def all_statistics() -> list[type[Statistic]]:
    """Every concrete statistic of collector.aggregation.stats, found by walking the subclasses."""
    found, todo = [], list(Statistic.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if not inspect.isabstract(cls):
            found.append(cls)
    return sorted(found, key=lambda cls: cls.__name__)


# Examples of each statistic: (name, make, draw a batch of n).  A statistic without
# one gets a case that fails, so a new statistic cannot skip the generic tests.
EXAMPLES = {
    Count: [("count", Count, lambda rng, n: _codes(rng, n))],
    CodeMoments: [("moments", lambda: CodeMoments(-2.0, 4.0 / N_CODES), _codes)],
    TrigMoments: [("trig", lambda: TrigMoments(-math.pi, 2 * math.pi / N_CODES, 2 * math.pi),
                   _codes)],
    BinCounts: [
        ("bins-clip", lambda: BinCounts(-6.0, 12.0 / N_CODES, -2.0, 0.08, 50, "clip"), _codes),
        ("bins-drop", lambda: BinCounts(-6.0, 12.0 / N_CODES, -2.0, 0.08, 50, "drop"), _codes),
        ("bins-wrap", lambda: BinCounts(0.0, 360.0 / N_CODES, 0.0, 7.2, 50, "wrap"), _codes)],
    PolarCross: [("polar-cross",
                  lambda: PolarCross(0.0, 2.0 / N_CODES, 0.0, 6.28 / N_CODES, 6.28),
                  lambda rng, n: (_codes(rng, n), _codes(rng, n)))],
    SupportCounts: [
        (f"support-{name}", lambda name=name: SupportCounts(name, 1.0, 6, 0.0),
         lambda rng, n, name=name: SupportCounts(name, 1.0, 6, 0.0).oracle.perturb(
             rng.integers(0, 6, n), rng))
        for name in ("grr", "oue", "sue", "olh")],
    AgentSupportCounts: [  # a memoized channel's total: (the agent of each report, reports)
        ("support-per-agent-l-grr", lambda: AgentSupportCounts("l-grr", 2.0, 6, 0.0, 1.0),
         lambda rng, n: (rng.choice([f"w{i}" for i in range(40)], n),
                         AgentSupportCounts("l-grr", 2.0, 6, 0.0, 1.0).oracle.perturb(
                             rng.integers(0, 6, n), rng)))],
}


def _missing(cls):
    def make():
        raise AssertionError(f"{cls.__name__} has no example in EXAMPLES: add one")
    return make


STATISTICS = {name: (make, draw)
              for cls in all_statistics()
              for name, make, draw in EXAMPLES.get(
                  cls, [(f"{cls.__name__}-without-example", _missing(cls), _codes)])}


def test_every_statistic_is_discovered_and_has_an_example():
    assert set(all_statistics()) == set(EXAMPLES)


def _split(batch, parts):
    if isinstance(batch, tuple):
        return list(zip(*(np.array_split(b, parts) for b in batch)))
    return np.array_split(batch, parts)


def _same(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)
    return a == b


@pytest.mark.parametrize("name", STATISTICS)
def test_incremental_equals_batch_and_merge_equals_both_streams(name):
    make, draw = STATISTICS[name]
    rng = np.random.default_rng(1)
    a_data, b_data = draw(rng, 3000), draw(rng, 2000)
    whole = make()
    whole.update(a_data)
    whole.update(b_data)
    incremental = make()
    for part in _split(a_data, 17) + _split(b_data, 5):
        incremental.update(part)
    assert _same(incremental.get(), whole.get())
    a, b = make(), make()
    a.update(a_data)
    b.update(b_data)
    assert _same(a.merge(b).get(), whole.get())
    # Exact statistics are equal as objects too (integers, not floats).
    if name in ("count", "moments") or name.startswith(("bins", "support")):
        assert incremental == whole == a


@pytest.mark.parametrize("name", STATISTICS)
def test_pickle_and_empty(name):
    make, draw = STATISTICS[name]
    value = make().get()
    if isinstance(value, np.ndarray):
        assert not value.any()
    elif isinstance(value, dict):
        assert value["n"] == 0 and all(v is None for k, v in value.items() if k != "n")
    else:
        assert value == 0
    stat = make()
    stat.update(draw(np.random.default_rng(2), 500))
    again = pickle.loads(pickle.dumps(stat))
    assert _same(again.get(), stat.get())


def test_merge_refuses_different_parameters():
    with pytest.raises(ValueError, match="different parameters"):
        CodeMoments(0.0, 1.0).merge(CodeMoments(0.0, 2.0))
    with pytest.raises(ValueError):
        Count().merge(CodeMoments(0.0, 1.0))


def test_moments_are_exact_for_grid_values():
    stat = CodeMoments(-2.0, 0.25)
    stat.update(np.array([0, 8, 16]))  # values -2, 0, 2
    assert stat.get() == {"n": 3, "mean": 0.0, "variance": 8.0 / 3.0}


# -- series: every kind, through the same properties ---------------------------------------

def _series_cases():
    polar = PolarOGPM(epsilon=5.0, radius_max=2.0)
    return {
        "linear-ogpm": (dict(kind="linear", mechanism=ClassicalOGPM(epsilon=1, low=-2, high=2)),
                        "scalar"),
        "linear-unbiased": (dict(kind="linear", mechanism=UnbiasedOGPM(epsilon=1, low=0, high=1)),
                            "scalar"),
        "linear-duchi": (dict(kind="linear", mechanism=Duchi(epsilon=1, low=0, high=1)),
                         "scalar"),
        "linear-laplace": (dict(kind="linear",
                                mechanism=TruncatedLaplace(epsilon=2, low=0, high=1)), "scalar"),
        "circular": (dict(kind="circular", mechanism=CircularOGPM(epsilon=1)), "scalar"),
        "polar": (dict(kind="polar", mechanism=polar), "polar"),
        "vector": (dict(kind="vector", mechanism=UnbiasedOGPM(epsilon=1, low=-1, high=1),
                        fields=("x", "y", "z"),
                        strategy=protocol.Strategy(k=1, d=3, epsilon=1.0)),
                   "vector"),
        **{f"vector-{m.name}": (dict(kind="vector", mechanism=m, fields=("x", "y", "z"),
                                     strategy=protocol.Strategy(k=getattr(m, "k", 3), d=3,
                                                                epsilon=m.epsilon)),
                                "whole-vector")
           for m in (DuchiVector(epsilon=1.0, dimensions=3, delta=1e-6, low=0, high=2),
                     SampledDuchi(epsilon=2.0, dimensions=3, k=2, low=-1, high=1))},
        **{f"categorical-{name}": (dict(kind="categorical", mechanism=ORACLES[name](
            epsilon=1.0, categories=5, labels=("a", "b", "c", "d", "e"))), "categorical")
           for name in ORACLES},
        "categorical-l-grr": (dict(kind="categorical", mechanism=LongitudinalGRR(
            epsilon=2.0, memo_epsilon=1.0, categories=5)), "categorical"),
    }


def _message(case, mechanism, rng, n):
    if case == "scalar":
        return mechanism.perturb_codes(rng.uniform(mechanism.low, mechanism.high, n), rng)
    if case == "polar":
        return mechanism.perturb_codes(rng.uniform(0, 2, n), rng.uniform(0, 6, n), rng)
    if case == "categorical":  # as a decoded report carries them (unary: sparse)
        reports = mechanism.perturb(rng.integers(0, mechanism.categories, n), rng)
        return mechanism.sparse(reports) if mechanism.name in ("oue", "sue") else reports
    if case == "whole-vector":
        return list(mechanism.perturb_codes(
            rng.uniform(mechanism.low, mechanism.high, (int(rng.integers(0, n)), 3)), rng))
    return [mechanism.perturb_codes(rng.uniform(-1, 1, k), rng)
            for k in rng.integers(0, n, 3)]


def _same_view(a, b) -> bool:
    """Views equal, floats to within rounding (trig sums depend on the merge order)."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_view(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same_view(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return a == b


def _make_series(spec):
    spec = dict(spec)
    mechanism = spec.pop("mechanism")
    return new_series(channel="c", description=protocol.describe(mechanism), window_seconds=10,
                      keep_windows=5, **spec)


@pytest.mark.parametrize("name", list(_series_cases()))
def test_series_merge_pickle_and_windows(name):
    spec, case = _series_cases()[name]
    mechanism = spec["mechanism"]
    rng = np.random.default_rng(3)
    messages = [(f"agent-{i % 3}", 7.0 * i, _message(case, mechanism, rng, 40)) for i in range(12)]
    whole = _make_series(spec)
    left, right = _make_series(spec), _make_series(spec)
    for i, (agent, t, codes) in enumerate(messages):
        whole.update(agent=agent, t=t, codes=codes)
        (left if i % 2 else right).update(agent=agent, t=t, codes=codes)
    merged = left.merge(right)
    assert merged == whole
    assert _same_view(merged.get(windows=True), whole.get(windows=True))
    again = pickle.loads(pickle.dumps(whole))
    assert again == whole and again.get(windows=True) == whole.get(windows=True)
    view = whole.get(windows=True)
    assert view["messages"] == 12 and view["agents"] == 3
    assert len(view["windows"]) == 5  # only the most recent windows are kept
    assert view["count"] == sum(whole.values_in(codes) for _, _, codes in messages)


@pytest.mark.parametrize("name", list(_series_cases()))
def test_a_series_copy_is_equal_and_detached(name):
    """``copy`` (what the documents are computed from) equals the series, is of its kind,
    and does not move when the series takes more reports, nor the series when the copy
    computes its views."""
    spec, case = _series_cases()[name]
    mechanism = spec["mechanism"]
    rng = np.random.default_rng(4)
    series = _make_series(spec)
    for i in range(6):
        series.update(agent=f"a{i % 2}", t=7.0 * i, codes=_message(case, mechanism, rng, 30))
    twin = series.copy()
    assert type(twin) is type(series) and twin == series
    before = series.to_state()
    assert twin.get(windows=True) == series.copy().get(windows=True)
    series.update(agent="a9", t=100.0, codes=_message(case, mechanism, rng, 30))
    assert msgspec.json.encode(twin.to_state()) == msgspec.json.encode(before)
    assert twin != series and "a9" not in twin.agents


def test_every_kind_of_the_protocol_has_its_series_type():
    assert set(SERIES_TYPES) == set(protocol.KINDS)
    assert all(SERIES_TYPES[kind].kind == kind for kind in protocol.KINDS)
    with pytest.raises(ValueError, match="unknown kind 'spiral'"):
        new_series(kind="spiral", channel="c", description=None)


@pytest.mark.parametrize("name", list(_series_cases()))
def test_empty_series_view(name):
    spec, _ = _series_cases()[name]
    view = _make_series(spec).get(windows=True)
    assert view["count"] == 0 and view["messages"] == 0 and view["windows"] == []


def test_series_refuse_to_mix_mechanisms():
    a = new_series(channel="c", kind="linear",
               description=protocol.describe(ClassicalOGPM(epsilon=1, low=0, high=1)))
    b = new_series(channel="c", kind="linear",
               description=protocol.describe(ClassicalOGPM(epsilon=2, low=0, high=1)))
    with pytest.raises(ValueError, match="different series"):
        a.merge(b)


@pytest.mark.parametrize("outside", ["clip", "drop", "wrap"])
def test_bin_lookup_table_equals_the_arithmetic(outside):
    """Integer codes take a precomputed table; it must bin exactly like the formula."""
    rng = np.random.default_rng(7)
    stat = BinCounts(-6.0, 12.0 / N_CODES, -2.0, 0.08, 50, outside)
    codes = rng.integers(0, N_CODES, 20_000)
    counts, outside_count = stat.summarize(codes)
    index = stat.bin_of(codes)
    inside = (index >= 0) & (index < 50)
    assert np.array_equal(counts, np.bincount(index[inside], minlength=50))
    assert outside_count == (int((~inside).sum()) if outside == "drop" else 0)
    # the table grows when a larger code arrives, and is not part of the state
    stat.summarize(np.array([3]))
    assert stat.summarize(np.array([N_CODES - 1]))[0].sum() + \
        stat.summarize(np.array([N_CODES - 1]))[1] == 1
    assert "_table" not in pickle.loads(pickle.dumps(stat)).__getstate__()


@pytest.mark.parametrize("name", ["grr", "olh", "oue"])
def test_support_counts_round_trip_their_state_and_refuse_impossible_sums(name):
    stat = SupportCounts(name, 2.0, 4, 0.0)
    stat.update(stat.oracle.perturb(np.arange(4).repeat(50), np.random.default_rng(3)))
    again = SupportCounts.from_state(stat.params(), stat.to_state())
    assert again == stat and again.get()["n"] == 200
    with pytest.raises(StateError, match="expected 4 counts"):
        SupportCounts.from_state(stat.params(), [[1, 2], 3])
    with pytest.raises(StateError, match="more reports than 3"):
        SupportCounts.from_state(stat.params(), [[4, 0, 0, 0], 3])
    if name == "grr":
        with pytest.raises(StateError, match="GRR counts add up to the reports"):
            SupportCounts.from_state(stat.params(), [[1, 1, 0, 0], 3])


def test_histogram_counts_are_kept_narrow_and_widen_exactly_as_they_grow():
    """A bin's counts live in the narrowest unsigned type holding the largest, widened
    before a sum could wrap: adding, merging and loading stay exact past every limit."""
    stat = BinCounts(0.0, 1.0, 0.0, 1.0, 4, "clip")
    assert stat.counts.dtype == np.uint8
    expected = np.zeros(4, dtype=object)
    for part, kind in (([255, 0, 1, 0], np.uint8), ([1, 0, 0, 0], np.uint16),
                       ([65_279, 7, 0, 0], np.uint16), ([1, 0, 0, 0], np.uint32),
                       ([2**32 - 65_537, 0, 0, 3], np.uint32), ([1, 0, 0, 0], np.int64)):
        stat.add((np.array(part, dtype=np.int64), 0))
        expected += np.array(part, dtype=object)
        assert stat.counts.dtype == kind
        assert stat.get().dtype == np.int64 and stat.get().tolist() == expected.tolist()
    narrow = BinCounts(0.0, 1.0, 0.0, 1.0, 4, "clip")
    narrow.add((np.array([200, 1, 0, 0]), 0))
    narrow.merge(narrow.copy())  # 400 in uint8 would wrap
    assert narrow.get().tolist() == [400, 2, 0, 0] and narrow.counts.dtype == np.uint16
    loaded = BinCounts.from_state(stat.params(), [[70_000, 1, 2, 3], 0])
    assert loaded.counts.dtype == np.uint32 and loaded.get().tolist() == [70_000, 1, 2, 3]
    assert BinCounts.from_state(stat.params(), [[0, 1, 2, 3], 0]).counts.dtype == np.uint8
    # A state holds at most (2**63 - 1) / 1,024 a bin (so that partitions sum); counts
    # grown in memory past int64 are refused rather than wrapped.
    huge = BinCounts(0.0, 1.0, 0.0, 1.0, 4, "clip")
    huge.add((np.array([2**63 - 1, 0, 0, 0], dtype=np.int64), 0))
    with pytest.raises(OverflowError, match="2\\*\\*63"):
        huge.merge(BinCounts.from_state(stat.params(), [[1, 0, 0, 0], 0]))


def test_a_linear_block_whose_bins_are_the_same_keeps_one_histogram_and_counts_once():
    """Classical OGPM reports inside its domain: the raw and the output histogram are one
    statistic, counted once on update and merge, still one after a copy or pickling,
    saved under both names, and a state whose two say different things is refused."""
    rng = np.random.default_rng(4)
    ogpm = ClassicalOGPM(epsilon=1.0, low=-1.0, high=1.0)
    block = LinearBlock(protocol.describe(ogpm), 20)
    assert block.raw is block.out
    codes = ogpm.perturb_codes(rng.uniform(-1, 1, 300), rng)
    block.update(codes[:100])
    other = LinearBlock(protocol.describe(ogpm), 20)
    other.update(codes[100:])
    block.merge(other)
    whole = np.histogram(ogpm.from_codes(codes), np.linspace(-1, 1, 21))[0]
    assert block.raw.get().tolist() == whole.tolist() and block.count.get() == 300
    for twin in (block.copy(), pickle.loads(pickle.dumps(block))):
        assert twin.raw is twin.out and twin.raw is not block.raw and twin == block
    state = block.to_state()
    assert state.raw == state.out
    loaded = LinearBlock(protocol.describe(ogpm), 20)
    loaded.load_state(state, "s")
    assert loaded == block and loaded.raw is loaded.out
    state.raw[0][0] += 1
    state.raw[0][1] -= 1
    with pytest.raises(StateError, match=r"s\.out: counts differ from raw's"):
        LinearBlock(protocol.describe(ogpm), 20).load_state(state, "s")
    pm = PiecewiseMechanism(epsilon=1.0, low=-1.0, high=1.0)
    separate = LinearBlock(protocol.describe(pm), 20)  # outputs beyond the domain
    assert separate.raw is not separate.out
