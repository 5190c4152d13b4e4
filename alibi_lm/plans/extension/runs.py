"""The comparison's run folders under runs/extension/ and how each is trained, in a fresh process each, one at a
time (train.resume=auto: a killed one resumes at its last checkpoint):

    <scheme>-L64-seed<n>                      a base run, 300 steps at L = 64 (TRAINING_COMMANDS[0])
    <scheme>-L64-seed<n>-ft<s>x<f>[-linear]   its short fine-tune at s L for the fraction f of its tokens; RoPE's
                                              with Position Interpolation (train.finetune_scaling=linear, factor s)
    <scheme>-L256-seed0                       the reference trained from scratch at 4L, with the tokens of the base
                                              run plus its largest fine-tune

A fine-tune or reference folder that is not what the comparison now wants (another parent, scale, fraction or
rescaling in its finetune.json, another length or budget in its config.yaml, or trained from a working tree with
uncommitted changes) is never reused: stale_runs() names it with the fix, and the comparison refuses to start.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from ...checkpoint import CHECKPOINT, load_checkpoint, read_status
from ...config import compose, to_job
from ...errors import UserError
from ...extension import REMAP_METHODS, scheme_kind
from ...positions import POSITION_SCHEMES
from ...provenance import weights_digest
from ...subjects.native import read_finetune_record
from ...training.reuse import other_settings

RESCALINGS_COMPARED = ("linear", "ntk", "yarn")  # RoPE's, beside the remaps
MULTIPLIERS = [1, 2, 4, 8, 16]
PAPER_SCHEMES = ("alibi", "rope", "t5", "nope", "sinusoidal")  # trained and scored first: whole groups early
SCHEMES = (*PAPER_SCHEMES, "kerple_power", "sandwich", "xpos", "kerple_log", "fire")  # then the new ones
BASE_L, TRAIN_STEPS, BASE_BATCH = 64, 300, 32
BASE_TOKENS = TRAIN_STEPS * BASE_BATCH * BASE_L  # 614,400
FINETUNE_SCALES, FINETUNE_FRACTIONS = (2, 4), (0.01, 0.05, 0.125)
FINETUNE_SCALING = {"rope": "linear"}  # RoPE is fine-tuned with Position Interpolation; every other scheme as it is
REFERENCE_SCALE = 4
REFERENCE_TOKENS = round(BASE_TOKENS * (1 + max(FINETUNE_FRACTIONS)))  # 691,200: the base plus its largest fine-tune
DIRTY = "uncommitted"  # how provenance.describe marks a commit whose working tree had uncommitted changes

# how the runs under runs/extension/ are trained (<p> each scheme, <n> its seed; <s> 2 or 4, <f> 0.01, 0.05 or 0.125):
# base_command(), finetune_command() and reference_command() with their values
TRAINING_COMMANDS = [
    "python -m alibi_lm.train experiment=demo name=extension position=<p> seed=<n> train.max_steps=300 "
    "train.eval_every=300 train.checkpoint_every=100 train.device=cpu train.threads=1 train.evaluate_after=false",
    "python -m alibi_lm.train experiment=demo name=extension position=<p> seed=<n> train.seq_len=$((64*<s>)) "
    "train.batch_size=$((32/<s>)) train.init_from=runs/extension/<p>-L64-seed<n> train.finetune_fraction=<f> "
    "train.max_steps=null train.max_tokens=null train.warmup_steps=0 train.lr=5e-4 train.eval_tokens=8192 "
    "train.eval_every=300 train.checkpoint_every=100 train.device=cpu train.threads=1 train.evaluate_after=false "
    "hydra.run.dir=runs/extension/<p>-L64-seed<n>-ft<s>x<f>   # RoPE: plus train.finetune_scaling=linear, and -linear "
    "at the end of its folder; FIRE: plus position.init_threshold=16.0, its parent's L / 4",
    "python -m alibi_lm.train experiment=demo name=extension position=<p> seed=0 train.seq_len=256 train.batch_size=8 "
    "train.max_steps=null train.max_tokens=691200 train.eval_tokens=16384 train.eval_every=300 "
    "train.checkpoint_every=100 train.device=cpu train.threads=1 train.evaluate_after=false "
    "hydra.run.dir=runs/extension/<p>-L256-seed0   # from scratch at 4L: the parent's 614,400 tokens plus the largest "
    "fine-tune's 12.5%",
]


def methods_for(scheme: str) -> list[str]:
    """The methods compared on a scheme: those check_scheme accepts (none for an absolute, content or score one)."""
    kind = scheme_kind(POSITION_SCHEMES[scheme])
    if kind in ("absolute", "content", "score"):
        return []
    remaps = [name for name, cls in REMAP_METHODS.items() if kind != "none" or cls.hides_keys]
    return remaps + (list(RESCALINGS_COMPARED) if scheme == "rope" else [])


def scheme_of_run(run: Path) -> str:
    return run.name.split("-L")[0].split("+")[0]


def train_len_of(run: Path) -> int:
    return int(run.name.split("-L")[1].split("-")[0])


def completed(run: Path) -> bool:
    return read_status(run).get("status") == "completed"


def common_keys(runs_dir: Path) -> list[str]:
    return ["train.checkpoint_every=100", "train.device=cpu", "train.threads=1", "train.evaluate_after=false",
            f"paths.runs={runs_dir.parent}"]


@functools.cache
def parent_length_options(scheme: str) -> tuple[str, ...]:
    """position.<key>=<value> for each of the scheme's options that its config derives from train.seq_len (FIRE's
    init_threshold = L / 4), at the base L: a fine-tune at s L keeps its parent's model (the trainer refuses another)."""
    position = compose("train", ["experiment=demo", f"position={scheme}", f"train.seq_len={BASE_L}"]).position
    return tuple(f"position.{key}={position[key]}" for key in position if OmegaConf.is_interpolation(position, key))


@dataclass(frozen=True)
class Job:
    """One run folder of the comparison: a base run (scale 1, no fraction), a fine-tune (a fraction) or a reference
    trained from scratch at scale x L (no fraction, scale > 1)."""

    scheme: str
    seed: int
    scale: int = 1
    fraction: float | None = None

    @property
    def kind(self) -> str:
        return "finetune" if self.fraction is not None else "reference" if self.scale > 1 else "base"

    @property
    def scaling(self) -> str | None:
        return FINETUNE_SCALING.get(self.scheme) if self.kind == "finetune" else None

    def folder(self, runs_dir: Path) -> Path:
        if self.kind == "reference":
            return runs_dir / f"{self.scheme}-L{self.scale * BASE_L}-seed{self.seed}"
        base = runs_dir / f"{self.scheme}-L{BASE_L}-seed{self.seed}"
        if self.kind == "base":
            return base
        return base.with_name(f"{base.name}-ft{self.scale}x{self.fraction:g}" + (f"-{self.scaling}" if self.scaling else ""))

    def parent(self, runs_dir: Path) -> Path:
        return Job(self.scheme, self.seed).folder(runs_dir)

    def tokens(self) -> int:
        return {"base": BASE_TOKENS, "reference": REFERENCE_TOKENS}.get(self.kind) or round(self.fraction * BASE_TOKENS)

    def command(self, runs_dir: Path) -> list[str]:
        """The training command of this folder (TRAINING_COMMANDS with its values)."""
        head = [sys.executable, "-m", "alibi_lm.train", "experiment=demo", f"name={runs_dir.name}",
                f"position={self.scheme}", f"seed={self.seed}"]
        if self.kind == "base":
            return [*head, f"train.max_steps={TRAIN_STEPS}", f"train.eval_every={TRAIN_STEPS}", *common_keys(runs_dir)]
        length, batch = self.scale * BASE_L, BASE_BATCH // self.scale
        if self.kind == "reference":
            return [*head, f"train.seq_len={length}", f"train.batch_size={batch}", "train.max_steps=null",
                    f"train.max_tokens={REFERENCE_TOKENS}", "train.eval_tokens=16384", f"train.eval_every={TRAIN_STEPS}",
                    *common_keys(runs_dir), f"hydra.run.dir={self.folder(runs_dir)}"]
        return [*head, *parent_length_options(self.scheme), f"train.seq_len={length}", f"train.batch_size={batch}",
                f"train.init_from={self.parent(runs_dir)}",
                f"train.finetune_fraction={self.fraction:g}", "train.max_steps=null", "train.max_tokens=null",
                "train.warmup_steps=0", "train.lr=5e-4", "train.eval_tokens=8192", f"train.eval_every={TRAIN_STEPS}",
                *([f"train.finetune_scaling={self.scaling}"] if self.scaling else []), *common_keys(runs_dir),
                f"hydra.run.dir={self.folder(runs_dir)}"]


def jobs(schemes: list[str], seeds: list[int], finetune_seeds: list[int], reference_schemes: list[str]) -> list[Job]:
    """Every run the comparison wants, scheme by scheme (whole groups early): the base runs, then their fine-tunes
    (s = 2 and 4, each fraction), then the reference from scratch at 4L."""
    out = []
    for scheme in schemes:
        out += [Job(scheme, seed) for seed in seeds]
        out += [Job(scheme, seed, s, f) for seed in finetune_seeds for s in FINETUNE_SCALES for f in FINETUNE_FRACTIONS]
        out += [Job(scheme, 0, REFERENCE_SCALE)] if scheme in reference_schemes else []
    return out


def train(job: Job, runs_dir: Path) -> None:
    """Train a missing run in a fresh process (resume: auto picks up a killed one at its last checkpoint)."""
    run, command = job.folder(runs_dir), job.command(runs_dir)
    print(f"== train {run.name}: {' '.join(command[1:])}", flush=True)
    if subprocess.run(command).returncode != 0 or not completed(run):
        raise UserError(f"training {run} failed (its cli.log says why); fix it and run the comparison again")


def staleness(job: Job, runs_dir: Path) -> str | None:
    """Why an existing folder (a base run, a fine-tune or the reference) is not the run this job wants (None: it is,
    or is absent)."""
    run = job.folder(runs_dir)
    if not (run / "config.yaml").is_file():
        return None
    if any(DIRTY in c for c in read_status(run).get("train_commits", [])):
        return "it was trained from a working tree with uncommitted changes (status.json train_commits)"
    if job.kind == "base":  # the settings the comparison trains its base runs with (another TRAIN_STEPS, model, ...)
        settings = [a for a in job.command(runs_dir)[3:] if not a.startswith("hydra.")]  # hydra.run.dir: the folder
        shown = other_settings(to_job(compose("train", settings)), run)
        return None if shown is None else f"it was trained with other settings ({shown})"
    if job.kind == "finetune":
        record = read_finetune_record(run) or {}
        if Path(record.get("parent", "")).resolve() != job.parent(runs_dir).resolve():
            return f"its finetune.json has parent {record.get('parent')!r}, wanted {str(job.parent(runs_dir))!r}"
        if (why := parent_trained_again(record, job.parent(runs_dir))) is not None:
            return why
        wanted = dict(scale=float(job.scale), fraction=job.fraction, rescaling=job.scaling)
        differ = [f"{k} {record.get(k)!r}, wanted {v!r}" for k, v in wanted.items() if record.get(k) != v]
        return f"its finetune.json has {differ[0]}" if differ else None
    cfg = OmegaConf.load(run / "config.yaml")
    have = (OmegaConf.select(cfg, "train.seq_len"), OmegaConf.select(cfg, "train.max_tokens"))
    wanted = (job.scale * BASE_L, REFERENCE_TOKENS)
    return None if have == wanted else f"its config.yaml has train.seq_len, max_tokens = {have}, wanted {wanted}"


@functools.cache
def checkpoint_digest(path: Path, mtime_ns: int) -> str:
    """The weights digest of a checkpoint, read once per file version (a parent has several fine-tunes)."""
    return weights_digest(load_checkpoint(path, map_location="cpu")["model"])


def parent_trained_again(record: dict, parent: Path) -> str | None:
    """Why a fine-tune no longer starts from its parent's weights (the parent was trained again since, or is gone and
    would be: finetune.json's parent_weights, recorded from the start, differ from the parent's checkpoint), or None
    (a record written before the digest was kept says nothing)."""
    recorded = record.get("parent_weights")
    if recorded is None:
        return None
    if not (parent / CHECKPOINT).is_file():  # the comparison would train a new parent and pair it with this fine-tune
        return f"its parent {parent} is gone (finetune.json parent_weights {recorded}): a new parent would not be its own"
    now = checkpoint_digest(parent / CHECKPOINT, (parent / CHECKPOINT).stat().st_mtime_ns)
    return None if now == recorded else (f"it was fine-tuned from other weights of its parent (finetune.json "
                                         f"parent_weights {recorded}, the parent's now {now}: trained again since)")


def stale_runs(wanted: list[Job], runs_dir: Path) -> list[str]:
    """One line per existing fine-tune or reference folder the comparison must not reuse, naming it and the fix."""
    return [f"{job.folder(runs_dir)} is not the run the comparison wants: {why}; move it aside or delete it, and the "
            f"comparison trains it again" for job in wanted if (why := staleness(job, runs_dir))]
