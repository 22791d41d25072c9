"""Results that last: every closed window at every resolution, kept with its sums and
estimates in a results store (SQLite by default, PostgreSQL for larger deployments),
queried and exported by time range (docs/guides/COLLECTOR.md, "Results of a study")."""
