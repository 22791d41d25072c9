"""What the collector serves: documents, Prometheus metrics, the snapshots they are
computed in, the HTTP server and the dashboard's static files."""
