"""Process hooks for the reporters: one atexit hook and one SIGTERM handler for all
the `Reporter`s of a process, and their reset in a forked child. Standard library only.

At exit (or on SIGTERM, where the job installed no handler of its own) every
reporter flushes at once, then each closes within what is left of the longest
`exit_timeout_s`, spilling what it could not deliver; then SIGTERM does what it
would have done without us.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import time
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent.reporter import Reporter

logger = logging.getLogger("rebound.agent")

_registry: weakref.WeakSet[Reporter] = weakref.WeakSet()
# Re-entrant: the SIGTERM handler may run while the main thread holds it.
_registry_lock = threading.RLock()
_atexit_installed = False
_sigterm_installed = False


def register(reporter: Reporter, *, handle_sigterm: bool) -> None:
    """Close `reporter` at exit (and on SIGTERM, when `handle_sigterm` and nobody else
    handles it)."""
    global _atexit_installed, _sigterm_installed
    with _registry_lock:
        _registry.add(reporter)
        if not _atexit_installed:
            atexit.register(_close_all)
            _atexit_installed = True
        if (
            handle_sigterm
            and not _sigterm_installed
            and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        ):
            # Only where nobody handles SIGTERM: a job's own handler decides for itself.
            signal.signal(signal.SIGTERM, _on_sigterm)
            _sigterm_installed = True


def unregister(reporter: Reporter) -> None:
    with _registry_lock:
        _registry.discard(reporter)


def _close_all() -> None:
    with _registry_lock:
        reporters = list(_registry)
    if not reporters:
        return
    for r in reporters:
        r._request_flush()  # all send at once; then each waits what is left of the budget
    deadline = time.monotonic() + max(r.exit_timeout_s for r in reporters)
    for r in reporters:
        try:
            r.close(max(0.0, deadline - time.monotonic()))
        except Exception:  # pragma: no cover - never stand in the way of an exit
            logger.exception("rebound reporter: close at exit failed")


def _on_sigterm(signum, frame) -> None:
    _close_all()
    # What SIGTERM would have done without us: end the process.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _after_fork_in_child() -> None:
    global _registry, _registry_lock
    _registry_lock = threading.RLock()
    for r in list(_registry):
        r._after_fork_in_child()
    _registry = weakref.WeakSet()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
