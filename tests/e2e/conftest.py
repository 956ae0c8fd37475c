"""A real Prefect server for the orchestration tests: `prefect server start` on 127.0.0.1."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from helpers import free_port

from thresher.processes import stop_process


@pytest.fixture(scope="session")
def prefect_server():
    """The API URL of a Prefect server with its own PREFECT_HOME, stopped after the session.

    Nothing global is changed: give subprocesses the `prefect_env` fixture's environment,
    or use `prefect.settings.temporary_settings` in-process.
    """
    home = Path(tempfile.mkdtemp(prefix="thresher-prefect-server-"))
    port = free_port()
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
        "PREFECT_LOGGING_LEVEL": "WARNING",
    }
    env.pop("PREFECT_API_URL", None)
    log = open(home / "server.log", "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prefect",
            "server",
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-ui",
            "--analytics-off",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + 180
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(
                f"prefect server did not start: {(home / 'server.log').read_text()[-2000:]}"
            )
        time.sleep(0.5)
    try:
        yield url
    finally:
        stop_process(proc)
        log.close()


@pytest.fixture
def prefect_env(prefect_server) -> dict[str, str]:
    """Environment for a subprocess that talks to the session's Prefect server."""
    return {**os.environ, "PREFECT_API_URL": prefect_server}
