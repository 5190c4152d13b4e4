"""The typed configs behind configs/*.yaml.

Every section is a dataclass: LMConfig (model.py) for model.*, one Options dataclass per position
scheme beside it (positions/<scheme>.py) for position.*, and here data.*, tokenizer.*, train.*, eval.*,
logger.*, paths.* and the jobs of the two apps, TrainJob and EvalJob. They are registered in Hydra's
ConfigStore as the schemas that the YAML files extend (so the YAML files hold only what differs from
these defaults), and each validates itself in __post_init__ with a one-line ConfigError: composing a
config and making it typed (to_job) is the whole check of a command line.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from ..errors import ConfigError, check_choice, check_name, check_range
from ..model import LMConfig
from ..positions import scheme_options
from ..positions.rope import check_scaling
from ..tasks import TASKS, task_options
from ..tasks.registry import task_of

DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("auto", "bf16", "fp32")


@dataclass
class PathsConfig:
    runs: str = "runs"  # runs/<name>/<position>-L<L>-seed<seed>/
    # <results>/<name>/extrapolation.csv and the report. None: beside the runs, <runs>/<name>/results (git-ignored),
    # filled in by TrainJob; only the committed experiments (configs/experiment/cpu-wt2.yaml, tasks.yaml) set
    # results, so that no trial, custom setting or Python run writes next to the committed results
    results: str | None = None
    cache: str = ".cache/alibi-lm"  # tokenized splits


@dataclass
class SubjectPathsConfig(PathsConfig):
    # None: where the run's own experiment writes (its config.yaml's paths.results: runs/<name>/results, or results
    # for a committed experiment's), so that scoring a trial run again never lands in results/; a Hugging Face
    # model: <runs>/<hf.experiment>/results
    results: str | None = None


@dataclass
class DataConfig:
    """A WikiText-style data set, the data.* keys (configs/data/): a local copy in
    <root>/<folder>/wiki.{train,valid,test}.tokens (.raw with raw=true), else the hub's."""

    name: str  # names the cache entry and the results' rows
    folder: str  # e.g. wikitext-103
    hub_path: str | None = "Salesforce/wikitext"  # datasets.load_dataset path without a local copy (None: none)
    hub_config: str | None = None  # None: <folder>-v1, or <folder>-raw-v1 with raw=true
    raw: bool = False
    root: str | None = None  # None: $ALIBI_LM_DATA, else ./data (configs/train.yaml resolves it per run)
    cache_dir: str = ".cache/alibi-lm"  # configs/train.yaml: paths.cache

    def __post_init__(self):
        for key in ("name", "folder"):
            if not getattr(self, key):
                raise ConfigError(f"data.{key} is not set; use a config from configs/data/ (e.g. data=wikitext2)")

    @property
    def local_folder(self) -> Path:
        return Path(self.root or os.environ.get("ALIBI_LM_DATA", "data")).expanduser().resolve() / self.folder

    @property
    def hub_config_name(self) -> str:
        """The `datasets` config: wikitext-103-v1, or wikitext-103-raw-v1 when raw is true."""
        name = self.hub_config or f"{self.folder}-v1"
        plain = name.replace("-raw-v1", "-v1")
        if not plain.endswith("-v1"):  # not a WikiText-style name: nothing to derive, use it as given
            return name
        return plain.removesuffix("-v1") + "-raw-v1" if self.raw else plain


@dataclass
class TokenizerConfig:
    """The tokenizer.* keys (configs/tokenizer/): word (the paper's), bpe (byte-level BPE) or fairseq (the ids of
    fairseq-preprocess's dictionary, for checkpoints imported with alibi_lm.fairseq_import)."""

    name: str = "word"  # word (the paper's) | bpe | fairseq
    vocab_size: int | None = None  # word: None keeps every type of the training split; bpe: required
    token_dtype: str = "auto"  # ids on disk: auto (uint16 while every id fits, else uint32) | uint16 | uint32

    def __post_init__(self):
        check_choice("tokenizer.name", self.name, ("word", "bpe", "fairseq"))
        check_choice("tokenizer.token_dtype", self.token_dtype, ("auto", "uint16", "uint32"))
        size = self.vocab_size
        if self.name == "bpe" and (not isinstance(size, int) or size < 257):
            raise ConfigError(f"tokenizer.vocab_size must be an integer >= 257 (bytes + <eos>) for bpe, got {size}")
        if self.name == "fairseq" and size is not None:
            raise ConfigError(f"tokenizer.vocab_size must be null for fairseq (its dictionary keeps every type), got {size}")
        if self.name == "word" and size is not None and (not isinstance(size, int) or size < 3):
            raise ConfigError(f"tokenizer.vocab_size must be null or an integer >= 3 for word, got {size}")
        if size is not None:
            check_fits(size, np.uint32 if self.token_dtype == "auto" else self.token_dtype)

    @property
    def settings(self) -> dict:
        """What the cache key covers (token_dtype only when it is not auto, so that entries made before
        it existed stay valid)."""
        settings = {"name": self.name, "vocab_size": self.vocab_size}
        if self.token_dtype != "auto":
            settings["token_dtype"] = self.token_dtype
        return settings


def check_fits(vocab_size: int, dtype) -> None:
    """Every id of a vocabulary of vocab_size types (0 .. vocab_size-1) must fit the token dtype."""
    dtype = np.dtype(dtype)
    if vocab_size - 1 > np.iinfo(dtype).max:
        bigger = "tokenizer.token_dtype=uint32 (or auto)" if dtype == np.uint16 else "a smaller vocabulary"
        raise ConfigError(f"a vocabulary of {vocab_size:,} types does not fit tokenizer.token_dtype={dtype.name} "
                          f"(ids up to {np.iinfo(dtype).max:,}); set tokenizer.vocab_size<={np.iinfo(dtype).max + 1} "
                          f"or {bigger}")


@dataclass
class TrainConfig:
    """The train.* keys: L, the budget, the optimizer and its schedule, and how the run is driven."""

    seq_len: int = 128  # L, the training context length
    batch_size: int = 16  # sequences per optimizer micro-step (per process under DDP)
    grad_accum: int = 1
    max_steps: int | None = 2000  # the budget: exactly one of max_steps and max_tokens is set
    max_tokens: int | None = None  # a token budget; it decides the number of steps
    optimizer: str = "adamw"  # adamw | nag (fairseq's NAG = SGD with Nesterov momentum; the paper's experiment)
    lr: float = 1.0e-3
    momentum: float = 0.99  # nag only (fairseq's default)
    warmup_init_lr: float | None = None  # lr at step 0 of the linear warmup (None: lr / warmup_steps)
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 100
    weight_decay: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    grad_clip: float = 1.0
    eval_every: int = 250  # validation perplexity at L every this many steps
    eval_tokens: int | None = 65536  # validation tokens of each periodic evaluation (None: the whole split)
    checkpoint_every: int = 250
    keep_checkpoints_every: int | None = None  # also keep the weights of every this many steps (checkpoints/step-N.pt)
    resume: bool | str = False  # false | true (continue; error without a checkpoint) | auto (continue if there is one)
    compile: bool = False
    device: str = "auto"  # auto | cpu | cuda
    # auto: bf16 autocast on CUDA, float32 on the CPU | bf16 | fp32 (float32 on a GPU too: numbers comparable
    # with a CPU run's). Evaluating the run (evaluate, probes) uses the same unless their precision= says
    precision: str = "auto"
    threads: int | None = None  # torch CPU threads (None: $OMP_NUM_THREADS, else the cores this process may use)
    progress: bool = True
    evaluate_after: bool = False  # the extrapolation evaluation (eval.*) when training ends (sweeps do)
    # synthetic tasks (task=...): each step's length is drawn from [min_seq_len, seq_len] (None: seq_len / 4, at
    # least the task's shortest), and the positions handed to the scheme are 0..T-1 (sequential) or, with
    # positions=random, a sorted random subset of [0, max_position) (Ruoss et al. 2023), also at evaluation
    min_seq_len: int | None = None
    positions: str = "sequential"  # sequential | random
    max_position: int | None = None  # positions=random: M, at least the longest evaluation length
    # synthetic tasks: end training at the first validation whose exact match at L reaches this (Zoology stops
    # at 0.99), so that a solved task spends no more steps; None trains the whole budget
    stop_at_accuracy: float | None = None
    # a short fine-tune (training/finetune.py): start from this completed run's weights, and spend finetune_fraction
    # of the tokens it trained on (the budget then: set max_steps and max_tokens to null)
    init_from: str | None = None
    finetune_fraction: float | None = None
    # a RoPE fine-tune with one of RoPE's rescalings (linear = Position Interpolation, ntk, yarn, llama3) at factor
    # s = seq_len / the parent's L, in training and at every later load of the run (finetune.json records it)
    finetune_scaling: str | None = None

    def __post_init__(self):
        for key in ("seq_len", "batch_size", "grad_accum", "max_steps", "max_tokens", "eval_every", "checkpoint_every",
                    "keep_checkpoints_every", "eval_tokens", "threads", "min_seq_len", "max_position"):
            check_range(f"train.{key}", getattr(self, key), 1)  # counts: None where a key may be unset
        check_range("train.lr", self.lr, 0, low_open=True)
        check_range("train.warmup_steps", self.warmup_steps, 0)
        check_range("train.momentum", self.momentum, 0, 1, high_open=True)
        check_range("train.warmup_init_lr", self.warmup_init_lr, 0)
        check_range("train.min_lr_ratio", self.min_lr_ratio, 0, 1)
        check_range("train.weight_decay", self.weight_decay, 0)
        check_range("train.grad_clip", self.grad_clip, 0, low_open=True)
        if len(self.betas) != 2:
            raise ConfigError(f"train.betas must be two numbers (Adam's beta1, beta2), got {list(self.betas)}")
        for i, beta in enumerate(self.betas):
            check_range(f"train.betas[{i}]", beta, 0, 1, high_open=True)
        if self.finetune_fraction is not None:
            if not self.init_from:
                raise ConfigError(f"train.finetune_fraction={self.finetune_fraction} needs "
                                  f"train.init_from=<the run folder to fine-tune>")
            check_range("train.finetune_fraction", self.finetune_fraction, 0, low_open=True)  # inf: no budget
            if self.max_steps is not None or self.max_tokens is not None:
                raise ConfigError("train.finetune_fraction sets the budget: add train.max_steps=null train.max_tokens=null")
        elif (self.max_steps is None) == (self.max_tokens is None):
            raise ConfigError(f"set exactly one training budget, got train.max_steps={self.max_steps} and "
                              f"train.max_tokens={self.max_tokens}; to train by steps add train.max_tokens=null "
                              f"(experiments set max_tokens), to train by tokens add train.max_steps=null")
        if self.finetune_scaling is not None:
            check_finetune_scaling(self.finetune_scaling, self.init_from)
        check_choice("train.optimizer", self.optimizer, ("adamw", "nag"))
        check_choice("train.resume", self.resume, (True, False, "auto"))
        check_device(self.device, "train.device")
        check_choice("train.precision", self.precision, PRECISIONS)
        check_choice("train.positions", self.positions, ("sequential", "random"))
        if self.positions == "random" and (self.max_position is None or self.max_position < self.seq_len):
            raise ConfigError(f"train.positions=random draws positions from [0, train.max_position), which must be "
                              f">= train.seq_len={self.seq_len} and cover the longest evaluation length, got "
                              f"{self.max_position}; e.g. train.max_position={16 * self.seq_len}")
        if self.stop_at_accuracy is not None and not 0 < self.stop_at_accuracy <= 1:
            raise ConfigError(f"train.stop_at_accuracy is an exact match at L (the validation metric of a task) in "
                              f"(0, 1], got {self.stop_at_accuracy}; e.g. train.stop_at_accuracy=0.99, or null to train "
                              f"the whole budget")
        if self.min_seq_len is not None and self.min_seq_len > self.seq_len:
            raise ConfigError(f"train.min_seq_len={self.min_seq_len} exceeds train.seq_len={self.seq_len}")


DEFAULT_TASK_EXAMPLES = 256  # eval.examples of a task run that names none (experiment=tasks: 1,024)


@dataclass
class EvalConfig:
    """The eval.* keys: perplexity at evaluation lengths Lv = multiplier x L and/or explicit lengths."""

    split: str = "valid"  # valid | test
    mode: str = "nonoverlapping"  # nonoverlapping (the paper's main protocol) | sliding
    stride: int | None = None  # sliding only: window step S (1 = the paper's Tables 13-15)
    multipliers: list[float] = field(default_factory=lambda: [1, 2, 4, 8])
    lengths: list[int] = field(default_factory=list)  # explicit Lv values, added to multipliers x L
    tokens_per_batch: int = 16384  # the batch size follows Lv so that memory stays flat
    # synthetic tasks: sequences scored per length (fixed test sequences, the same for every run); null: the run's own
    # (its config.yaml's eval.examples, as its evaluate_after scored it), else DEFAULT_TASK_EXAMPLES
    examples: int | None = None
    # full | bca: blockwise causal attention (the xPos paper's evaluation): blocks of L tokens from the window's
    # start, each query attending to its own block and the one before; rows carry it (scheme "xpos+bca")
    attention: str = "full"
    # Llama 4's attention temperature tuning (HF's attn_temperature_tuning, floor_scale, attn_scale): queries at
    # position p times 1 + attn_scale log(floor((p + 1) / floor_scale) + 1); floor_scale null: the run's L. Every
    # layer, or only the NoPE layers of a mix (model.nope_every), as Llama 4; rows carry it (alibi+temperature)
    temperature_tuning: bool = False
    floor_scale: int | None = None
    attn_scale: float = 0.1
    max_tokens: int | None = None  # score only the first N tokens of the split (None: all of it)
    skip_done: bool = False  # leave out lengths whose row is already in results/<name>/extrapolation.csv
    # key-token perplexity (LongPPL, Fang et al. 2025) beside ppl: targets whose loss with the context cut to L is
    # more than longppl_alpha above their full-context loss, which is below longppl_beta (nats); costs one more pass at L
    longppl: bool = False
    longppl_alpha: float = 2.0
    longppl_beta: float = 2.0

    def __post_init__(self):
        check_choice("eval.mode", self.mode, ("nonoverlapping", "sliding"))
        check_choice("eval.attention", self.attention, ("full", "bca"))
        check_choice("eval.split", self.split, ("valid", "test"))
        if not [*self.lengths, *self.multipliers]:
            raise ConfigError("no evaluation lengths: set eval.multipliers=[1,2,4,8] or eval.lengths=[...]")
        for key, example in (("multipliers", "[1,2,4,8]"), ("lengths", "[64,128]")):
            if any(not 1 <= x < math.inf for x in getattr(self, key)):  # NaN fails both comparisons
                raise ConfigError(f"eval.{key} must hold finite numbers >= 1, got {list(getattr(self, key))}; "
                                  f"e.g. eval.{key}={example}")
        if self.examples is not None and self.examples < 1:
            raise ConfigError(f"eval.examples must be >= 1, got {self.examples}")
        if self.floor_scale is not None and self.floor_scale < 1:
            raise ConfigError(f"eval.floor_scale must be >= 1 (or null: the run's L), got {self.floor_scale}")
        if self.mode == "sliding" and (self.stride is None or self.stride < 1):
            raise ConfigError(f"eval.stride must be >= 1 with eval.mode=sliding, got {self.stride}; set eval.stride=<tokens "
                              f"between windows> (eval.stride=1: every target with the longest context)")
        for key in ("stride", "tokens_per_batch", "max_tokens"):  # max_tokens: null scores the whole split
            check_range(f"eval.{key}", getattr(self, key), 1)
        check_range("eval.attn_scale", self.attn_scale, 0)
        check_range("eval.longppl_alpha", self.longppl_alpha, 0)
        check_range("eval.longppl_beta", self.longppl_beta, 0, low_open=True)


@dataclass
class WandbConfig:
    mode: str = "offline"  # offline (wandb sync later) | online | disabled
    project: str = "alibi-lm"
    entity: str | None = None

    def __post_init__(self):
        check_choice("logger.wandb.mode", self.mode, ("offline", "online", "disabled"))


@dataclass
class LoggerConfig:
    wandb: WandbConfig = field(default_factory=WandbConfig)


@dataclass(kw_only=True)
class TrainJob:
    """Everything `python -m alibi_lm.train` runs from: configs/train.yaml composes one (a test may build
    one directly). model.position and model.position_options follow the position group (train.yaml)."""

    name: str = "default"  # experiment name: runs/<name>/..., results/<name>/...
    seed: int = 0
    position: Any = None  # the chosen scheme's Options (configs/position/), the handle of position.* overrides
    task: Any = None  # the chosen task's Options (configs/task/), the handle of task.* overrides
    task_name: str = "lm"  # which task (train.yaml: the task group's choice); lm reads data=
    model: LMConfig = field(default_factory=LMConfig)
    data: DataConfig
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)

    def __post_init__(self):
        if self.paths.results is None:  # beside the runs (PathsConfig)
            self.paths.results = str(Path(self.paths.runs, self.name, "results"))
        check_name("name", self.name)  # runs/<name>/, results/<name>/
        check_range("seed", self.seed, 0)
        model, tc = self.model, self.train
        options = scheme_options(model.position, model.position_options)
        options.check(model.n_head, model.d_model, tc.seq_len)
        if tc.finetune_scaling is not None and model.position != "rope":
            raise ConfigError(f"train.finetune_scaling={tc.finetune_scaling} rescales RoPE's frequencies, not "
                              f"position={model.position}'s; drop it (other schemes are fine-tuned as they are)")
        if self.task is not None and not isinstance(self.task, dict | DictConfig):
            self.task_name = task_of(self.task)  # a TrainJob built in Python names its task by its options
        self.task = task_options(self.task_name, self.task)
        synthetic = TASKS[self.task_name].synthetic
        if tc.positions == "random":
            if not synthetic:
                raise ConfigError("train.positions=random is for synthetic tasks (task=passkey, ...): language-model "
                                  "evaluation scores sequential windows; drop train.positions")
            try:  # a learned table shorter than M
                options.check(model.n_head, model.d_model, tc.max_position)
            except ConfigError as e:
                raise ConfigError(f"train.positions=random draws positions up to train.max_position={tc.max_position}, "
                                  f"which position={model.position} cannot take: {e}") from None
            scored = [int(round(m * tc.seq_len)) for m in self.eval.multipliers or []] + list(self.eval.lengths or [])
            if tc.evaluate_after and max(scored, default=0) > tc.max_position:  # found after training, else
                raise ConfigError(f"train.evaluate_after scores lengths up to {max(scored)}, beyond train.max_position="
                                  f"{tc.max_position}, the range this run's randomized positions come from; set "
                                  f"train.max_position={max(scored)} or lower eval.multipliers")
        if tc.stop_at_accuracy is not None and not synthetic:
            raise ConfigError("train.stop_at_accuracy stops at an exact match at L, which only synthetic tasks "
                              "(task=passkey, ...) measure; drop train.stop_at_accuracy")
        if synthetic:
            task = TASKS[self.task_name](self.task)
            shortest = tc.min_seq_len or max(task.min_length, tc.seq_len // 4)
            if tc.seq_len < task.min_length:
                raise ConfigError(f"task={self.task_name} needs sequences of at least {task.min_length} positions, but "
                                  f"train.seq_len={tc.seq_len}; raise train.seq_len, or make the task smaller")
            if shortest < task.min_length:
                raise ConfigError(f"task={self.task_name} needs sequences of at least {task.min_length} positions, but "
                                  f"train.min_seq_len={shortest}; raise it to {task.min_length} or more")


@dataclass
class RopeScalingConfig:
    """position.* of the evaluate app: the inference-time extension of a run trained with position=rope
    (docs/extension.md); the rope scheme checks the settings (positions/rope.py)."""

    scaling: str | None = None  # null | linear | ntk | dynamic | yarn (Hugging Face transformers' formulas)
    scaling_factor: float | None = None  # null: Lv / L at each evaluation length (1 for dynamic)

    def __post_init__(self):
        check_scaling(self.scaling, self.scaling_factor)


@dataclass
class HFConfig:
    """hf.* (evaluate and probes apps): only for run=hf:<folder>, a Hugging Face causal LM (alibi_lm/subjects/hf.py)."""

    train_len: int | None = None  # its training length L (None: its config's max_position_embeddings or n_positions;
    # a model whose config names none, such as BLOOM's, needs it for multipliers x L, not for eval.lengths)
    experiment: str = "hf"  # its rows go to paths.results/<experiment>/
    trust_remote_code: bool = False  # run Python code shipped in the model's folder (custom architectures): only
    # for a folder you trust, since that code runs with your permissions

    def __post_init__(self):
        if self.train_len is not None and not self.train_len >= 1:
            raise ConfigError(f"hf.train_len must be a positive integer (or null), got {self.train_len!r}")
        if not self.experiment:
            raise ConfigError("hf.experiment must name a folder under paths.results, e.g. hf.experiment=hf")
        check_name("hf.experiment", self.experiment)


def run_results_root(run_dir: Path) -> Path:
    """Where a run's evaluations write results/<experiment>/: the paths.results its config.yaml saved, else
    results/ beside the run's experiment folder."""
    try:
        saved = OmegaConf.select(OmegaConf.load(Path(run_dir, "config.yaml")), "paths.results")
    except Exception:  # no or a damaged config.yaml: opening the run reports it in one line
        saved = None
    return Path(saved) if isinstance(saved, str) and saved else Path(run_dir).parent / "results"


@dataclass(kw_only=True)
class SubjectJob:
    """The keys of a job that opens one model under test (alibi_lm/subjects/): the evaluate app's EvalJob
    and the probes app's ProbesJob (alibi_lm/probes/config.py)."""

    run: str | None = None  # a run folder, or hf:<folder>; None: the most recently trained run under paths.runs
    device: str = "auto"  # auto | cpu | cuda
    precision: str = "auto"  # auto: the run's train.precision (a Hugging Face model: bf16 on CUDA) | bf16 | fp32
    paths: SubjectPathsConfig = field(default_factory=SubjectPathsConfig)  # rows: paths.results/<the run's experiment>/
    data: DataConfig | None = None  # run=hf: only (data=wikitext2): the text to score; a trained run reads its own
    hf: HFConfig = field(default_factory=HFConfig)
    # score a run whose status.json says failed or whose weights are not finite (refused otherwise); its rows say so
    allow_failed_run: bool = False

    def __post_init__(self):
        check_device(self.device, "device")
        check_choice("precision", self.precision, PRECISIONS)

    def results_root(self, run_dir: Path | None = None) -> Path:
        """paths.results if set, else the run's own (run_dir, else run=), else beside the runs: the run folder's
        experiment's results/ (a config.yaml without the key), <runs>/<hf.experiment>/results for a Hugging Face model."""
        if self.paths.results is not None:
            return Path(self.paths.results)
        run_dir = run_dir or (Path(self.run) if self.run and not self.run.startswith("hf:") else None)
        return run_results_root(run_dir) if run_dir else Path(self.paths.runs, self.hf.experiment, "results")


@dataclass(kw_only=True)
class EvalJob(SubjectJob):
    """Everything `python -m alibi_lm.eval` runs from (configs/eval.yaml)."""

    eval: EvalConfig = field(default_factory=EvalConfig)
    position: RopeScalingConfig = field(default_factory=RopeScalingConfig)
    # a training-free extension past L (configs/extension/<method>.yaml, alibi_lm.extension): its options, or None
    extension: Any = None


# RoPE's rescalings a fine-tune may train with (train.finetune_scaling): dynamic grows its base with each length, so
# no one factor s holds for training at s L and scoring at L..16L alike
FINETUNE_SCALINGS = ("linear", "ntk", "yarn", "llama3")


def check_finetune_scaling(name: str, init_from: str | None) -> None:
    if name not in FINETUNE_SCALINGS:
        raise ConfigError(f"train.finetune_scaling must be one of {', '.join(FINETUNE_SCALINGS)} (or null), got {name!r}")
    if not init_from:
        raise ConfigError(f"train.finetune_scaling={name} rescales a fine-tune by s = train.seq_len / its parent's L: add "
                          f"train.init_from=<the run folder to fine-tune> (and train.finetune_fraction), or drop it")


def check_device(name: str, key: str) -> None:
    if not name.startswith("cuda:"):  # cuda:<index>, or one of DEVICES
        check_choice(key, name, DEVICES)
