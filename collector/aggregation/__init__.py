"""Aggregating reports: decoding and counting (``ingest``, ``dedup``, ``limits``) into
mergeable series of statistics (``series``, ``stats``).  No I/O."""
