"""The results store a collector's configuration names: PostgreSQL where ``[results] url``
is set, else the SQLite file ``[results] path`` (docs/guides/COLLECTOR.md)."""

from __future__ import annotations

from collector.results.sqlite import SqliteResultsStore
from collector.results.store import ResultsStore, StoreError


def open_results_store(config, *, read_only: bool = False) -> ResultsStore:
    """The results store a ``collector.config.CollectorConfig`` names (``StoreError`` if it
    cannot be opened); ``read_only``: to query it only (an analyst's export)."""
    results = config.results
    if results.url is not None:
        from collector.results.postgres import PostgresResultsStore

        password = None
        if results.password_file is not None:
            try:
                password = results.password_file.read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise StoreError(f"results.password_file: cannot be read ({exc})") from None
        return PostgresResultsStore(results.url, password=password)
    return SqliteResultsStore(config.results_path, read_only=read_only)
