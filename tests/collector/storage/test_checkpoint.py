"""Checkpoints: the typed codec, its earlier version, and what cannot be read.

(Collectors before the typed codec pickled their state; no release wrote such a file,
and 0.2.0 no longer reads one: it stops saying so.)
"""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from collector.aggregation.ingest import Ingestor
from collector.api.documents import Views
from collector.config import parse_collector_config
from collector.storage import checkpoint
from collector.storage.checkpoint import CheckpointError, restore
from collector.storage.states import encode_checkpoint
from collector.storage.store import CollectorStore
from edge_agent import protocol
from edge_agent.mechanisms import ClassicalOGPM
from tests.support import REPO
from tests.support.burst import burst

DATA = REPO / "tests" / "data"
FLEET = "demo"


# Keys the API gained after commit 482e47e that are not the ingestor's state.
NEWER_THAN_LEGACY = ("range_ignored",)
NEWER_IN_CHANNELS = ("unit", "angle_unit", "window", "state")


def document(ingestor: Ingestor) -> dict:
    said = json.loads(json.dumps(Views(lambda: ingestor, clock=lambda: 1000.0).channels_json()))
    for key in NEWER_THAN_LEGACY:
        said.pop(key)
    for channel in said["channels"].values():
        for key in NEWER_IN_CHANNELS:
            channel.pop(key, None)
    return said


def as_recorded(document: dict, recorded: dict) -> bool:
    """``document`` says what ``recorded`` (written by the legacy collector) said about
    the sums a checkpoint holds: equal, except that floats may differ in their last bits
    with the numpy/BLAS release that computes them (relative 1e-12; a migration error
    is far larger).  What the estimators make of the sums (``ESTIMATED``) has changed
    since by design (collector/estimation/estimators.py, collector/estimation/circular.py)
    and is left out."""
    return _close(_sums_only(document), _sums_only(recorded))


# Estimator outputs, wherever they appear (linear means and histograms, circular
# summaries, category shares).  Counts, raw means, raw histograms, circular means and
# raw resultant lengths are the sums themselves and must be the same.
ESTIMATED = ("estimate", "stderr", "bias_bound", "ci95", "method", "candidates", "note",
             "smoothing", "quantiles", "direction", "circular_std", "circular_std_reason",
             "covariance", "shares")


def _sums_only(document):
    if isinstance(document, list):
        return [_sums_only(item) for item in document]
    if not isinstance(document, dict):
        return document
    return {key: _sums_only(value) for key, value in document.items()
            if key not in ESTIMATED}


def circular_blocks(document) -> list[dict]:
    """Every circular block of an API document (channels, polar angles, windows)."""
    if isinstance(document, list):
        return [block for item in document for block in circular_blocks(item)]
    if not isinstance(document, dict):
        return []
    found = [document] if "circular_mean" in document else []
    return found + [block for value in document.values() for block in circular_blocks(value)]


def _close(a, b) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return a == pytest.approx(b, rel=1e-12, abs=1e-15)
    return a == b and type(a) is type(b)


def seen(ingestor: Ingestor) -> dict:
    return {f"{agent}/{channel}": [seq for seq in range(12) if tracker.seen(seq)]
            for (agent, channel), tracker in ingestor.trackers.items()}


def _store_with(tmp_path, state: bytes, journal=()) -> CollectorStore:
    store = CollectorStore(tmp_path / "collector.sqlite")
    for topic, payload, received in journal:
        store.append(topic, payload, received)
    store.commit()
    store.checkpoint(state, 0)  # the journal rows come after the checkpoint
    return store


def _report(seq: int) -> tuple[str, bytes, float]:
    mechanism = ClassicalOGPM(epsilon=1.0, low=-2, high=2)
    payload = protocol.report(agent="w0", channel="x", kind="linear", seq=seq, t=500.0, dt=1.0,
                              mechanism=mechanism.describe(), codes=[1, 2, 3])
    return protocol.data_topic(FLEET, "w0", "x"), payload, 500.0


def test_restore_replays_the_journal_after_the_checkpoint(tmp_path):
    ingestor = Ingestor(fleet=FLEET)
    for seq in (0, 1, 2):
        ingestor.ingest(*_report(seq))
    before = dict(ingestor.counters)
    store = _store_with(tmp_path, checkpoint.dump(ingestor),
                        journal=[_report(10), _report(2)])
    settings = {"fleet": FLEET, "storage": {"path": str(tmp_path / "collector.sqlite")},
                "aggregates": {"histogram_bins": 20, "window_seconds": 10, "keep_windows": 4}}
    restored, _ = restore(parse_collector_config(settings), store)
    # The journal's new report counts, its seq 2 is a duplicate of the checkpoint's.
    assert restored.counters["messages"] == before["messages"] + 1
    assert restored.counters["duplicates"] == before.get("duplicates", 0) + 1
    assert seen(restored)["w0/x"] == [0, 1, 2, 10]
    store.close()


@pytest.mark.parametrize("payload, reason", [
    (b"\x80\x05a pickle", "pickled"),
    (b'{"v": 9, "type": "collector-checkpoint"}', "version"),
    (b"{}", "schema"),
])
def test_an_unreadable_checkpoint_stops_the_collector_saying_why(tmp_path, payload, reason):
    store = _store_with(tmp_path, payload)
    config = parse_collector_config({"fleet": FLEET,
                                     "storage": {"path": str(tmp_path / "collector.sqlite")}})
    with pytest.raises(CheckpointError) as caught:
        restore(config, store)
    message = str(caught.value)
    assert str(store.path) in message and reason in message and "move the file away" in message


def test_the_typed_checkpoint_keeps_trackers_and_held_reports():
    ingestor = Ingestor(fleet=FLEET)
    rng = np.random.default_rng(0)
    for seq in (0, 1, 5, 200_000):
        topic, payload, received = _report(seq)
        ingestor.ingest(topic, payload, received + rng.random())
    again, held = checkpoint.load(checkpoint.dump(ingestor))
    assert held == []
    assert seen(again) == seen(ingestor)
    tracker, restored = ingestor.trackers[("w0", "x")], again.trackers[("w0", "x")]
    assert (restored.floor, restored.skipped, restored.runs) == \
        (tracker.floor, tracker.skipped, tracker.runs)
    assert document(again) == document(ingestor)


def test_a_version_1_checkpoint_keeps_its_trackers_bitmaps():
    """Checkpoint v1 (the typed codec before the runs) kept the numbers past a tracker's
    base as a bitmap; loading it gives the same numbers as runs."""
    ingestor = Ingestor(fleet=FLEET)
    for seq in (0, 1, 3, 4, 5, 9, 11):
        ingestor.ingest(*_report(seq))
    document_v2 = json.loads(checkpoint.dump(ingestor))
    document_v2["v"] = 1
    (tracker,) = document_v2["trackers"]
    assert tracker[2:] == [1, -1, [[3, 5], [9, 9], [11, 11]]]
    bits = sum(1 << (seq - 2) for seq in (3, 4, 5, 9, 11))  # bit i: number 2 + i
    tracker[4] = base64.b64encode(bits.to_bytes(2, "little")).decode()
    again, _ = checkpoint.load(json.dumps(document_v2).encode())
    restored = again.trackers[("w0", "x")]
    assert (restored.floor, restored.skipped, restored.runs) == (1, -1, [(3, 5), (9, 9), (11, 11)])
    assert document(again) == document(ingestor)


def test_series_encoded_one_at_a_time_give_the_same_checkpoint():
    """``to_state(encoded=True)`` (each series' state encoded as soon as it is built, so
    that the whole state's typed tree never exists at once) writes the same bytes as the
    typed state, with and without what the sums gave."""
    ingestor = Ingestor(fleet=FLEET, bins=20, window_seconds=10.0, keep_windows=4)
    for topic, payload in burst(channels=["x", "y"], agents=["a", "b"], windows=4, values=30,
                                window_seconds=10.0, now=1_000.0):
        assert ingestor.ingest(topic, payload, 1_000.0) == "accepted"
    Views(lambda: ingestor, clock=lambda: 1_000.0, budget_seconds=None).channels_json()
    trackers = checkpoint.tracker_states(ingestor)
    for computed in (True, False):
        typed = ingestor.to_state(computed=computed)
        assert len(typed.series) == 2 and typed.series[0].windows
        assert encode_checkpoint(ingestor.to_state(computed=computed, encoded=True), trackers,
                                 held=[]) == encode_checkpoint(typed, trackers, held=[])
    again, _ = checkpoint.load(checkpoint.dump(ingestor))
    assert document(again) == document(ingestor)


@pytest.mark.parametrize("part_bytes", [1, 300, 1 << 20])
def test_a_checkpoint_in_parts_is_the_same_checkpoint_and_loads_from_the_store(tmp_path,
                                                                               part_bytes):
    """``dump_parts`` (each series and each batch of closed windows encoded as the store
    takes the parts: no copy of the whole state) concatenates to the typed state's
    checkpoint, whatever the parts' size and whatever senders wrote into what the state
    keeps of them (a dead letter holding the marks' NUL and SOH bytes and their text); the
    store gives it back whole, and a later checkpoint in one piece leaves no part behind."""
    ingestor = Ingestor(fleet=FLEET, bins=20, window_seconds=10.0, keep_windows=4,
                        recording=True)
    assert b"".join(checkpoint.dump_parts(ingestor, part_bytes)) == encode_checkpoint(
        ingestor.to_state(), [], held=[])  # no series at all
    for topic, payload in burst(channels=["x", "y", "z"], agents=["a", "b"], windows=4,
                                values=30, window_seconds=10.0, now=1_000.0):
        assert ingestor.ingest(topic, payload, 1_000.0) == "accepted"
    ingestor.ingest(protocol.data_topic(FLEET, "a", "x"),
                    b'{"series": [\x00], "pending": [\x01], "v": "\x00\x01"}', 1_000.0)
    assert ingestor.dead_letters
    Views(lambda: ingestor, clock=lambda: 1_000.0, budget_seconds=None).channels_json()
    for now in (985.0, 1_000.0):  # two batches of closed windows, pending
        assert ingestor.close_windows(now, grace=0.0) is not None
    assert len(ingestor.pending) == 2
    parts = list(checkpoint.dump_parts(ingestor, part_bytes))
    expected = encode_checkpoint(ingestor.to_state(), checkpoint.tracker_states(ingestor),
                                 held=[])
    assert b"".join(parts) == expected
    assert len(parts) > 1 if part_bytes < 1000 else len(parts) == 1
    store = CollectorStore(tmp_path / "state.sqlite")
    try:
        store.checkpoint(iter(parts), 7)
        assert store.load() == (expected, 7)
        again, _ = checkpoint.load(store.load()[0], recording=True)
        assert document(again) == document(ingestor)
        assert again.to_state().pending == ingestor.to_state().pending
        store.checkpoint(b"{}", 8)
        assert store.load() == (b"{}", 8)
        assert store._db.execute("SELECT COUNT(*) FROM checkpoint_part").fetchone()[0] == 0
    finally:
        store.close()
