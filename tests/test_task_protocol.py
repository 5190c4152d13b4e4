"""The task suite's protocol: validation is exact match at L on VALID_SEQUENCES fixed sequences (the learning
criterion, counted against an independent count), the same sequences whatever the run's seed."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import torch

from alibi_lm.checkpoint import load_checkpoint
from alibi_lm.provenance import model_digest
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


def test_kept_checkpoints_are_scored_at_L_4L_and_16L_and_the_last_agrees_with_the_final_cells(tmp_path, monkeypatch):
    """The evaluation scores each kept checkpoint at L, 4L and 16L into over_training.csv, once; the kept weights of
    the last step are the final weights, so their rows are tasks.csv's cells, taken from there rather than scored
    twice; scoring that checkpoint on its own gives the same numbers (two code paths, one model)."""
    from tqdm import tqdm

    from alibi_lm.eval import task_evaluation
    from alibi_lm.results.task_store import OVER_TRAINING_CSV, TASKS_CSV, read_over_training, read_task_results
    from alibi_lm.tasks.stream import kept_steps

    scored, score_cell = [], task_evaluation.score_cell
    monkeypatch.setattr(task_evaluation, "score_cell", lambda model, *a, greedy=True: scored.append(
        (greedy, a[2])) or score_cell(model, *a, greedy=greedy))
    job = train_and_score(tmp_path, "alibi")
    assert sorted(length for greedy, length in scored if not greedy) == [16, 64, 256]  # the step-4 checkpoint alone
    over = read_over_training(tmp_path / "results" / "tasks" / OVER_TRAINING_CSV)
    assert sorted(zip(over["step"], over["eval_len"])) == [(s, lv) for s in (4, 8) for lv in (16, 64, 256)]
    assert (over["examples"] == 24).all()
    cells = read_task_results(tmp_path / "results" / "tasks" / TASKS_CSV).set_index("eval_len")
    last = over[over["step"] == 8].set_index("eval_len")
    evaluation = task_evaluation.TaskEvaluation(tmp_path / "run", job.eval, tmp_path / "results", "cpu", False)
    kept = evaluation.kept_model(dict(kept_steps(tmp_path / "run"))[8])
    for lv in (16, 64, 256):
        assert last.loc[lv, "exact"] == cells.loc[lv, "exact"] and last.loc[lv, "token_acc"] == cells.loc[lv, "token_acc"]
        assert last.loc[lv, "weights"] == cells.loc[lv, "weights"] and last.loc[lv, "wall_s"] < 0.5
        assert set(over["model"]) == {cells.loc[lv, "model"]}  # every kept step: the run's model
        alone = score_cell(kept, evaluation.task, evaluation.policy, lv, evaluation.ev, "cpu", tqdm(disable=True),
                           greedy=False)
        assert (alone["exact"], alone["token_acc"]) == (cells.loc[lv, "exact"], cells.loc[lv, "token_acc"])
    # kept weights of a run trained with model.attention=flex (heads 16 wide or less: CUDA takes 16, the CPU's kernel
    # refuses them) are scored on the CPU all the same, as auto, with the same numbers
    path = dict(kept_steps(tmp_path / "run"))[8]
    state = torch.load(path, map_location="cpu", weights_only=True)
    assert state["model_config"]["d_model"] // state["model_config"]["n_head"] <= 16
    torch.save({**state, "model_config": {**state["model_config"], "attention": "flex"}}, path)
    flex = evaluation.kept_model(path)
    assert flex.cfg.attention == "auto"
    alone = score_cell(flex, evaluation.task, evaluation.policy, 256, evaluation.ev, "cpu", tqdm(disable=True),
                       greedy=False)
    assert (alone["exact"], alone["token_acc"]) == (cells.loc[256, "exact"], cells.loc[256, "token_acc"])
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


def test_cells_scored_on_other_test_sequences_are_neither_reused_nor_replaced(tmp_path):
    """A cell or over-training row scored with another eval.examples, or in other batches (eval.tokens_per_batch),
    is not taken as done, and is not replaced either:
    the evaluation stops in one line before scoring anything, the rows as they were; with the run's own settings
    nothing is pending."""
    import dataclasses

    import pytest

    from alibi_lm.config import EvalConfig, typed
    from alibi_lm.errors import UserError
    from alibi_lm.eval.task_evaluation import TaskEvaluation
    from alibi_lm.results.task_store import OVER_TRAINING_CSV, TASKS_CSV, read_over_training, read_task_results

    job = train_and_score(tmp_path, "alibi")  # 24 sequences a cell
    results = tmp_path / "results" / "tasks"
    before = {name: (results / name).read_bytes() for name in (TASKS_CSV, OVER_TRAINING_CSV)}
    own = typed(EvalConfig, job.eval, "eval")
    for examples, what in ((48, "the cell Lv=16"), (12, "the cell Lv=16")):
        other = dataclasses.replace(own, examples=examples)
        for skip_done in (True, False):
            evaluation = TaskEvaluation(tmp_path / "run", other, tmp_path / "results", "cpu", False, skip_done=skip_done)
            assert evaluation.pending()
            with pytest.raises(UserError, match=rf"holds {what} of .* scored on 24 sequences with answers in batches "
                                                rf"of 24; this evaluation scores {examples} sequences with answers in "
                                                rf"batches of {examples} \(eval.examples={examples}, "
                                                r"eval.tokens_per_batch=.*use the settings the run was scored with "
                                                r"\(eval.examples=24\)"):  # the run's own, as an override
                evaluation.run()
    # as many sequences, drawn in other batches (another eval.tokens_per_batch): other sequences, refused too
    rows = pd.concat([read_task_results(results / TASKS_CSV), read_over_training(results / OVER_TRAINING_CSV)])
    assert set(rows["batch_sequences"]) == {24}  # every length fits 24 sequences in eval.tokens_per_batch
    smaller_batches = dataclasses.replace(own, tokens_per_batch=16 * 12)  # 12 sequences of Lv = 16 a batch
    for skip_done in (True, False):
        evaluation = TaskEvaluation(tmp_path / "run", smaller_batches, tmp_path / "results", "cpu", False,
                                    skip_done=skip_done)
        assert evaluation.pending()
        with pytest.raises(UserError, match=r"holds the cell Lv=16 of .* scored on 24 sequences with answers in batches "
                                            r"of 24; this evaluation scores 24 sequences with answers in batches of 12"):
            evaluation.run()
    # the kept steps' rows are checked too: a folder whose over_training.csv alone holds this run's rows
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / OVER_TRAINING_CSV).write_bytes(before[OVER_TRAINING_CSV])
    other = TaskEvaluation(tmp_path / "run", dataclasses.replace(own, examples=48), tmp_path / "results", "cpu", False,
                           csv=tmp_path / "elsewhere" / TASKS_CSV)
    with pytest.raises(UserError, match=r"holds the kept step 4 at Lv=16 of .* scored on 24 sequences"):
        other.check_same_sequences([])
    assert {name: (results / name).read_bytes() for name in before} == before
    assert not TaskEvaluation(tmp_path / "run", own, tmp_path / "results", "cpu", False, skip_done=True).pending()


def test_rows_of_an_earlier_training_of_the_run_that_no_new_row_replaces_are_removed(tmp_path):
    """An earlier training of the run (another budget, keep interval or set of lengths) left rows the new training's
    would not replace (a length, a kept step it no longer has): evaluating the run removes them from tasks.csv,
    over_training.csv and retrieval.csv; its own rows, and other runs', stay."""
    from alibi_lm.eval.task_evaluation import TaskEvaluation
    from alibi_lm.results.retrieval_store import RETRIEVAL_CSV, read_retrieval
    from alibi_lm.results.task_store import OVER_TRAINING_CSV, TASKS_CSV, read_over_training, read_task_results

    job = train_and_score(tmp_path, "alibi")
    results = tmp_path / "results" / "tasks"
    tables = {TASKS_CSV: read_task_results, OVER_TRAINING_CSV: read_over_training, RETRIEVAL_CSV: read_retrieval}
    own = {name: read(results / name) for name, read in tables.items()}
    assert all(len(df) for df in own.values())
    digest = model_digest(load_checkpoint(tmp_path / "run")["model_config"])  # independently of the evaluation
    assert {name: set(df["model"]) for name, df in own.items()} == {name: {digest} for name in own}
    earlier = {TASKS_CSV: dict(eval_len=4096), OVER_TRAINING_CSV: dict(step=12), RETRIEVAL_CSV: dict(eval_len=4096)}
    for name, changes in earlier.items():
        row = own[name].iloc[[0]].assign(weights="0123456789abcdef", **changes)
        # another run's row: another seed, as two runs' rows never share a cell (the tables refuse that as copied)
        neighbour = own[name].iloc[[0]].assign(weights="fedcba9876543210", run="runs/tasks/another", seed=1, **changes)
        pd.concat([own[name], row, neighbour]).to_csv(results / name, index=False)
    over = read_over_training(results / OVER_TRAINING_CSV)  # and one off the keep interval (4): another training's
    pd.concat([over, own[OVER_TRAINING_CSV].iloc[[0]].assign(step=6)]).to_csv(results / OVER_TRAINING_CSV, index=False)
    TaskEvaluation(tmp_path / "run", job.eval, tmp_path / "results", "cpu", False, skip_done=True).run()
    for name, read in tables.items():
        now = read(results / name)
        assert (now["run"] == "runs/tasks/another").sum() == 1, name  # another run's row stays
        mine = now[now["run"] != "runs/tasks/another"]
        assert set(mine["weights"]) == set(own[name]["weights"]) and len(mine) == len(own[name]), name
    # a kept file pruned by hand: its rows cannot be scored again, and stay
    from alibi_lm.tasks.stream import kept_path

    kept_path(tmp_path / "run", 4).unlink()
    TaskEvaluation(tmp_path / "run", job.eval, tmp_path / "results", "cpu", False, skip_done=False).run()
    assert 4 in set(read_over_training(results / OVER_TRAINING_CSV)["step"])
    # rows of another model under this run's folder (a run of other settings trained into it) are refused, not
    # removed, in whichever of the three tables they are
    import pytest

    from alibi_lm.errors import UserError

    for name, read in tables.items():
        whole = (results / name).read_bytes()
        df = read(results / name)
        df.loc[df.index[df["run"] != "runs/tasks/another"][-1], "model"] = "ffffffffffffffff"
        df.to_csv(results / name, index=False)
        before = {n: (results / n).read_bytes() for n in tables}
        with pytest.raises(UserError, match=rf"{name} holds rows of another model \(ffffffffffffffff, this one is"):
            TaskEvaluation(tmp_path / "run", job.eval, tmp_path / "results", "cpu", False, skip_done=False).run()
        assert {n: (results / n).read_bytes() for n in tables} == before, name
        (results / name).write_bytes(whole)


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


def test_a_run_scored_again_by_hand_draws_the_sequences_of_its_rows(tmp_path):
    """`python -m alibi_lm.eval run=<task run>` names no eval.examples: the run's own (its config.yaml's) is taken, so
    its cells are scored again on the sequences of its rows, not refused as other sequences; a run whose config
    names none is scored on DEFAULT_TASK_EXAMPLES."""
    from conftest import compose_job

    from alibi_lm.config import DEFAULT_TASK_EXAMPLES, EvalConfig
    from alibi_lm.eval.task_evaluation import TaskEvaluation
    from alibi_lm.results.task_store import TASKS_CSV, read_task_results

    train_and_score(tmp_path, "alibi")  # 24 sequences a cell
    by_hand = compose_job("eval", f"run={tmp_path / 'run'}", "eval.multipliers=[1,4,16]").eval
    assert by_hand.examples is None
    before = read_task_results(tmp_path / "results" / "tasks" / TASKS_CSV)
    evaluation = TaskEvaluation(tmp_path / "run", by_hand, tmp_path / "results", "cpu", False)
    assert evaluation.ev.examples == 24
    rows = pd.DataFrame(evaluation.run()).sort_values("eval_len")
    assert rows["examples"].tolist() == before.sort_values("eval_len")["examples"].tolist()
    assert rows["exact"].tolist() == before.sort_values("eval_len")["exact"].tolist()
    assert TaskEvaluation(tmp_path / "run", EvalConfig(examples=12), tmp_path / "x", "cpu", False).ev.examples == 12
    (tmp_path / "run" / "config.yaml").write_text((tmp_path / "run" / "config.yaml").read_text().replace(
        "examples: 24", "examples: null"))  # a run trained without a word on it
    assert TaskEvaluation(tmp_path / "run", by_hand, tmp_path / "x", "cpu", False).ev.examples == DEFAULT_TASK_EXAMPLES


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


def test_an_unfinished_run_scored_on_purpose_does_not_replace_a_finished_trainings_rows(tmp_path):
    """allow_failed_run scores a run that did not finish; where the table holds its rows from other weights (a
    finished training's, as the suite commits them: the same command stopped part-way by hand), one line refuses
    before anything is dropped or scored, and every table is as it was."""
    import json

    import pytest

    from alibi_lm.errors import UserError
    from alibi_lm.eval.task_evaluation import evaluate_task_run
    from alibi_lm.results.task_store import OVER_TRAINING_CSV, TASKS_CSV

    job = train_and_score(tmp_path, "alibi")
    results = tmp_path / "results" / "tasks"
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    (tmp_path / "run" / "status.json").write_text(json.dumps(dict(status, status="stopped")))
    table = results / TASKS_CSV
    weights = str(pd.read_csv(table, dtype=str)["weights"].iloc[0])
    table.write_text(table.read_text().replace(weights, "0123456789abcdef"))
    before = {name: (results / name).read_bytes() for name in (TASKS_CSV, OVER_TRAINING_CSV)}
    with pytest.raises(UserError, match=r"holds rows of .*run from other weights \(0123456789abcdef\); this run is "
                                        r"being scored with allow_failed_run=true although .*paths.results=<another"):
        evaluate_task_run(tmp_path / "run", job.eval, tmp_path / "results", device="cpu", progress=False,
                          allow_failed=True)
    assert {name: (results / name).read_bytes() for name in before} == before


def test_a_kept_checkpoint_lost_between_the_two_writes_is_kept_on_resume(tmp_path, monkeypatch):
    """A full disk (or a kill) after checkpoint.pt and before checkpoints/step-N.pt: the resume starts at step N, so it
    keeps step N's weights from the checkpoint (the same weights), and the run keeps every step it should."""
    import pytest
    from conftest import compose_job

    from alibi_lm import checkpoint as ckpt
    from alibi_lm.tasks.stream import kept_steps
    from alibi_lm.training.trainer import Trainer

    job = compose_job("train", "experiment=tasks", "task=copy", "task.symbols=4", "position=alibi", "model.n_layer=1",
                      "model.d_model=32", "model.d_ff=64", "train.seq_len=16", "train.batch_size=4",
                      "train.max_steps=12", "train.warmup_steps=2", "train.eval_every=4", "train.checkpoint_every=4",
                      "train.keep_checkpoints_every=4", "train.progress=false", "train.evaluate_after=false",
                      "train.resume=auto", f"paths.runs={tmp_path / 'runs'}")
    real = Trainer.keep_weights

    def disk_full_at_4(self):
        if self.step == 4:
            raise OSError(28, "No space left on device")
        real(self)

    monkeypatch.setattr(Trainer, "keep_weights", disk_full_at_4)
    with pytest.raises(OSError):
        Trainer(job, tmp_path / "run").run()
    assert ckpt.load_checkpoint(tmp_path / "run")["step"] == 4 and kept_steps(tmp_path / "run") == []
    monkeypatch.setattr(Trainer, "keep_weights", real)
    Trainer(job, tmp_path / "run").run()
    kept = dict(kept_steps(tmp_path / "run"))
    assert sorted(kept) == [4, 8, 12]
    weights = torch.load(kept[12], map_location="cpu")["model"]
    assert all(torch.equal(w, weights[k]) for k, w in ckpt.load_checkpoint(tmp_path / "run")["model"].items())


def test_perplexity_settings_on_a_task_run_are_refused_not_ignored(tmp_path):
    """eval.mode=sliding, eval.stride, eval.max_tokens or eval.longppl measure perplexity on a text split; given to a
    task run they would be ignored and the rows would not say so: refused in one line, the tables as they were."""
    import dataclasses

    import pytest

    from alibi_lm.config import EvalConfig, typed
    from alibi_lm.errors import UserError
    from alibi_lm.eval.task_evaluation import TaskEvaluation

    job = train_and_score(tmp_path, "alibi")
    results = tmp_path / "results" / "tasks"
    before = {p.name: p.read_bytes() for p in results.iterdir() if p.is_file()}
    own = typed(EvalConfig, job.eval, "eval")
    for changes, says in ((dict(mode="sliding", stride=4), "eval.mode=sliding, eval.stride=4"),
                          (dict(max_tokens=512), "eval.max_tokens=512"), (dict(longppl=True), "eval.longppl=True")):
        with pytest.raises(UserError, match=rf"^{says} set how perplexity is measured .* drop them$"):
            TaskEvaluation(tmp_path / "run", dataclasses.replace(own, **changes), tmp_path / "results", "cpu", False)
    assert {p.name: p.read_bytes() for p in results.iterdir() if p.is_file()} == before


def test_the_probes_refuse_a_task_run_naming_what_they_measure(tmp_path):
    """The probes measure a language model on text: a synthetic task's run (given as run=) is refused in one line
    that says so and how to score it, not with a missing-data message."""
    import pytest
    from conftest import compose_job

    from alibi_lm.errors import UserError
    from alibi_lm.probes.app import check

    train_and_score(tmp_path, "alibi")
    job = compose_job("probes", f"run={tmp_path / 'run'}", f"paths.results={tmp_path / 'results'}")
    with pytest.raises(UserError, match=r"was trained on the synthetic task copy; the probes measure a language model on "
                                        r"text: .* python -m alibi_lm.eval run="):
        check(job)
