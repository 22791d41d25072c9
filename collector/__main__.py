"""``python -m collector`` is ``edge-collector``."""

from .cli import main

main()
