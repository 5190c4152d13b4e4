"""The synthetic task suite's training budgets (experiment=tasks, make tasks): per task, how many steps every run
trains, how often the paper's schemes and NoPE keep their weights, and the model's depth. alibi_lm/plans/task_suite.py
plans the suite with them, and the experiment naming (alibi_lm/naming.py) compares a run by hand with them: one
without the task's budget is a trial of its own, not the suite's run."""

from __future__ import annotations

from dataclasses import dataclass

# The suite's protocol (experiment=tasks): per task, (training steps, the interval of kept checkpoints), the same
# for every scheme. Chosen from committed probes so that the paper's schemes meet the criterion at L well before the
# budget ends. Passkey: met by steps 1,500-2,500 for ALiBi in the first suite, while RoPE, T5, NoPE and learned were
# at 0.94-0.98 token accuracy at step 4,000 (results/tasks-<first>/training.md): twice that; with the fairseq init
# ALiBi meets it at 750 and RoPE at 1,500 (results/tasks-probe-init-pf/). Copy, with the fairseq init: met by RoPE
# at 500-750 steps, ALiBi at 1,000-1,250, T5 at 1,250-2,000 and NoPE at 2,500-2,750 of a 3,000-step cosine
# (results/tasks-probe-init/): 5,000. Flip-flop, with the fairseq init: met by RoPE, ALiBi and T5 at 250-750, but by
# NoPE not at all in a 3,000-step cosine (0.84 at its end, results/tasks-probe-init-pf/) and at 1,750 in a
# 6,000-step one, whose learning rate stays higher longer (results/tasks-probe-init-ff6k/): 6,000. MQAR, with 4
# layers (Budget.layers): at 2 layers only ALiBi met the criterion in 3,000 steps (results/tasks-probe-init-mqar/;
# RoPE still at 0.04 after 8,000); at 4 layers RoPE met it at step 1,250, T5 at 750, ALiBi at 1,250 and NoPE reached
# 0.948 at the end of a 3,000-step cosine (results/tasks-probe-mqar-l4/): 5,000, the room flip-flop's NoPE needed (a
# longer cosine keeps the learning rate up).

@dataclass(frozen=True)
class Budget:
    steps: int  # training steps of every run of the task, whatever its scheme
    keep_every: int  # the paper's schemes and NoPE keep their weights every this many steps (scored over training)
    layers: int | None = None  # the model's depth where the task needs another than experiment=tasks' (iRoPE follows)


BUDGETS = {"passkey": Budget(8000, 1000), "copy": Budget(5000, 500), "flipflop": Budget(6000, 500),
           "mqar": Budget(5000, 500, layers=4)}
PAPER_SCHEMES = ("sinusoidal", "learned", "t5", "rope", "alibi", "nope")  # the paper's five and the NoPE control
SUITE_EXPERIMENT = "tasks"  # the experiment whose runs the suite trains with these budgets


def suite_overrides(task: str, label: str, positions: str) -> list[str]:
    """The overrides the suite gives a run of `task` (alibi_lm/plans/task_suite.py): its steps, its interval of kept
    weights (the paper's schemes and NoPE with sequential positions; none for the others) and its depth where the
    task has one; none for a task without a budget. The experiment naming compares a run by hand with these."""
    budget = BUDGETS.get(task)
    if budget is None:
        return []
    keep = kept_every(task, label, positions)
    return [f"train.max_steps={budget.steps}", f"train.keep_checkpoints_every={keep or 'null'}",
            *([f"model.n_layer={budget.layers}"] if budget.layers else [])]


def kept_every(task: str, label: str, positions: str) -> int | None:
    """How often a suite's run of `task` keeps its weights (scored over training): every budget.keep_every steps for
    the paper's schemes and NoPE with sequential positions; never for the others, or for a task without a budget."""
    budget = BUDGETS.get(task)
    if budget is None or label not in PAPER_SCHEMES or positions != "sequential":
        return None
    return budget.keep_every or None
