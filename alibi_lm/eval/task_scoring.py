"""One cell of a synthetic task: a run's model on a task's fixed test sequences at one length (score_cell).

A cell scores eval.examples fixed test sequences (the same for every run: seed EVAL_SEED, the test split's stream),
in batches of about eval.tokens_per_batch tokens (sequences_per_batch: which sequences a cell draws follows from
both). Per cell:
  - token_acc: the share of answer tokens whose argmax is right, under teacher forcing (one forward pass);
  - exact: the share of sequences with every answer token right (sequences with at least one answer);
  - greedy (tasks whose answer is one span at the end: copy, passkey; the task as trained, not its variants such
    as the passkey's depth grid): decode the answer token by token from the prompt with the KV cache and compare.
    Greedy decoding reproduces the answer exactly when, and only when, every teacher-forced argmax is right, so
    greedy must equal exact sequence by sequence; greedy_agree is the share of sequences where it does (1 up to
    ties and rounding between the two code paths);
  - loss: the mean answer-token NLL.
"""

from __future__ import annotations

import dataclasses

import torch

from ..config import EvalConfig
from ..model import KVCache
from ..results.task_store import options_label
from ..tasks.base import Batch, Task
from ..tasks.stream import EVAL_SEED, PositionPolicy


@dataclasses.dataclass
class CellScore:
    correct: int = 0  # answer tokens right (teacher forcing)
    answers: int = 0
    exact: int = 0  # sequences with every answer right
    sequences: int = 0  # sequences with at least one answer
    greedy: int = 0  # sequences whose greedy decode is the answer
    agree: int = 0  # sequences where greedy and teacher-forced exact match agree
    nll: float = 0.0

    def metrics(self, with_greedy: bool) -> dict:
        n = max(self.sequences, 1)
        out = dict(token_acc=self.correct / max(self.answers, 1), exact=self.exact / n,
                   loss=self.nll / max(self.answers, 1), examples=self.sequences, answers=self.answers)
        if with_greedy:
            out.update(greedy=self.greedy / n, greedy_agree=self.agree / n)
        return out


@torch.no_grad()
def teacher_forced(model, batch: Batch, positions, device, score: CellScore) -> torch.Tensor:
    """Add one batch's teacher-forced counts to score; the per-sequence exact match (B,) bool."""
    x, y, answer = batch.inputs.to(device), batch.targets.to(device), batch.answer.to(device)  # (B, T) each
    h = model.hidden(x, positions=positions)  # (B, T, D)
    logits = model.vocab.logits(h[answer]).float()  # (N, V): the answer positions only
    right = torch.zeros_like(answer)
    right[answer] = logits.argmax(-1) == y[answer]
    exact = (right == answer).all(1)  # (B,): every answer right
    has_answer = answer.any(1)
    score.correct += int(right.sum())
    score.answers += int(answer.sum())
    score.exact += int((exact & has_answer).sum())
    score.sequences += int(has_answer.sum())
    score.nll += float(torch.nn.functional.cross_entropy(logits, y[answer], reduction="sum"))
    return exact


@torch.no_grad()
def answer_span(batch: Batch) -> tuple[int, int]:
    """(first, n): the answers are targets first .. first + n - 1 of every sequence (tokens first+1 ..)."""
    span = batch.answer[0].nonzero().flatten()
    first, n = int(span[0]), len(span)
    if not bool((batch.answer == batch.answer[0]).all()) or int(span[-1]) != first + n - 1:
        raise ValueError("greedy decoding needs one answer span at the same place in every sequence")
    return first, n


@torch.no_grad()
def greedy_decode(model, batch: Batch, positions, device, stop_when_all_missed: bool = False) -> torch.Tensor:
    """(B, n): the answer span decoded greedily, token by token with the KV cache, from each sequence's prompt.
    With stop_when_all_missed, decoding ends once every sequence has a token that differs from its answer
    (none of them can reproduce it any more): (B, k), k <= n, the tokens decoded up to there."""
    first, n = answer_span(batch)
    tokens = batch.tokens.to(device)  # (B, T + 1)
    answers = tokens[:, first + 1 : first + 1 + n]  # (B, n)
    missed = torch.zeros(len(tokens), dtype=torch.bool, device=device)  # (B,)
    cache = KVCache(model.cfg.n_layer)
    logits = model(tokens[:, : first + 1], cache=cache, positions=positions)[:, -1]  # (B, V)
    decoded = []
    for step in range(n):
        decoded.append(logits.argmax(-1, keepdim=True))  # (B, 1)
        if step + 1 == n:
            break
        if stop_when_all_missed:  # one check per token (a GPU sync), only when asked for
            missed |= decoded[-1][:, 0] != answers[:, step]
            if bool(missed.all()):
                break
        logits = model(decoded[-1], start_pos=cache.end, cache=cache, positions=positions)[:, -1]
    return torch.cat(decoded, dim=1)  # (B, n), or (B, k) when every sequence missed at or before step k


def sequences_per_batch(length: int, ev: EvalConfig) -> int:
    """The test sequences of a batch at `length`: about ev.tokens_per_batch tokens (a row's batch_sequences)."""
    return max(1, min(ev.examples, ev.tokens_per_batch // length))


def cell_batches(task: Task, length: int, ev: EvalConfig):
    """(index, batch) of a cell's ev.examples test sequences, in batches of sequences_per_batch: which sequences they
    are follows from (examples, batch size, length), the same for every run."""
    size = sequences_per_batch(length, ev)
    for index, start in enumerate(range(0, ev.examples, size)):
        yield index, task.batch(EVAL_SEED, "test", index, min(size, ev.examples - start), length)


ANSWERED: dict[tuple, int] = {}  # (task, options, length, examples, tokens per batch) -> answered_sequences


def answered_sequences(task: Task, length: int, ev: EvalConfig) -> int:
    """How many of a cell's test sequences hold an answer (a row's `examples`; a short flip-flop may draw no read):
    what a row scored by these eval settings says, computed without a model, once per process."""
    key = (type(task).__name__, options_label(task.options), length, ev.examples, ev.tokens_per_batch)
    if key not in ANSWERED:
        ANSWERED[key] = sum(int(batch.answer.any(1).sum()) for _, batch in cell_batches(task, length, ev))
    return ANSWERED[key]


def score_cell(model, task: Task, policy: PositionPolicy, length: int, ev: EvalConfig, device, bar,
               greedy: bool = True) -> dict:
    """The metrics of one (task variant, length) cell over ev.examples test sequences; greedy decoding too where the
    task has it and `greedy` (the task as trained: its variants, such as the passkey's depths, are scored by teacher
    forcing alone, which gives the same exact match)."""
    greedy = greedy and task.greedy
    score = CellScore()
    for index, batch in cell_batches(task, length, ev):
        positions = policy.draw(EVAL_SEED, "test", index, length, device)
        exact = teacher_forced(model, batch, positions, device, score)
        if greedy:
            first, n = answer_span(batch)
            # a sequence that decoded one wrong token cannot reproduce its answer: stop once all have (copy at 16L)
            decoded = greedy_decode(model, batch, positions, device, stop_when_all_missed=True)  # (B, k <= n)
            k = decoded.shape[1]
            reproduced = (decoded == batch.tokens[:, first + 1 : first + 1 + k].to(device)).all(1)  # (B,)
            score.greedy += int(reproduced.sum())
            score.agree += int((reproduced == exact).sum())
        bar.update(len(batch.tokens) * length)  # tokens through the model: the cost grows with Lv, not the count
    return score.metrics(greedy)


__all__ = ["CellScore", "answer_span", "answered_sequences", "cell_batches", "greedy_decode", "score_cell",
           "sequences_per_batch", "teacher_forced"]
