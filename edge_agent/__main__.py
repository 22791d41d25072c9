"""``python -m edge_agent`` is ``edge-agent``."""

from edge_agent.cli import main

main()
