"""Stopping on a scheduler's signal without losing finished work.

SLURM (and submitit, Hydra's submitit launcher) ends a job with SIGTERM, and warns before a time limit with
SIGUSR1 or SIGUSR2 (`--signal`). The apps stop on any of them with exit status INTERRUPTED_EXIT:
- evaluation and the probes at once (`raise_on_stop`): every row written so far is complete (rows are
  written whole, atomically), and the same command with eval.skip_done finishes only the rest;
- training at the end of the optimizer step under way (`stop_requests`): the Trainer then checkpoints,
  marks status.json `interrupted`, and raises Interrupted. A second signal while it saves only repeats the
  request, so it cannot cut the checkpoint short.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable

from .errors import UserError

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
INTERRUPTED_EXIT = 75  # EX_TEMPFAIL: the work is not done, and running the same command again continues it


class Interrupted(UserError):
    """A stop signal ended the command; what it finished is kept."""

    exit_status = INTERRUPTED_EXIT


def outer_handler(previous, signum: int) -> Callable | None:
    """The handler of signum installed before any of ours (submitit's, which checkpoints its job and requeues
    it), or None where there was none (the default action, or ignored)."""
    if isinstance(previous, (StopRequest, RaiseOnStop)):
        return previous.outer.get(signum)
    return previous if callable(previous) else None


class StopRequest:
    """Records the first stop signal received while `stop_requests` is active (None until one arrives)."""

    def __init__(self):
        self.signal: signal.Signals | None = None
        self.outer: dict[int, Callable] = {}

    def __call__(self, signum, frame) -> None:
        self.signal = self.signal or signal.Signals(signum)

    @property
    def name(self) -> str:
        return self.signal.name if self.signal else ""

    def pass_on(self) -> None:
        """Hand the signal to the handler that was there before ours, once our work is saved: under submitit
        that requeues the job (it exits), which then continues from the checkpoint."""
        if self.signal is not None and (handler := self.outer.get(self.signal)) is not None:
            handler(self.signal, None)


class RaiseOnStop:
    """A handler that raises Interrupted at once (after handing the signal to an outer handler, if any)."""

    def __init__(self, what: str, resume: str):
        self.what, self.resume, self.outer = what, resume, {}

    def __call__(self, signum, frame) -> None:
        if (handler := self.outer.get(signum)) is not None:
            handler(signum, frame)
        raise Interrupted(f"{self.what} stopped by {signal.Signals(signum).name}; {self.resume}")


@contextlib.contextmanager
def _handlers(handler):
    """Install `handler` for every stop signal while the block runs, remembering the outer handlers (handlers
    exist only in the main thread: elsewhere, as in a thread of an in-process test, nothing is installed)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    handler.outer = {s: h for s, p in previous.items() if (h := outer_handler(p, s)) is not None}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def stop_requests():
    """Record stop signals instead of dying: the caller polls the yielded StopRequest between units of work."""
    request = StopRequest()
    with _handlers(request):
        yield request


@contextlib.contextmanager
def raise_on_stop(what: str, resume: str):
    """A stop signal raises Interrupted in the main thread at once, naming `what` stopped and how to `resume`."""
    with _handlers(RaiseOnStop(what, resume)):
        yield
