"""``python -m collector`` is ``edge-collector``."""

from collector.cli import main

main()
