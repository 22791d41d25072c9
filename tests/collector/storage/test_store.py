"""The journal and checkpoint store on a real SQLite file: failures leave it usable.

Issue 12, defect 3: a checkpoint that failed left its write transaction open, so
every later BEGIN failed, the network child's journal commits got "database is
locked", and messages could be acknowledged that were never journaled."""

from __future__ import annotations

import sqlite3

import pytest

from collector.storage.store import CollectorStore


def journal(store: CollectorStore) -> list[tuple[str, bytes]]:
    return [(topic, payload) for _, topic, payload, _ in store.read_journal(0, rows=10**6)[0]]


@pytest.fixture
def stores(tmp_path):
    """The aggregator's and the network child's connections to one file."""
    path = tmp_path / "collector.sqlite"
    aggregator, network = CollectorStore(path), CollectorStore(path)
    yield aggregator, network
    aggregator.close()
    network.close()


def test_a_failed_checkpoint_rolls_back_and_leaves_the_file_usable(stores):
    aggregator, network = stores
    network.append("t", b"one", 1.0)
    network.commit()
    aggregator.checkpoint(b"state-1", 0)
    aggregator._db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 1000)  # a checkpoint too large
    with pytest.raises(sqlite3.DataError):
        aggregator.checkpoint(b"x" * 5000, 1)
    assert not aggregator._db.in_transaction
    # The other process can still write (no lock left behind) ...
    network.append("t", b"two", 2.0)
    assert network.commit()
    # ... and nothing of the failed checkpoint happened: old state, journal untrimmed.
    assert aggregator.load() == (b"state-1", 0)
    assert journal(aggregator) == [("t", b"one"), ("t", b"two")]
    aggregator.checkpoint(b"state-2", 2)  # the retry succeeds
    assert aggregator.load() == (b"state-2", 2) and journal(aggregator) == []


def test_a_failed_journal_commit_keeps_the_messages_for_the_next(stores):
    _, network = stores
    network._db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 1000)
    network.append("t", b"small", 1.0)
    network.append("t", b"y" * 5000, 2.0)
    with pytest.raises(sqlite3.DataError):
        network.commit()
    assert not network._db.in_transaction and journal(network) == []
    network.append("t", b"later", 3.0)
    network._db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 1 << 30)
    assert network.commit()  # all three, in order
    assert journal(network) == [("t", b"small"), ("t", b"y" * 5000), ("t", b"later")]


def test_reading_the_journal_is_bounded_by_rows_and_bytes(stores):
    aggregator, network = stores
    for i in range(10):
        network.append("t", bytes(1000) + bytes([i]), float(i))
    network.commit()
    rows, more = aggregator.read_journal(0, rows=4, size=10**6)
    assert [row[0] for row in rows] == [1, 2, 3, 4] and more
    rows, more = aggregator.read_journal(4, rows=100, size=2500)
    assert [row[0] for row in rows] == [5, 6, 7] and more  # stops once 2,500 bytes are read
    rows, more = aggregator.read_journal(7, rows=100, size=10**6)
    assert [row[0] for row in rows] == [8, 9, 10] and not more
    assert aggregator.read_journal(10) == ([], False)
