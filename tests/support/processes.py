"""Waiting for processes a test expects to end."""

from __future__ import annotations

import time

import psutil


def gone(pids, within_s: float = 10) -> bool:
    """Whether every pid has exited (or is a zombie) within `within_s`."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
            return True
        time.sleep(0.1)
    return False
