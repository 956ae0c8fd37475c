"""Child processes: stopping one that is still running."""

from __future__ import annotations

import subprocess


def stop_process(proc: subprocess.Popen, timeout: float = 30) -> None:
    """Ask `proc` to end (SIGTERM); kill it if it has not ended within `timeout` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
