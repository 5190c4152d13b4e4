"""Run an alibi_lm app's main() as `python -m MODULE ARGS...` does, with what only the tests need:

    python tests/app.py [--pause-in-write SUFFIX[@N]=SECONDS] [--nan-at-step N] [--disk-full-at-save N]
                        [--abort-at-exit 1] MODULE ARGS...

the test scheme (example_scheme.py) registered and tests/configs on Hydra's config search path, and
hooks that production code does not carry: sleep before the N-th (default: every) atomic rename onto a
path ending in SUFFIX, saying so on stderr (tests kill -9 the process there); a NaN training loss at
step N; a full disk at the N-th torch.save; an abort in the interpreter's teardown (as a native thread's
would). Also works as torchrun's script.
"""

from __future__ import annotations

import argparse
import atexit
import errno
import importlib
import os
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent
sys.path[:0] = [str(TESTS.parent), str(TESTS)]  # this checkout's alibi_lm, and example_scheme


def pause_in_write(spec: str) -> None:
    target, _, seconds = spec.rpartition("=")
    suffix, _, nth = target.partition("@")
    real_replace, renames = os.replace, []

    def replace(src, dst, *args, **kwargs):
        if str(dst).endswith(suffix):
            renames.append(dst)
            if not nth or len(renames) == int(nth):
                print(f"test hook: pausing {seconds}s before renaming over {dst}", file=sys.stderr, flush=True)
                time.sleep(float(seconds))
        return real_replace(src, dst, *args, **kwargs)

    os.replace = replace


def nan_at_step(step: int) -> None:
    from alibi_lm.train import Trainer

    real = Trainer.forward_backward
    Trainer.forward_backward = lambda self: float("nan") if self.step + 1 == step else real(self)


def disk_full_at_save(nth: int) -> None:
    import torch

    real_save, saves = torch.save, []

    def save(*args, **kwargs):
        saves.append(1)
        if len(saves) == nth:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(*args, **kwargs)

    torch.save = save


def abort_at_exit(_: str) -> None:
    atexit.register(os.abort)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pause-in-write")
    parser.add_argument("--nan-at-step", type=int)
    parser.add_argument("--disk-full-at-save", type=int)
    parser.add_argument("--abort-at-exit")
    parser.add_argument("module")
    args, app_args = parser.parse_known_args()
    import example_scheme  # noqa: F401 - registers position=example

    for hook, value in ((pause_in_write, args.pause_in_write), (nan_at_step, args.nan_at_step),
                        (disk_full_at_save, args.disk_full_at_save), (abort_at_exit, args.abort_at_exit)):
        if value is not None:
            hook(value)
    sys.argv = [args.module, *app_args, f"hydra.searchpath=[file://{TESTS / 'configs'}]"]
    module = importlib.import_module(args.module)
    if not hasattr(module, "main"):  # a package (alibi_lm.eval, alibi_lm.probes): its app module's
        module = importlib.import_module(f"{args.module}.app")
    module.main()


if __name__ == "__main__":
    main()
