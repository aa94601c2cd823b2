"""The run's work items: leases, run state, the config ingest, and the counts of samples per state (live and as
stored)."""
