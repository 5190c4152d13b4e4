"""The resolved settings of one benchmark run (cli.py builds them from the command line)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .harness import RoundPlan


@dataclass
class Options:
    device: torch.device
    model: str  # the model preset (configs/model/<model>.yaml)
    lengths: list[int]  # training lengths L
    eval_length: int  # the L of the evaluation sweep Lv = L..16L
    tokens_per_step: int  # training tokens per step at every L
    schemes: list[str]
    mem_schemes: list[str]
    mem_multipliers: list[int]
    train_plan: RoundPlan  # paired rounds of the training sections
    eval_plan: RoundPlan  # fixed repetitions of the evaluation speed section
    peers: bool
    sections: set[str]  # train (1, 2, 4), eval (3: tokens/s), memory (3: peak memory)
    out: Path
    quick: bool
    argv: list[str]  # as given, for the report's command line
    overrides: tuple[str, ...] = ()  # extra Hydra overrides for every alibi-lm model (--override)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"
