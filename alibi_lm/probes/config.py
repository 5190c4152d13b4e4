"""The probes app's typed job (configs/probes.yaml extends `probes_schema`): ProbesJob with its passkey.*
and context.* sections, each validating itself in __post_init__ with a one-line ConfigError, like the
jobs of alibi_lm/config.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore

from ..config import SubjectJob
from ..errors import ConfigError, check_choice, check_name

PROBES = ("passkey", "context", "all")
KEY_PLACEHOLDER = "{key}"


def at_least(key: str, value, low, allow_none: bool = False) -> None:
    """value >= low (or None when allowed), else a ConfigError naming the key."""
    if (value is None and not allow_none) or (value is not None and not value >= low):
        raise ConfigError(f"{key} must be {'an integer' if isinstance(low, int) else 'a number'} >= {low:g}"
                          f"{' or null' if allow_none else ''}, got {value!r}")


@dataclass
class PasskeyConfig:
    """passkey.*: the prompt grid (Lv x depth) and its texts (alibi_lm/probes/passkey_probe.py)."""

    multipliers: list[float] = field(default_factory=lambda: [1, 2, 4, 8, 16])  # prompt lengths Lv = multiplier x L
    lengths: list[int] = field(default_factory=list)  # explicit Lv values, added to multipliers x L
    depths: list[float] = field(default_factory=lambda: [0, 0.25, 0.5, 0.75, 1])  # key statement: 0 first, 1 before the cue
    trials: int = 50  # prompts per (Lv, depth) cell, each with and without the key
    key_tokens: int = 5  # random digits, one token each
    filler: str = "repeat"  # repeat: filler_text over and over (the paper) | valid: a random span of the split
    seed: int = 0  # keys and filler spans per cell come from (seed, Lv, depth)
    # Texts in WikiText's tokenized form (spaces around punctuation); a Hugging Face model sees them detokenized.
    filler_text: str = "The grass is green . The sky is blue . The sun is yellow . Here we go . There and back again ."
    key_text: str = "The pass key is {key} . Remember it . {key} is the pass key ."
    cue_text: str = "What is the pass key ? The pass key is"

    def __post_init__(self):
        lengths = [*self.multipliers, *self.lengths]
        if not lengths:
            raise ConfigError("no passkey lengths: set passkey.multipliers=[1,2,4,8,16] or passkey.lengths=[...]")
        for i, v in enumerate(lengths):
            at_least(f"passkey.multipliers/lengths[{i}]", v, 1.0)
        if not self.depths or not all(0 <= d <= 1 for d in self.depths):
            raise ConfigError(f"passkey.depths must be numbers in [0, 1], got {list(self.depths)}")
        for key, low in (("trials", 1), ("key_tokens", 1), ("seed", 0)):
            at_least(f"passkey.{key}", getattr(self, key), low)
        check_choice("passkey.filler", self.filler, ("repeat", "valid"))
        if KEY_PLACEHOLDER not in self.key_text:
            raise ConfigError(f"passkey.key_text must contain {KEY_PLACEHOLDER} where the key goes, got {self.key_text!r}")


@dataclass
class ContextConfig:
    """context.*: the context-use curve (alibi_lm/probes/context_use.py)."""

    multiplier: float = 16  # the curve covers contexts 1 .. multiplier x L
    stride: int | None = None  # windows start every `stride` tokens (None: a quarter of the window length)
    levels: int = 4  # window lengths Lv, Lv/4, Lv/16, ... (this many, none under 16): short contexts get enough targets
    max_tokens: int | None = None  # use the first N tokens of the split (None: all of it)
    bins_per_octave: int = 4  # log-spaced context bins
    eps: float = 0.01  # c*: smallest c with loss(c') >= loss(c) - eps - z * se(difference) for every longer c' (nats)
    z: float = 2  # standard errors a later bin must beat c by, on top of eps (0: the plain rule)

    def __post_init__(self):
        for key, low in (("multiplier", 1.0), ("stride", 1), ("levels", 1), ("max_tokens", 1), ("bins_per_octave", 1),
                         ("eps", 0.0), ("z", 0.0)):
            at_least(f"context.{key}", getattr(self, key), low, allow_none=key in ("stride", "max_tokens"))


@dataclass(kw_only=True)
class ProbesJob(SubjectJob):
    """Everything `python -m alibi_lm.probes` runs from (configs/probes.yaml): SubjectJob's run (None and no
    sweep: the latest run under paths.runs), device, paths, data and hf, and the probes' own keys."""

    sweep: str | None = None  # an experiment name: every completed run under paths.runs/<sweep>/ (make context-probes)
    probe: str = "all"  # passkey | context | all
    split: str = "valid"  # valid | test: the filler (passkey.filler=valid) and the context-use text
    tokens_per_batch: int = 16384  # the batch size follows the length so that memory stays flat
    skip_done: bool = True  # leave out passkey cells and context curves already in the CSVs (false: redo them)
    passkey: PasskeyConfig = field(default_factory=PasskeyConfig)
    context: ContextConfig = field(default_factory=ContextConfig)
    # a training-free extension past L for the passkey probe (configs/extension/<method>.yaml): its options, or None
    extension: Any = None

    def __post_init__(self):
        super().__post_init__()
        check_choice("probe", self.probe, PROBES)
        if self.extension is not None and self.probe != "passkey":
            raise ConfigError(f"extension= applies to the passkey probe here, not probe={self.probe}; add probe=passkey")
        check_choice("split", self.split, ("valid", "test"))
        at_least("tokens_per_batch", self.tokens_per_batch, 1)
        if self.sweep is not None:
            check_name("sweep", self.sweep)  # paths.runs/<sweep>/
        if self.run and self.sweep:
            raise ConfigError(f"set run= or sweep=, not both (got run={self.run}, sweep={self.sweep})")


ConfigStore.instance().store(name="probes_schema", node=ProbesJob)  # configs/probes.yaml extends it
