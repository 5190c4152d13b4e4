"""What a long piece of work will cost, said before it starts: the apps print a plan (windows, forward passes,
steps) and, once the first batch or steps have run, an estimate of the time ("about ..."), which the progress
bars' ETA then keeps up to date."""

from __future__ import annotations

import time

from tqdm import tqdm


def duration(seconds: float) -> str:
    """About how long, rounded to what such an estimate can tell: 40 s, 12 min, 3.4 h, 2.1 days. It follows
    "about", so a fraction of a second rounds up to 1 s ("about under 1 s" is not English)."""
    if seconds < 90:
        return f"{max(seconds, 1):.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h" if seconds < 48 * 3600 else f"{seconds / 86400:.1f} days"


class FirstBatchEstimate:
    """A progress bar's update(n) that also, once, after the first batch, prints about how long the whole work
    (bar.total units) takes at the first batch's rate; `caveat` says what the rate leaves out."""

    def __init__(self, bar: tqdm, what: str, caveat: str = ""):
        self.bar, self.what, self.caveat = bar, what, caveat
        self.t0, self.said = time.perf_counter(), False

    def update(self, n: int) -> None:
        self.bar.update(n)
        if not self.said and n > 0:
            self.said = True
            rate = n / max(time.perf_counter() - self.t0, 1e-9)
            tqdm.write(f"estimate: about {duration(self.bar.total / rate)} for {self.bar.total:,} {self.what} at the "
                       f"first batch's {rate:,.0f}/s{self.caveat}")

    def skip(self, n: int) -> None:
        """Advance the bar by work that did not run (a cell that is not applicable): not a rate to estimate from."""
        self.bar.update(n)


ESTIMATE_AFTER_STEPS = 10  # training prints its time estimate after this many steps


def trainer_plan(trainer) -> str:
    """The plan line of a Trainer (alibi_lm.train) about to train from trainer.step to trainer.steps."""
    tc, start, end, stream = trainer.tc, trainer.step, trainer.steps, trainer.stream
    validations = end // tc.eval_every - start // tc.eval_every + (1 if end % tc.eval_every else 0)
    if not hasattr(stream, "train_tokens"):  # a synthetic task (tasks.stream.TaskStream)
        target = getattr(tc, "stop_at_accuracy", None)
        until = f", ending early at exact match {target} at L" if target is not None else ""
        return (f"plan: {end - start:,} optimizer steps of {tc.batch_size * tc.grad_accum * trainer.world} sequences "
                f"of task {stream.task.name}, lengths {stream.min_len}..{tc.seq_len} (positions {stream.positions.label}), "
                f"and {validations} validation(s) of exact match at L{until}; time: printed after the first "
                f"steps{threads_note(trainer)}")
    valid = len(stream.valid_tokens) - 1 if tc.eval_tokens is None else min(tc.eval_tokens, len(stream.valid_tokens) - 1)
    plan = train_plan(end - start, trainer.tokens_per_step, tc.seq_len, len(stream.train_tokens), validations, valid)
    return plan + threads_note(trainer)


def threads_note(trainer) -> str:
    """`; <threads and why>` on the CPU (config.apply_cpu_threads): what a step's time depends on, said up front."""
    why = getattr(trainer, "threads_why", None)
    device = getattr(trainer, "device", None)
    return f"; {why}" if why and getattr(device, "type", "cpu") == "cpu" else ""


def train_plan(steps: int, tokens_per_step: int, seq_len: int, train_tokens: int, validations: int,
               valid_tokens: int) -> str:
    """The plan line of a training run: its steps, windows, tokens and epochs, and its validations."""
    windows = tokens_per_step // seq_len
    return (f"plan: {steps:,} optimizer steps of {windows:,} windows of L = {seq_len} ({steps * windows:,} windows, "
            f"{steps * tokens_per_step / 1e6:.2f}M tokens, {steps * tokens_per_step / max(train_tokens, 1):.2f} epochs "
            f"of the training split), and {validations} validation(s) of {valid_tokens:,} tokens in windows of L; "
            f"time: printed after the first steps, then the bar's ETA")


def train_estimate(trainer) -> str:
    """After the Trainer's first steps of this process: about how long the rest takes at their rate."""
    steps_done, steps_left = trainer.step - trainer.first_step, trainer.steps - trainer.step
    per_step = (time.perf_counter() - trainer.t0) / max(steps_done, 1)
    return (f"estimate: about {duration(per_step * steps_left)} for the {steps_left:,} steps left, at the first "
            f"{steps_done} steps' {per_step:.2f} s per step (validations and checkpoints add to it)")
