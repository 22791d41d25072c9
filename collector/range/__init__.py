"""Private range discovery, the collector's side: the coordinator of a run, the results
it follows, and the schedule that starts runs."""
