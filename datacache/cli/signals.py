"""Ctrl-C and SIGTERM as a cancel flag for long commands (warmup, controller)."""

from __future__ import annotations

import contextlib
import signal
import threading


class SignalCancel(threading.Event):
    """An Event set by the first SIGINT or SIGTERM; ``signum`` says which (0 before)."""

    signum = 0

    @property
    def exit_status(self) -> int:
        """128 + the signal's number (130 for Ctrl-C, 143 for SIGTERM), as a shell reports a
        command the signal stopped."""
        return 128 + self.signum


@contextlib.contextmanager
def cancel_on_signals():
    """A :class:`SignalCancel` set by Ctrl-C (SIGINT) or SIGTERM while the block runs, so a long
    job can stop cleanly (its status written, nothing half-stored) instead of dying mid-write."""
    cancel = SignalCancel()

    def handler(signum, _frame):
        cancel.signum = cancel.signum or signum
        cancel.set()
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield cancel
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
