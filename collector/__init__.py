"""edge-collector: ingest of perturbed reports and live fleet aggregates."""
