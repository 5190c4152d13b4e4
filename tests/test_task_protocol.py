"""The task suite's protocol: validation is exact match at L on VALID_SEQUENCES fixed sequences (the learning
criterion, counted against an independent count), the same sequences whatever the run's seed."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from alibi_lm.tasks import build_task
from alibi_lm.tasks.stream import EVAL_SEED, VALID_BATCH, VALID_SEQUENCES, TaskStream


class Lookup(torch.nn.Module):
    """Hidden states that are the one-hot next tokens of the validation batches it was shown (argmax through an
    identity output layer reads them back), wrong at the targets `wrong` lists as (batch index, row, position)."""

    def __init__(self, task, L: int, wrong: list[tuple[int, int, int]]):
        super().__init__()
        self.states, V = {}, task.vocab_size
        for index in range(VALID_SEQUENCES // VALID_BATCH):
            batch = task.batch(EVAL_SEED, "valid", index, VALID_BATCH, L)
            predicted = batch.targets.clone()  # (B, T)
            for b, row, t in wrong:
                if b == index:
                    predicted[row, t] = (predicted[row, t] + 1) % V
            self.states[batch.inputs.numpy().tobytes()] = torch.nn.functional.one_hot(predicted, V).float()
        self.vocab = SimpleNamespace(logits=lambda h: h)

    def hidden(self, x, positions=None):
        return self.states[x.numpy().tobytes()]  # (B, T, V)


def test_validation_is_exact_match_on_the_fixed_sequences_whatever_the_seed():
    task = build_task("copy")
    L, first = 64, 64 - task.options.symbols - 1  # the first answer target at L
    tc = SimpleNamespace(seq_len=L, min_seq_len=None, positions="sequential", max_position=None, batch_size=32)
    # three wrong answer tokens in two sequences, and one wrong prediction at a non-answer position (not counted)
    model = Lookup(task, L, [(0, 3, first), (0, 3, first + 2), (5, 7, first + 15), (2, 0, 1)])
    for seed in (0, 1):
        assert TaskStream(task, tc, seed=seed).validate(model, torch.device("cpu")) == (VALID_SEQUENCES - 2) / VALID_SEQUENCES
    assert VALID_SEQUENCES >= 2000


def test_a_run_keeps_the_weights_of_every_n_steps_and_records_when_it_first_met_the_criterion(tmp_path, monkeypatch):
    """train.keep_checkpoints_every keeps checkpoints/step-N.pt (the final weights among them); status.json records
    the first validation at exact match >= LEARNED_AT and the rule, and training runs its whole budget."""
    from conftest import compose_job

    from alibi_lm import checkpoint as ckpt
    from alibi_lm.tasks.stream import LEARNED_AT, kept_steps
    from alibi_lm.training.trainer import Trainer

    scripted = iter([0.5, 0.96, 0.9, 0.97])  # validations at steps 4, 8, 12, 16
    monkeypatch.setattr(TaskStream, "validate", lambda self, model, device, dtype=None: next(scripted))
    job = compose_job("train", "experiment=tasks", "task=copy", "task.symbols=4", "position=rope", "model.n_layer=1",
                      "model.d_model=32", "model.d_ff=64", "train.seq_len=16", "train.batch_size=4",
                      "train.max_steps=16", "train.warmup_steps=2", "train.eval_every=4", "train.checkpoint_every=4",
                      "train.keep_checkpoints_every=8", "train.progress=false", "train.evaluate_after=false",
                      f"paths.runs={tmp_path / 'runs'}")
    assert job.train.stop_at_accuracy is None  # the suite's protocol: a fixed budget, never an early stop
    Trainer(job, tmp_path / "run").run()
    status = ckpt.read_status(tmp_path / "run")
    assert (status["step"], status["learned_at_step"]) == (16, 8)
    assert status["criterion"] == f"val_exact >= {LEARNED_AT} at L"
    kept = kept_steps(tmp_path / "run")
    assert [step for step, _ in kept] == [8, 16]
    final = ckpt.load_checkpoint(tmp_path / "run")["model"]
    last = torch.load(kept[-1][1], map_location="cpu")
    assert last["step"] == 16 and all(torch.equal(w, last["model"][k]) for k, w in final.items())


def test_kept_checkpoints_are_scored_at_L_4L_and_16L_and_the_last_agrees_with_the_final_cells(tmp_path):
    """The evaluation scores each kept checkpoint at L, 4L and 16L into over_training.csv, once; the kept weights of
    the last step are the final weights, so their rows equal tasks.csv's cells (two code paths, one model)."""

    from alibi_lm.results.task_store import OVER_TRAINING_CSV, TASKS_CSV, read_over_training, read_task_results

    job = train_and_score(tmp_path, "alibi")
    over = read_over_training(tmp_path / "results" / "tasks" / OVER_TRAINING_CSV)
    assert sorted(zip(over["step"], over["eval_len"])) == [(s, lv) for s in (4, 8) for lv in (16, 64, 256)]
    assert (over["examples"] == 24).all()
    cells = read_task_results(tmp_path / "results" / "tasks" / TASKS_CSV).set_index("eval_len")
    last = over[over["step"] == 8].set_index("eval_len")
    for lv in (16, 64, 256):
        assert last.loc[lv, "exact"] == cells.loc[lv, "exact"] and last.loc[lv, "token_acc"] == cells.loc[lv, "token_acc"]
        assert last.loc[lv, "weights"] == cells.loc[lv, "weights"]
    from alibi_lm.eval.task_evaluation import TaskEvaluation

    assert not TaskEvaluation(tmp_path / "run", job.eval, tmp_path / "results", "cpu", False, skip_done=True).pending()


def test_over_training_rows_of_another_training_of_the_run_are_scored_again_not_reused(tmp_path):
    """A run trained again (its earlier attempt stopped part-way, or trained on another machine) finds rows of its kept
    steps in over_training.csv from other weights: those steps are pending and scored again, their rows replaced;
    the rows from these weights are kept."""
    from alibi_lm.eval.task_evaluation import TaskEvaluation
    from alibi_lm.results.task_store import OVER_TRAINING_CSV, read_over_training

    job = train_and_score(tmp_path, "alibi")
    csv = tmp_path / "results" / "tasks" / OVER_TRAINING_CSV
    scored = read_over_training(csv)
    stale = scored.copy()
    stale.loc[(stale["step"] == 4) & (stale["eval_len"] == 64), "weights"] = "0123456789abcdef"  # another training's
    stale.to_csv(csv, index=False)
    evaluation = TaskEvaluation(tmp_path / "run", job.eval, tmp_path / "results", "cpu", False, skip_done=True)
    assert [step for step, _ in evaluation.kept_pending()] == [4] and evaluation.pending()
    evaluation.score_kept()
    again = read_over_training(csv)
    key = ["step", "eval_len"]
    assert again.sort_values(key)[[*key, "weights", "exact", "token_acc"]].reset_index(drop=True).equals(
        scored.sort_values(key)[[*key, "weights", "exact", "token_acc"]].reset_index(drop=True))
    assert not TaskEvaluation(tmp_path / "run", job.eval, tmp_path / "results", "cpu", False, skip_done=True).pending()


def test_a_batch_without_answers_has_a_zero_loss_not_a_nan():
    """Flip-flop at a short length may draw a batch with no read; its loss is 0 with a gradient, not nan."""
    from alibi_lm.model import LMConfig, TransformerLM
    from alibi_lm.tasks.base import Batch
    from alibi_lm.tasks.stream import answer_loss

    model = TransformerLM(LMConfig(vocab_size=8, n_layer=1, n_head=2, d_model=16, d_ff=32, position="alibi"))
    tokens = torch.randint(0, 8, (2, 5))
    loss = answer_loss(model, Batch(tokens, torch.zeros(2, 4, dtype=torch.bool)), None, torch.device("cpu"))
    loss.backward()
    assert loss.item() == 0.0 and all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())


def test_a_learned_table_of_L_positions_is_scored_over_training_at_L_only_and_its_longer_cells_say_not_applicable(
        tmp_path):
    """position=learned (a table of L rows) cannot take 4L or 16L: the evaluation finishes, the kept checkpoints
    are scored at L only, tasks.csv's longer cells say not applicable, and a second evaluation has nothing pending."""

    from alibi_lm.eval.task_evaluation import TaskEvaluation
    from alibi_lm.results.task_store import OVER_TRAINING_CSV, TASKS_CSV, read_over_training, read_task_results

    job = train_and_score(tmp_path, "learned")
    over = read_over_training(tmp_path / "results" / "tasks" / OVER_TRAINING_CSV)
    assert sorted(zip(over["step"], over["eval_len"])) == [(4, 16), (8, 16)]
    cells = read_task_results(tmp_path / "results" / "tasks" / TASKS_CSV).set_index("eval_len")
    assert cells.loc[16, "exact"] == over[over["step"] == 8]["exact"].item()
    assert all(cells.loc[lv, "note"].startswith("not applicable: position") for lv in (64, 256))
    assert not TaskEvaluation(tmp_path / "run", job.eval, tmp_path / "results", "cpu", False, skip_done=True).pending()


def train_and_score(tmp_path, position: str):
    """A 1-layer copy run of 8 steps at L = 16 keeping its weights every 4 steps, then its task evaluation at L, 4L
    and 16L on 24 sequences (results under tmp_path/results); the job."""
    from conftest import compose_job

    from alibi_lm.eval.task_evaluation import evaluate_task_run
    from alibi_lm.training.trainer import Trainer

    job = compose_job("train", "experiment=tasks", "task=copy", "task.symbols=4", f"position={position}",
                      "model.n_layer=1", "model.d_model=32", "model.d_ff=64", "train.seq_len=16", "train.batch_size=4",
                      "train.max_steps=8", "train.warmup_steps=2", "train.eval_every=4", "train.checkpoint_every=4",
                      "train.keep_checkpoints_every=4", "train.progress=false", "train.evaluate_after=false",
                      f"paths.runs={tmp_path / 'runs'}", "eval.examples=24", "eval.multipliers=[1,4,16]")
    Trainer(job, tmp_path / "run").run()
    evaluate_task_run(tmp_path / "run", job.eval, tmp_path / "results", device="cpu", progress=False)
    return job
