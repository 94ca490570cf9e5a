"""Prometheus metrics at /metrics: what Rebound knows, read from the database at each
scrape (`collector`), the ingest refusals counted in the cache (`refusals`), and the
endpoint with its protection (`views`). docs/monitoring.md lists every metric."""
