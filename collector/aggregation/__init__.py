"""Aggregating reports: decoding and counting (``ingest``, ``dedup``, ``limits``) into
mergeable series (``series``: one class per channel kind) of blocks of statistics
(``blocks``, over ``stats``).  No I/O."""
