"""Tools around a collector: the demo, offline replay and export, the terminal view and
the embedded broker."""
