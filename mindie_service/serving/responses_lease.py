"""Who runs a background response: replicas may share one Responses store, and a restart must resume only the
responses no live process runs. Each process has a runner id (host, pid, a random tag); a running response's
row names its runner and the time of its last record (its beat). A restart takes over a response whose runner
is a dead process of this host at once, and any other once its beat is older than ``LEASE_S``."""
from __future__ import annotations

import os
import secrets
import socket

LEASE_S = 30.0  # a beat older than this: its runner is gone (a record is written at least every token)
CANCEL_CHECK_EVERY = 32  # tokens between two looks at the store for a cancel from another replica


def new_runner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def runner_dead(runner: str) -> bool:
    """True when ``runner`` was a process of this host that no longer exists (or this very process's past)."""
    host, _, rest = runner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return True  # a runner id of this process that is not ours: a process before us had this pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
