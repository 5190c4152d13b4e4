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
    sections: set[str]  # train (1, 2, 4), eval (3: tokens/s), memory (3: peak memory), threads (5)
    out: Path
    quick: bool
    argv: list[str]  # as given, for the report's command line
    overrides: tuple[str, ...] = ()  # extra Hydra overrides for every alibi-lm model (--override)
    thread_seconds: float = 3.0  # section 5: seconds of training per cell and pass
    thread_reps: int = 2  # section 5: passes over its four cells (alternating order)
    compile: bool = False  # --compile: training steps through torch.compile(model), as train.compile=true
    dropout_rows: bool = True  # on CUDA, the "(dropout 0)" rows (FlexAttention) beside each scheme as configured

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"
