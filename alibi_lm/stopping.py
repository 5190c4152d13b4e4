"""Stopping on Ctrl-C or a scheduler's signal without losing finished work.

SLURM (and submitit, Hydra's submitit launcher) ends a job with SIGTERM, and warns before a time limit with
SIGUSR1 or SIGUSR2 (`--signal`); a user presses Ctrl-C (SIGINT). The apps stop on any of them, with exit status
INTERRUPTED_EXIT (75) after a scheduler's signal and CTRL_C_EXIT (130, the shell's 128 + SIGINT) after Ctrl-C:
- evaluation and the probes at once (`raise_on_stop`): every row written so far is complete (rows are
  written whole, atomically), and the same command with eval.skip_done finishes only the rest;
- training at the end of the optimizer step under way (`stop_requests`): the Trainer then checkpoints,
  marks status.json `interrupted` (a scheduler's signal) or `stopped` (Ctrl-C), and raises Interrupted. A second
  scheduler's signal while it saves only repeats the request, so it cannot cut the checkpoint short; a second
  Ctrl-C (`stop_requests(at_once=...)`) raises Interrupted at once: a checkpoint being written is dropped whole
  (checkpoint.atomic_file), so the last complete one stays.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable

from .errors import UserError

SCHEDULER_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
STOP_SIGNALS = (signal.SIGINT, *SCHEDULER_SIGNALS)
INTERRUPTED_EXIT = 75  # EX_TEMPFAIL: the work is not done, and running the same command again continues it
CTRL_C_EXIT = 128 + signal.SIGINT  # 130: what a shell reports for a command that Ctrl-C ended
STOPPED_EXITS = (INTERRUPTED_EXIT, CTRL_C_EXIT)  # a command stopped by a signal: the same command continues it


def exit_status_after(signum: int) -> int:
    return CTRL_C_EXIT if signum == signal.SIGINT else INTERRUPTED_EXIT


def status_after(signum: int | None) -> str:
    """status.json's word for a run that a stop signal ended: `stopped` by its user, `interrupted` by a scheduler."""
    return "stopped" if signum == signal.SIGINT else "interrupted"


class Interrupted(UserError):
    """A stop signal ended the command; what it finished is kept. Exit status 130 after Ctrl-C, else 75."""

    exit_status = INTERRUPTED_EXIT

    def __init__(self, message: str, signum: int | None = None):
        super().__init__(message)
        if signum is not None:
            self.exit_status = exit_status_after(signum)


def outer_handler(previous, signum: int) -> Callable | None:
    """The handler of signum installed before any of ours (submitit's, which checkpoints its job and requeues
    it), or None where there was none (the default action, Python's KeyboardInterrupt, or ignored)."""
    if isinstance(previous, (StopRequest, RaiseOnStop)):
        return previous.outer.get(signum)
    return previous if callable(previous) and previous is not signal.default_int_handler else None


class StopRequest:
    """Records the first stop signal received while `stop_requests` is active (None until one arrives)."""

    def __init__(self, at_once: str | Callable[[], str] | None = None):
        self.signal: signal.Signals | None = None
        self.outer: dict[int, Callable] = {}
        self.at_once = at_once

    def __call__(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.signal is not None and self.at_once is not None:
            # a second Ctrl-C: the user will not wait for the save
            raise Interrupted(self.at_once() if callable(self.at_once) else self.at_once, signum)
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
        raise Interrupted(f"{self.what} stopped by {signal_name(signum)}; {self.resume}", signum)


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


def signal_name(signum: int) -> str:
    return "Ctrl-C (SIGINT)" if signum == signal.SIGINT else signal.Signals(signum).name


@contextlib.contextmanager
def stop_requests(at_once: str | Callable[[], str] | None = None):
    """Record stop signals instead of dying: the caller polls the yielded StopRequest between units of work. With
    at_once (a message, or a function that does what must be done first and returns it), a second Ctrl-C raises
    Interrupted with that message wherever the main thread is."""
    request = StopRequest(at_once)
    with _handlers(request):
        yield request


@contextlib.contextmanager
def raise_on_stop(what: str, resume: str):
    """A stop signal raises Interrupted in the main thread at once, naming `what` stopped and how to `resume`."""
    with _handlers(RaiseOnStop(what, resume)):
        yield
