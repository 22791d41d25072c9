"""``python -m edge_agent`` is ``edge-agent``."""

from .cli import main

main()
