"""What the collector keeps: the SQLite journal and checkpoints (``store``,
``checkpoint``), and the typed state formats collectors save and exchange (``states``)."""
