"""The scoring protocols moved to alibi_lm/eval/scoring.py; this name remains only because the benchmark
(scripts/bench/evaluation.py) imports it from here."""

from .eval.scoring import ScoreResult, Window, plan_windows, score_stream  # noqa: F401
