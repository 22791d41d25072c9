"""What the collector keeps: the SQLite journal and checkpoints (``store``, ``checkpoint``
and its migration ``checkpoint_v0``), and the typed state formats collectors save and
exchange (``states``)."""
