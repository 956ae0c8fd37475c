"""Orchestration only: the Prefect flows, their gates and schedules, the `thresher` command line."""

import os

# The temporary Prefect server must not try to reach the internet.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
