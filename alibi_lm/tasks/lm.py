"""Language modelling on a WikiText split (data=...): the default task, the paper's. It has no generator:
the trainer reads the data's token stream, and evaluation reports perplexity (alibi_lm.eval)."""

from __future__ import annotations

from .base import Task
from .registry import register


@register("lm")
class LanguageModelling(Task):
    description = "next-token prediction on the data set of data= (perplexity at L..16L; the paper's protocol)"
    synthetic = False
