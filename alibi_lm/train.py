"""Train a decoder LM with one position scheme at context length L.

    python -m alibi_lm.train position=rope train.seq_len=256
    python -m alibi_lm.train -m position=sinusoidal,learned,t5,rope,alibi,nope
    torchrun --nproc_per_node=2 -m alibi_lm.train experiment=quick data=wikitext2

Each run writes into its own folder (runs/<name>/<position>-L<L>-seed<seed>/): config.yaml,
tokenizer.json, checkpoint.pt (atomic, latest), log.jsonl and status.json. One process at a time
trains a folder (.lock); a killed run continues from its last checkpoint with train.resume=true
(or auto), to the same weights as a run that was never stopped. Without Hydra:
Trainer(job, run_dir).run() with a TrainJob (alibi_lm.config).
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

import torch.distributed as dist

from . import cli
from .attention import flex_min_head_dim, narrow_head_error
from .checkpoint import lock_run, read_status, remove_stale_temporaries
from .config import TrainJob, check_writable, resolve_device
from .data import check_data
from .errors import UserError, write_error
from .naming import custom_name
from .training.distributed import end_rank_process, setup_distributed
from .training.finetune import check_not_own_parent
from .training.reuse import NOT_MODEL_KEYS, check_same_run, resume_wanted
from .training.run_log import check_committed_run
from .training.streams import is_synthetic


def train(job: TrainJob, run_dir: Path) -> dict:
    """Train `job` in run_dir (rank 0 holding the folder's lock), under torchrun on every rank."""
    from .training.trainer import Trainer  # import cost: --help and one-line errors need not load evaluation's pandas

    rank, world = setup_distributed(job.train.device)
    try:
        if rank != 0:
            return Trainer(job, run_dir, rank, world).run()
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise write_error(run_dir, e) from e
        if not os.access(run_dir, os.W_OK):
            raise UserError(f"run folder {run_dir} is not writable; fix its permissions or set paths.runs=<a writable folder>")
        with lock_run(run_dir):  # a second process on this folder (a sweep started twice) stops here
            remove_stale_temporaries(run_dir)  # what a kill during a write left; no one else writes here now
            return Trainer(job, run_dir, rank, world).run()
    finally:
        if dist.is_initialized():
            # the Trainer sits in reference cycles, so its DDP wrapper, which holds the process group and gloo's
            # threads, lives until a garbage collection: collected here, not in the interpreter's teardown, where
            # a gloo thread still running aborts the process (SIGABRT after a run that finished well)
            gc.collect()
            dist.destroy_process_group()


# ---- the preflight: what a job reads and writes, checked before Hydra creates its folder -----------------

def check(job: TrainJob, run_dir: Path | None) -> None:
    if not is_synthetic(job):
        check_data(job.data)  # split files present and text (their first 64 KiB), or the hub reachable
    device = resolve_device(job.train.device, "train.device")
    head_dim = job.model.d_model // job.model.n_head
    on_cuda_flex = job.model.attention == "flex" and device.type == "cuda"  # (on CPU it is inference only)
    if on_cuda_flex and head_dim < flex_min_head_dim(device):
        raise narrow_head_error(head_dim, device)
    check_writable(job.paths.runs, "paths.runs")
    check_committed_run(job)  # a trial under a committed experiment's own name= would replace its rows
    if job.train.evaluate_after:
        check_writable(job.paths.results, "paths.results")
    if run_dir is not None:
        check_writable(run_dir, "hydra.run.dir")
        check_not_own_parent(job.train.init_from, run_dir)
        if resume_wanted(job.train.resume, run_dir) or read_status(run_dir)["status"] == "completed":
            check_same_run(job, run_dir)


def __getattr__(name: str):
    """`from alibi_lm.train import Trainer` as before the trainer had a module of its own, loaded when asked for."""
    if name == "Trainer":
        from .training.trainer import Trainer  # import cost: evaluation's pandas, which --help and errors never need

        return Trainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    cli.main("train", train, check, rename=lambda args: custom_name(args, NOT_MODEL_KEYS))
    end_rank_process()  # reached only when the command finished well (errors and stops exit inside cli.main)


if __name__ == "__main__":
    main()
