"""Estimates from the aggregated sums: means, histograms, circular summaries and category
shares with their errors.  The math only: no I/O, no threads."""
