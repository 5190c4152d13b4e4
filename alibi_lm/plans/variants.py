"""The 2024-2026 variants of registered schemes that make reproduce, make tasks and make bench run beside the
schemes themselves: a name -> the overrides that train one (python -m alibi_lm.train <overrides> ...).

A variant is not a scheme (the registry, alibi_lm.positions, is the only list of those): it is a scheme with
options or model settings that position_label names, so its run folder and rows carry a label of their own
(fox+rope, rope+nope4-w64, nope+ssmax), which run_label() gives for an experiment and L.
"""

from __future__ import annotations

import functools

from hydra.errors import HydraException

from alibi_lm.cli import describe
from alibi_lm.config import compose, to_job
from alibi_lm.errors import UserError
from alibi_lm.model import position_label
from alibi_lm.positions import POSITION_SCHEMES

VARIANTS = {
    "fox+rope": ["position=fox", "position.rope=true"],  # FoX with RoPE (Lin et al. 2025's FoX (Pro) ablation)
    # iRoPE: NoPE in the last of every n_layer layers (Llama 4: 1 in 4; the 2-layer task model: 1 in 2), RoPE
    # elsewhere; with a sliding window of L/2 on the RoPE layers (Cohere's RNoPE-SWA, Yang et al. 2025)
    "irope": ["position=rope", "model.nope_every={n_layer}"],
    "irope-window": ["position=rope", "model.nope_every={n_layer}", "model.local_window={half_L}"],
    "alibi+ssmax": ["position=alibi", "model.ssmax=true"],  # Scalable-Softmax (Nakanishi 2025)
    "nope+ssmax": ["position=nope", "model.ssmax=true"],
    "rope+qk_norm": ["position=rope", "model.qk_norm=true"],  # Llama 4, OLMo 2; Cohere: it flattens long range
    "alibi+learn_slopes": ["position=alibi", "position.learn_slopes=true"],  # from the official slopes
}


@functools.cache
def experiment_model(experiment: str):
    """The model config (LMConfig) that experiment `experiment` trains by default."""
    return to_job(compose("train", [f"experiment={experiment}"])).model


def n_layer(experiment: str) -> int:
    return int(experiment_model(experiment).n_layer)


def model_overrides(name: str, layers: int, seq_len: int) -> list[str]:
    """The training overrides of a variant for a model of `layers` layers at L = seq_len ({n_layer} and {half_L}
    filled in), or position=<name> for a registered scheme."""
    return [o.format(n_layer=layers, half_L=seq_len // 2) for o in VARIANTS.get(name, [f"position={name}"])]


def overrides(name: str, experiment: str, seq_len: int) -> list[str]:
    """model_overrides() for the model of experiment `experiment`."""
    return model_overrides(name, n_layer(experiment), seq_len)


@functools.cache
def run_label(name: str, experiment: str, seq_len: int, extra: tuple[str, ...] = (), context: tuple[str, ...] = ()) -> str:
    """The position label of a scheme or variant as the train app names its run folder (rope+nope4-w64), for
    experiment `experiment` at L = seq_len, with the further overrides `extra`; `context` chooses what the extra
    overrides may need (task=copy for task.alphabet=64)."""
    model = experiment_model(experiment)
    if name not in VARIANTS and not extra and position_label(model) == model.position:  # nothing labeled
        return name
    cell = [f"experiment={experiment}", f"train.seq_len={seq_len}", *context, *overrides(name, experiment, seq_len),
            *extra]
    return position_label(to_job(compose("train", cell)).model)


def check_extra(parser, schemes: list[str], experiment: str, seq_len: int, extra: list[str],
                tasks: list[str] | None = None) -> None:
    """parser.error (one line, exit 2) when the extra overrides do not apply to one of the schemes (or, given
    `tasks`, to one of the tasks), e.g. position.gate_bias_init=5 with alibi, which has no such option, or
    task.alphabet=64 with task=mqar: before any step runs. Overrides that fit no cell at all (train.lrr=3) are
    named as the app names them, with its "did you mean", not as a scheme's."""
    failures = {name: extra_failures(name, experiment, seq_len, extra, tasks) for name in (schemes if extra else [])}
    failing = {name: failed for name, failed in failures.items() if failed}
    if not failing:
        return
    cells = len(tasks or [None])
    if len(failing) == len(schemes) and all(len(failed) == cells for failed in failing.values()):
        first = next(iter(next(iter(failing.values())).values()))
        parser.error(f"the extra overrides {' '.join(extra)} fit no run of the plan: {describe(first, 'train')}")
    name, failed = next(iter(failing.items()))
    task, first = next(iter(failed.items()))
    which, subset = (name, "--schemes naming only the schemes") if len(failed) == cells \
        else (f"{name} on task={task}", "--tasks naming only the tasks")
    # Hydra's own first line: the app's "misspelled? +key adds one" would mislead where other cells take the key
    parser.error(f"{which} cannot take the extra overrides {' '.join(extra)} ({str(first).strip().splitlines()[0]}); "
                 f"run it apart, with {subset} they apply to")


def extra_failures(name: str, experiment: str, seq_len: int, extra: list[str],
                   tasks: list[str] | None) -> dict[str | None, Exception]:
    """task (None: no task) -> the error that composing scheme `name` with the extra overrides there raised."""
    failed = {}
    for task in tasks or [None]:
        try:
            run_label(name, experiment, seq_len, tuple(extra), (f"task={task}",) if task else ())
        except (HydraException, UserError) as e:
            failed[task] = e
    return failed


def known(name: str) -> bool:
    return name in POSITION_SCHEMES or name in VARIANTS
