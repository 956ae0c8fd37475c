"""Prefect flows, configs and the `thresher` command line: orchestration only."""

import os

# The temporary Prefect server must not try to reach the internet.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
