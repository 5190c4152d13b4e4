"""The eval app (configs/eval.yaml; `make eval`, or its alias `make eval-extrapolation`): a trained run (or any
Hugging Face causal LM) at several evaluation lengths Lv, rows into results/<experiment>/extrapolation.csv
(evaluation.py).

    python -m alibi_lm.eval                                   # the latest run under runs/
    python -m alibi_lm.eval run=runs/quick/alibi-L64-seed0 eval.multipliers=[1,2,4,8,16]
    python -m alibi_lm.eval eval.mode=sliding eval.stride=1 eval.max_tokens=20000
    python -m alibi_lm.eval run=runs/quick/rope-L64-seed0 extension=yarn          # RoPE extension (position.scaling=yarn)
    python -m alibi_lm.eval run=runs/quick/alibi-L64-seed0 extension=lm_infinite eval.longppl=true
    python -m alibi_lm.eval run=hf:<folder> data=wikitext2 eval.lengths=[512,1024]   # subjects/hf.py
"""

from __future__ import annotations

from pathlib import Path

from .. import cli
from ..checkpoint import latest_run
from ..config import EvalJob, resolve_device
from ..errors import UserError
from ..extension import RESCALINGS, method_of
from ..subjects import check_job, hf, open_subject
from .evaluation import Evaluation, evaluate_run
from .extension import check_method_fits


def evaluate(job: EvalJob, output_dir=None) -> list[dict]:
    if hf.is_hf(job.run):  # a Hugging Face model: no run folder, so no task run and no learned values
        return Evaluation(open_subject(job, job.run, resolve_device(job.device)), job.eval, position_cfg=job.position,
                          extension_cfg=job.extension).run()
    run_dir = Path(job.run) if job.run else latest_run(Path(job.paths.runs))
    return evaluate_run(run_dir, job.eval, job.results_root(run_dir), device=job.device, position_cfg=job.position,
                        allow_failed=job.allow_failed_run,
                        precision=job.precision, extension_cfg=job.extension)


def check(job: EvalJob, output_dir=None) -> None:
    """Preflight: the device, the model, the results folder; a Hugging Face model's L only without eval.lengths
    (with them, a model whose config names no L is scored at eval.lengths alone); an extension that remaps positions
    is not combined with eval.attention=bca (the model refuses the pair only once it runs); a run's scheme takes
    the extension chosen (each run of a sweep, before the first is scored)."""
    check_job(job, output_dir, needs_train_len=not job.eval.lengths)
    if job.run and not hf.is_hf(job.run):
        check_method_fits(Path(job.run), job.position, job.extension)
    if job.extension is not None and job.eval.attention != "full" and method_of(job.extension) not in RESCALINGS:
        raise UserError(f"extension={method_of(job.extension)} remaps positions over full attention, and "
                        f"eval.attention={job.eval.attention} limits it: two changes at evaluation that do not combine; "
                        f"drop one")


def main() -> None:
    cli.main("eval", evaluate, check)
