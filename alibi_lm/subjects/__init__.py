"""The model under test, whichever kind it is, opened in one place: a run folder written by alibi_lm.train
(native.py) or a Hugging Face causal LM (run=hf:<folder>, hf.py). Evaluation and the probes see only the Subject
protocol (base.py).

base.py    the Subject and Scorer protocols, digit_ids
native.py  a trained run folder (NativeSubject, NativeScorer, load_run)
hf.py      a Hugging Face causal LM (HFSubject, HFScorer)
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..config import check_writable, resolve_device
from . import hf
from .base import NOT_APPLICABLE, Scorer, Subject, digit_ids
from .native import NativeScorer, NativeSubject, check_run_dir, load_run, open_native, run_skeleton


def open_subject(job, run, device: torch.device) -> Subject:
    """The model under test of a job that opens one (a config.SubjectJob: an EvalJob, a ProbesJob): run=hf:<folder>
    (the job's hf.* and data keys) or a run folder (scored into the job's results root, at job.precision)."""
    if hf.is_hf(run):
        return hf.open_hf(job, device)
    return open_native(Path(run), job.results_root(Path(run)), device, job.precision, job.allow_failed_run)


def check_job(job, output_dir=None, needs_train_len: bool = True) -> None:
    """The preflight of a job that opens a Subject (a config.SubjectJob: an EvalJob, a ProbesJob): the device,
    the run folder (or run=hf:'s model and data; needs_train_len: its L must be known) and the results folder."""
    resolve_device(job.device)
    if hf.is_hf(job.run):
        hf.check(job, needs_train_len)
    elif job.run:
        check_run_dir(Path(job.run))
    check_writable(job.results_root(), "paths.results")


__all__ = ["NOT_APPLICABLE", "NativeScorer", "NativeSubject", "Scorer", "Subject", "check_job", "check_run_dir",
           "digit_ids", "load_run", "open_native", "open_subject", "run_skeleton"]
