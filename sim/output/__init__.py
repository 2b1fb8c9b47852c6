"""What a run records: per-request and per-replica rows, the summary, the run directory."""
