"""Numbers that the evaluation writes and the tables check the same way, without the heavy libraries (the apps'
--help and one-line errors never load pandas)."""

from __future__ import annotations

import math
import sys

LOG_FLOAT_MAX = math.log(sys.float_info.max)


def perplexity(loss: float) -> float:
    """exp(loss), the ppl the evaluation writes beside its loss; inf past a float's range (a diverged run scored with
    allow_failed_run=true), NaN for NaN."""
    return math.inf if loss > LOG_FLOAT_MAX else math.exp(loss)
