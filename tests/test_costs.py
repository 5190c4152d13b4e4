"""What a long piece of work will cost, printed before it starts (alibi_lm/costs.py): the evaluation's windows and
forward passes per length (scoring.plan_cost, counted without building the windows), training's steps and
windows, the probes' forward passes. No timing is asserted, only the counts and that the lines appear."""

from __future__ import annotations

import io
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import HandMadeSubject
from tqdm import tqdm

from alibi_lm.costs import FirstBatchEstimate, duration, train_estimate, trainer_plan
from alibi_lm.eval import evaluation
from alibi_lm.eval.scoring import plan_cost, plan_windows, score_stream
from alibi_lm.probes import context_use
from alibi_lm.probes import passkey_probe as passkey
from alibi_lm.probes.config import ContextConfig, PasskeyConfig


class Counting:
    """A scorer that counts its forward passes and the tokens they run: loss 1 nat on every target."""

    def __init__(self):
        self.forwards, self.tokens = 0, 0

    def check_positions(self, end):
        pass

    def __call__(self, idx, targets):  # (B, T) each
        self.forwards += 1
        self.tokens += idx.numel()
        return torch.ones(targets.shape)


@pytest.mark.parametrize("n, lv, mode, stride", [(1001, 64, "nonoverlapping", None), (1025, 64, "nonoverlapping", None),
                                                 (1001, 64, "sliding", 1), (1001, 64, "sliding", 16),
                                                 (1001, 128, "sliding", 7), (50, 64, "sliding", 1),
                                                 (50, 64, "nonoverlapping", None)])
def test_plan_cost_counts_what_score_stream_runs(n, lv, mode, stride):
    cost = plan_cost(n, lv, mode, stride, tokens_per_batch=512)
    scorer = Counting()
    score_stream(scorer, np.zeros(n, dtype=np.int64), lv, mode, stride, tokens_per_batch=512)
    assert cost.windows == len(plan_windows(n, lv, mode, stride))
    assert (cost.forwards, cost.tokens) == (scorer.forwards, scorer.tokens)


def test_evaluation_prints_its_plan_before_the_work(tmp_path, capsys):
    stream = np.random.default_rng(0).integers(0, 50, 1001)  # 1000 targets
    subject = HandMadeSubject(Counting(), stream, dict(position="toy", train_len=64, seed=0),
                              dict(run="toy", step=1, weights="w"), tmp_path / "toy")
    ev = evaluation.Evaluation(subject, dict(multipliers=[1, 2], mode="sliding", stride=16, tokens_per_batch=1024),
                               progress=False)
    ev.run()
    out = capsys.readouterr().out
    # Lv = 64: 1 + ceil(936 / 16) = 60 windows, 16 per batch: 4 passes; Lv = 128: 1 + ceil(872 / 16) = 56, 8 per batch: 7
    assert ("plan: 1,000 targets of the valid split at 2 length(s), sliding stride 16: Lv=64: 60 windows in 4 forward "
            "passes; Lv=128: 56 windows in 7 forward passes; 11,008 tokens through the model in all") in out
    assert out.index("plan:") < out.index("estimate: about ")  # the estimate after the first batch
    assert subject.scorer.tokens == 60 * 64 + 56 * 128


def test_training_plan_and_estimate_lines():
    tc = SimpleNamespace(eval_every=4, eval_tokens=256, seq_len=16)
    stream = SimpleNamespace(train_tokens=range(1001), valid_tokens=range(3000))  # language modelling's
    trainer = SimpleNamespace(tc=tc, step=2, steps=10, tokens_per_step=64, stream=stream, first_step=2, t0=0.0)
    line = trainer_plan(trainer)
    # 8 steps of 4 windows; validations at steps 4, 8 and the last (10)
    assert line.startswith("plan: 8 optimizer steps of 4 windows of L = 16 (32 windows, 0.00M tokens, 0.51 epochs")
    assert "and 3 validation(s) of 256 tokens" in line
    trainer.step = 4
    assert "for the 6 steps left, at the first 2 steps'" in train_estimate(trainer)
    assert duration(40) == "40 s" and duration(600) == "10 min" and duration(4 * 3600) == "4.0 h"


def test_a_task_runs_plan_names_the_task_its_lengths_and_positions():
    from alibi_lm.tasks import build_task
    from alibi_lm.tasks.stream import TaskStream

    tc = SimpleNamespace(eval_every=250, seq_len=64, batch_size=32, grad_accum=1, min_seq_len=None, positions="random",
                         max_position=1024, stop_at_accuracy=0.99)
    trainer = SimpleNamespace(tc=tc, step=0, steps=2000, world=1, stream=TaskStream(build_task("mqar"), tc, 0))
    assert trainer_plan(trainer).startswith("plan: 2,000 optimizer steps of 32 sequences of task mqar, lengths 16..64 "
                                            "(positions random-1024), and 8 validation(s) of exact match at L, "
                                            "ending early at exact match 0.99 at L;")


def test_probes_plans_count_their_forward_passes():
    subject = HandMadeSubject(Counting(), np.zeros(2001, dtype=np.int64), dict(position="toy", train_len=16, seed=0))
    line = passkey.plan(subject, PasskeyConfig(multipliers=[1, 4], trials=10, depths=[0, 1]), "valid", 256)
    # 30 prompts a cell; batches of 16 prompts at Lv = 16 (2 per cell), of 4 at Lv = 64 (8 per cell)
    assert line == ("passkey plan: Lv=16: 2 cells, 60 prompts in 4 forward passes; Lv=64: 2 cells, 60 prompts in 16 "
                    "forward passes; 20 forward passes in all (a line per length follows)")
    line = context_use.plan(subject, ContextConfig(multiplier=4, levels=2), "valid", tokens_per_batch=256)
    # W = 64, stride 16: (2000 - 64) // 16 + 1 = 122 windows, 4 per batch; W = 16, stride 4: 497 windows, 16 per batch
    assert line == (f"context-use plan: W=64: 122 windows in {math.ceil(122 / 4)} forward passes; W=16: 497 windows in "
                    f"{math.ceil(497 / 16)} forward passes; {math.ceil(122 / 4) + math.ceil(497 / 16)} forward passes in all")


def test_the_context_curve_prints_an_estimate_and_its_bar_counts_every_token(capsys, monkeypatch):
    from tqdm import tqdm

    """The context-use probe's progress: an 'estimate: about' line after its first batch, and a bar whose total is
    exactly the tokens its forward passes run (so its ETA ends where the work does)."""
    scorer = Counting()
    subject = HandMadeSubject(scorer, np.zeros(2001, dtype=np.int64), dict(position="toy", train_len=16, seed=0))
    subject.scorer.loss = scorer.__call__
    totals = []
    monkeypatch.setattr(context_use, "tqdm", lambda **kw: totals.append(kw["total"]) or tqdm(**kw))
    context_use.multi_resolution_sums(subject, np.zeros(2001, dtype=np.int64), 64, 2, None, 256)
    assert "estimate: about" in capsys.readouterr().out
    assert totals == [scorer.tokens == 122 * 64 + 497 * 16 and scorer.tokens]  # windows x W at both window lengths


def test_work_that_did_not_run_advances_the_bar_but_gives_no_estimate(capsys):
    """A cell that is not applicable (a learned table past its end) first: its tokens count on the bar, but the
    estimate waits for the first batch that ran, whose rate it is."""
    with tqdm(total=300, file=io.StringIO()) as bar:  # counting, drawn out of sight
        estimate = FirstBatchEstimate(bar, "tokens")
        estimate.skip(100)
        assert bar.n == 100 and "estimate" not in capsys.readouterr().out
        estimate.update(50)
        assert bar.n == 150 and "estimate: about" in capsys.readouterr().out
        estimate.update(150)
        assert bar.n == 300 and capsys.readouterr().out == ""  # said once
