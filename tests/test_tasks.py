"""The synthetic task suite: generators that are deterministic and leak-free, answers checked against an
independent reconstruction, scoring on answer positions only, greedy decoding equal to teacher forcing where it
must be, randomized positions that reach the scheme and survive a resume, the config errors, and the report."""

from __future__ import annotations

import dataclasses
import fnmatch
import shutil
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import REPO, compose_job, make
from forked_app import run_python

from alibi_lm.errors import ConfigError, UserError
from alibi_lm.eval.task_scoring import CellScore, answer_span, greedy_decode, teacher_forced
from alibi_lm.model import LMConfig, TransformerLM
from alibi_lm.positions import POSITION_SCHEMES
from alibi_lm.positions.alibi import alibi_slopes
from alibi_lm.tasks import TASKS, build_task
from alibi_lm.tasks.base import Batch
from alibi_lm.tasks.stream import PositionPolicy, TaskStream

SYNTHETIC = [name for name, task in TASKS.items() if task.synthetic]
LENGTHS = (40, 41, 64, 257)


def as_text(task, row) -> list[str]:
    return [task.vocab[i] for i in row.tolist()]


@pytest.mark.parametrize("name", SYNTHETIC)
def test_batches_are_a_function_of_seed_split_index_and_length(name):
    task = build_task(name)
    a, b = task.batch(3, "train", 7, 8, 64), task.batch(3, "train", 7, 8, 64)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.answer, b.answer)
    for other in (task.batch(4, "train", 7, 8, 64), task.batch(3, "test", 7, 8, 64), task.batch(3, "train", 8, 8, 64)):
        assert not torch.equal(a.tokens, other.tokens)
    for length in LENGTHS:
        batch = task.batch(0, "test", 0, 16, length)
        assert batch.tokens.shape == (16, length + 1) and batch.answer.shape == (16, length)
        assert batch.tokens.dtype == torch.int64 and int(batch.tokens.max()) < task.vocab_size
        assert batch.answer.any(1).float().mean() > 0.5  # (flip-flop: a sequence may hold no read)
        assert (batch.tokens[:, 0] == task.vocab.index("<bos>")).all()


def test_passkey_answer_is_the_queried_needles_digits_and_appears_nowhere_else():
    task = build_task("passkey", {"distractors": 3})
    batch = task.batch(0, "test", 0, 32, 120)
    for row, answer in zip(batch.tokens, batch.answer):
        text = as_text(task, row)
        query = text.index("<query>")
        # targets 115 .. 119 predict tokens 116 .. 120, the digits after <query> K
        assert query == len(text) - 7 and answer.nonzero().flatten().tolist() == list(range(115, 120))
        key, digits = text[query + 1], text[query + 2 :]
        needles = [i for i, t in enumerate(text) if t == "<needle>"]
        assert len(needles) == 4 and len({text[i + 1] for i in needles}) == 4  # four distinct keys
        target = next(i for i in needles if text[i + 1] == key)
        assert text[target + 2 : target + 7] == digits
        # digits occur only inside needles and in the answer: the answer cannot be read off the filler
        inside = {i for n in needles for i in range(n + 2, n + 7)} | set(range(query + 2, len(text)))
        assert all(t.isdigit() == (i in inside) for i, t in enumerate(text))


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_passkey_depth_places_the_needle(depth):
    task = build_task("passkey", {"depth": depth})
    text = as_text(task, task.batch(0, "test", 0, 1, 100).tokens[0])
    n_filler = 100 - task.min_length
    assert text.index("<needle>") == 1 + round(depth * n_filler)


def test_mqar_answers_are_the_values_paired_with_the_queried_keys():
    task = build_task("mqar", {"pairs": 8})
    batch = task.batch(1, "train", 2, 16, 96)
    for row, answer in zip(batch.tokens, batch.answer):
        text = as_text(task, row)
        pairs = dict(zip(text[1:17:2], text[2:18:2]))
        filler, queries = text[17:-16], text[-16:]
        assert all(t.startswith("f") for t in filler)  # no key or value in the filler
        assert sorted(queries[::2]) == sorted(pairs)  # each key queried once, at the end
        assert queries[1::2] == [pairs[k] for k in queries[::2]]
        targets = as_text(task, row[1:][answer])
        assert targets == queries[1::2]  # the answers: exactly the values after the queries


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("length", [34, 41, 257])
def test_copy_answer_is_the_string_of_distinct_symbols_again_after_the_filler(reverse, length):
    task = build_task("copy", {"reverse": reverse})
    n = task.options.symbols
    batch = task.batch(0, "test", 0, 8, length)
    for row, answer, sources in zip(batch.tokens, batch.answer, task.sources(batch.tokens.numpy(), batch.answer.numpy())):
        text = as_text(task, row)
        s = text[1 : n + 1]
        assert all(t.startswith("s") for t in s) and len(set(s)) == n  # distinct: no repeated n-gram
        sep = text.index("<sep>")
        assert sep == length - n - 1 and all(t.startswith("f") for t in text[n + 1 : sep])  # the filler fills the gap
        assert text[-1] == "<eos>" and text[sep + 1 : -1] == (s[::-1] if reverse else s)
        assert as_text(task, row[1:][answer]) == (s[::-1] if reverse else s)
        assert answer.nonzero().flatten().tolist() == list(range(sep, sep + n))
        assert [text[i] for i in sources[answer.numpy()]] == as_text(task, row[1:][answer])  # what each answer copies


def test_copy_with_repeats_and_the_settings_it_cannot_make():
    task = build_task("copy", {"unique": False, "alphabet": 2})
    s = task.batch(0, "test", 0, 64, 40).tokens[:, 1:17]
    assert (s[:, :, None] == s[:, None, :]).sum((1, 2)).min() > 16  # every string repeats a symbol
    with pytest.raises(ConfigError, match="task.alphabet >= 16"):
        build_task("copy", {"alphabet": 8})
    with pytest.raises(ConfigError, match="at least 34 positions"):
        build_task("copy").batch(0, "test", 0, 1, 33)


def test_mqar_min_pairs_mixes_easier_batches_in_training_only():
    task = build_task("mqar", {"min_pairs": 1})
    mixed = task.for_training()
    answers = {int(mixed.batch(0, "train", i, 4, 64).answer[0].sum()) for i in range(40)}
    assert answers == {1, 2, 3, 4}  # K pairs, K answers: every K of 1 .. 4 drawn
    assert all(int(task.batch(0, "valid", i, 4, 64).answer.sum(1).min()) == 4 for i in range(5))
    assert build_task("mqar").for_training().options.min_pairs is None
    with pytest.raises(ConfigError, match="task.min_pairs must be in"):
        build_task("mqar", {"min_pairs": 5})
    for task, key in (("mqar", "keys"), ("mqar", "values"), ("mqar", "filler"), ("passkey", "filler"),
                      ("copy", "alphabet"), ("copy", "filler")):  # refused before a vocabulary that fills the memory
        build_task(task, {key: 65_536})
        with pytest.raises(ConfigError, match=rf"^task.{key} must be <= 65,536 \(token types of one kind"):
            build_task(task, {key: 65_537})  # just past: the old code built it (and 100,000,000 was killed)
    for key in ("keys", "values"):  # the key set, not task.pairs, which these leave out of range
        for bad in (0, -1):
            with pytest.raises(ConfigError, match=rf"^task.{key} must be >= 1, got {bad}$"):
                build_task("mqar", {key: bad})


def test_flipflop_reads_return_the_last_write():
    task = build_task("flipflop")
    batch = task.batch(0, "test", 0, 64, 129)
    reads = 0
    for row, answer in zip(batch.tokens, batch.answer):
        text, last = as_text(task, row), None
        expected = []
        for i in range(1, len(text) - 1, 2):  # an independent pass over the pairs
            op, bit = text[i], text[i + 1]
            if op == "w":
                last = bit
            elif op == "r":
                expected.append((i, last))
        assert text[1] == "w" and text[-1] == "<pad>"  # an odd length: one pad at the end
        assert [i for i, _ in expected] == answer.nonzero().flatten().tolist()  # target i predicts token i + 1
        assert [text[i + 1] for i, _ in expected] == [b for _, b in expected]
        reads += len(expected)
    assert reads > 200


class Oracle(torch.nn.Module):
    """Hidden states that are one-hot next tokens (right everywhere), except where `wrong` (B, T) says: there the
    token after the right one. With an identity output layer, argmax reads the hidden state back."""

    def __init__(self, batch: Batch, vocab_size: int, wrong: torch.Tensor):
        super().__init__()
        predicted = torch.where(wrong, (batch.targets + 1) % vocab_size, batch.targets)
        self.states = torch.nn.functional.one_hot(predicted, vocab_size).float() * 20  # (B, T, V)
        self.vocab = type("Identity", (), {"logits": staticmethod(lambda h: h)})()

    def hidden(self, x, positions=None):
        return self.states


@pytest.mark.parametrize("name", SYNTHETIC)
def test_accuracy_counts_answer_positions_only(name):
    task = build_task(name)
    batch = task.batch(0, "test", 0, 8, 64)
    for wrong, expected in ((~batch.answer, 1.0), (batch.answer, 0.0)):
        score = CellScore()
        exact = teacher_forced(Oracle(batch, task.vocab_size, wrong), batch, None, "cpu", score)
        assert score.correct / score.answers == expected and score.answers == int(batch.answer.sum())
        assert exact[batch.answer.any(1)].all() == bool(expected)
    # one wrong answer token in sequence 0: that sequence alone misses its exact match
    wrong = torch.zeros_like(batch.answer)
    wrong[0, batch.answer[0].nonzero()[0]] = True
    score = CellScore()
    exact = teacher_forced(Oracle(batch, task.vocab_size, wrong), batch, None, "cpu", score)
    assert not exact[0] and exact[1:][batch.answer[1:].any(1)].all()
    assert score.correct == score.answers - 1


def task_model(task, position="alibi", seed=0) -> TransformerLM:
    options = {"learned": {"max_len": 2048}}.get(position, {})
    torch.manual_seed(seed)
    return TransformerLM(LMConfig(n_layer=2, n_head=4, d_model=32, vocab_size=task.vocab_size, position=position,
                                  position_options=options, adaptive_cutoffs=None)).eval()


@pytest.mark.parametrize("position", ["alibi", "rope", "t5", "sinusoidal"])
@pytest.mark.parametrize("policy", [PositionPolicy(), PositionPolicy("random", 512)])
@pytest.mark.parametrize("name", ["copy", "passkey"])
def test_greedy_decoding_agrees_with_teacher_forcing(name, policy, position):
    """Greedy decoding (KV cache, token by token) reproduces a span exactly when every teacher-forced argmax on it
    is right (one full forward): decode with an untrained model, write its output in as the answer, and teacher
    forcing must then score every sequence right; on the original answers both must agree sequence by sequence."""
    task, model = build_task(name), task_model(build_task(name), position)
    batch = task.batch(0, "test", 0, 6, 48)
    positions = policy.draw(0, "test", 0, 48, "cpu")
    decoded = greedy_decode(model, batch, positions, "cpu")  # (B, n)
    tokens = batch.tokens.clone()
    first = int(batch.answer[0].nonzero()[0])
    tokens[:, first + 1 : first + 1 + decoded.shape[1]] = decoded
    own = Batch(tokens, batch.answer)
    score = CellScore()
    assert teacher_forced(model, own, positions, "cpu", score).all() and score.correct == score.answers
    exact = teacher_forced(model, batch, positions, "cpu", CellScore())
    assert torch.equal(exact, (decoded == batch.tokens[:, first + 1 : first + 1 + decoded.shape[1]]).all(1))


def test_greedy_decoding_that_stops_once_every_sequence_missed_scores_the_same():
    """The evaluation stops decoding a batch once every sequence has a wrong token: on an untrained model that is
    after the first tokens, with the same verdict per sequence as decoding the whole span; on the model's own
    answers (every sequence right) it decodes the whole span."""
    task = build_task("copy")
    model = task_model(task)
    batch = task.batch(0, "test", 0, 6, 64)
    first, n = answer_span(batch)
    answers = batch.tokens[:, first + 1 : first + 1 + n]  # (B, n)
    full = greedy_decode(model, batch, None, "cpu")  # (B, n)
    short = greedy_decode(model, batch, None, "cpu", stop_when_all_missed=True)  # (B, k)
    k = short.shape[1]
    assert k < n and torch.equal(short, full[:, :k])
    assert not (full == answers).all(1).any() and ((short != answers[:, :k]).any(1)).all()
    own = Batch(torch.cat([batch.tokens[:, : first + 1], full, batch.tokens[:, first + 1 + n :]], 1), batch.answer)
    assert torch.equal(greedy_decode(model, own, None, "cpu", stop_when_all_missed=True), full)


def test_a_cells_greedy_score_is_its_exact_match_with_the_early_stop():
    """score_cell's greedy column (decoding stopped once a batch is all wrong) equals teacher-forced exact match, on
    answers the model gets wrong (an untrained model) and on answers it gets right (its own greedy output)."""
    from alibi_lm.config import EvalConfig
    from alibi_lm.eval.task_scoring import score_cell

    task = build_task("copy")
    model = task_model(task)
    ev, bar = EvalConfig(examples=8, tokens_per_batch=4 * 40), SimpleNamespace(update=lambda n: None)
    wrong = score_cell(model, task, PositionPolicy(), 40, ev, "cpu", bar)
    assert wrong["greedy"] == wrong["exact"] == 0.0 and wrong["greedy_agree"] == 1.0

    class Own:  # the copy task, with the model's own greedy output written in as the answer
        greedy, vocab_size, name = True, task.vocab_size, "copy"

        def batch(self, seed, split, index, size, length):
            b = task.batch(seed, split, index, size, length)
            first, n = answer_span(b)
            decoded = greedy_decode(model, b, None, "cpu")  # (B, n)
            return Batch(torch.cat([b.tokens[:, : first + 1], decoded, b.tokens[:, first + 1 + n :]], 1), b.answer)

    right = score_cell(model, Own(), PositionPolicy(), 40, ev, "cpu", bar)
    assert right["greedy"] == right["exact"] == 1.0 and right["greedy_agree"] == 1.0


@pytest.mark.parametrize("position", [p for p in POSITION_SCHEMES if p != "example"])
def test_a_position_map_of_0_to_t_is_the_default_and_kv_cache_steps_follow_a_random_map(position):
    """positions=arange(T) gives the model's own positions (the absolute path of a bias against its relative
    template); with a random map, decoding with the KV cache gives what the full forward gives."""
    model = make(position)
    idx = torch.randint(0, 97, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for block in model.blocks:  # sharp attention: the scores, hence the positions, decide the output
            block.attn.qkv.weight.mul_(10)
        assert torch.allclose(model(idx), model(idx, positions=torch.arange(40)), atol=1e-5)
        positions = torch.from_numpy(np.sort(np.random.default_rng(0).choice(1024, 40, replace=False)))
        full = model(idx, positions=positions)
        from alibi_lm.model import KVCache

        cache = KVCache(model.cfg.n_layer)
        steps = [model(idx[:, :25], cache=cache, positions=positions)]
        steps += [model(idx[:, t : t + 1], start_pos=t, cache=cache, positions=positions) for t in range(25, 40)]
        assert torch.allclose(full, torch.cat(steps, 1), atol=1e-5)
        if not POSITION_SCHEMES[position].shift_invariant or position == "nope" or position in ("cope", "fox"):
            return  # nope, cope and fox (without its rope option) see no positions: test_content_schemes has their maps
        assert not torch.allclose(full, model(idx), atol=1e-3)  # the map reached the scheme


def test_randomized_positions_reach_the_scheme_and_repeat_after_a_resume(monkeypatch):
    job = compose_job("train", "experiment=tasks", "task=copy", "position=sinusoidal", "train.positions=random",
                      "train.max_position=1024")
    seen = []
    model = task_model(build_task("copy"), "sinusoidal")
    monkeypatch.setattr(model.position, "embedding", lambda pos: seen.append(pos.clone()) or None)
    stream = TaskStream(build_task("copy"), job.train, seed=0)
    for step in (0, 1, 0):
        stream.loss(model, step, 0, "cpu")
    first, second, again = seen
    assert torch.equal(first, again) and not torch.equal(first, second)  # a function of the step: a resume repeats
    for pos in seen:
        assert (pos.diff() > 0).all() and 0 <= int(pos.min()) and int(pos.max()) < 1024
    assert len(seen[0]) != 64 or len(seen[1]) != 64  # lengths vary between steps


def test_training_lengths_span_the_range_up_to_L():
    job = compose_job("train", "experiment=tasks", "task=mqar")
    stream = TaskStream(build_task("mqar"), job.train, seed=0)
    lengths = set()
    model = task_model(build_task("mqar"))
    model.forward = lambda x, targets=None, positions=None: lengths.add(x.shape[1]) or torch.zeros(x.shape)
    for step in range(200):
        stream.loss(model, step, 0, "cpu")
    assert min(lengths) == 16 and max(lengths) == 64 and len(lengths) > 40  # L / 4 = 16, mqar's shortest 4 x 4 pairs


@pytest.mark.parametrize("overrides, message", [
    # the setting that is short is the table, for the range randomized positions come from (not train.seq_len)
    (["position=learned", "train.positions=random", "train.max_position=1024"],
     r"up to train.max_position=1024, which position=learned cannot take: position.max_len=64 rows are fewer than the "
     r"1024 positions training gives; set position.max_len>=1024$"),
    (["train.positions=random", "train.max_position=32"], "train.max_position"),
    (["train.positions=random"], "train.max_position"),
    (["task=mqar", "task.pairs=32"], "needs sequences of at least 128 positions, but train.seq_len=64; raise"),
    (["task=copy", "train.seq_len=128", "train.min_seq_len=20"], "at least 34 positions, but train.min_seq_len=20; "
                                                                   "raise it to 34"),
    (["task=passkey", "task.distractors=16"], "task.distractors"),
    (["task=lm", "train.positions=random", "train.max_position=1024"], "for synthetic tasks"),
    (["task=lm", "train.stop_at_accuracy=0.99"], "only synthetic tasks"),
    (["train.stop_at_accuracy=1.5"], r"exact match at L \(the validation metric of a task\) in \(0, 1\]"),
    # found only after training before: the evaluation's 16L is past the range the positions came from
    (["train.positions=random", "train.max_position=512", "train.evaluate_after=true"],
     r"train.evaluate_after scores lengths up to 1024, beyond train.max_position=512"),
])
def test_settings_that_cannot_work_are_one_line_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        compose_job("train", "experiment=tasks", *overrides)


def test_a_task_run_folder_names_the_task_and_the_positions():
    from conftest import compose_config

    cfg = compose_config("train", "experiment=tasks", "task=copy", "position=rope", "train.positions=random",
                         "train.max_position=1024")
    assert cfg.hydra.run.dir.endswith("tasks/copy-rope-random-L64-seed0")
    assert compose_config("train").hydra.run.dir.endswith("default/alibi-L128-seed0")  # language modelling as before


def test_the_report_gives_mean_std_over_seeds_and_the_chance_level(tmp_path):
    from alibi_lm.results.task_report import build_task_report
    from alibi_lm.results.task_store import upsert_rows

    rows = [dict(task="mqar", task_options="", position=p, positions=q, train_len=64, eval_len=lv, variant="",
                 seed=s, token_acc=acc, exact=acc / 2, loss=1.0, chance_token=1 / 64, chance_exact=1e-9, examples=256,
                 answers=2048, run="r", step=1, weights="w", commit="c", device="cpu", wall_s=1.0, timestamp="t",
                 command="python -m alibi_lm.eval")
            for p, q, base in (("alibi", "sequential", 0.9), ("rope", "sequential", 0.5), ("rope", "random-1024", 0.7))
            for lv in (64, 128) for s, acc in ((0, base), (1, base + 0.1))]
    upsert_rows(tmp_path / "tasks.csv", rows)
    written = build_task_report(tmp_path)
    md = (tmp_path / "tasks.md").read_text()
    assert "| alibi | 0.95 ± 0.07 (n=2) | 0.95 ± 0.07 (n=2) |" in md
    assert "| rope+random | 0.75 ± 0.07 (n=2) |" in md and "| *chance* | 0.016 | 0.016 |" in md
    assert "no seed (of 2) learned it at L: rope, rope+random, alibi." in md  # exact match acc / 2 < 0.95 at L
    assert "| rope | 0/2 |  |  | 0.28 [0.00, 0.59] | - |" in md  # mean of 0.25, 0.30; t over 2 seeds is the wider
    assert [p.name for p in written] == ["tasks.md", "tasks-mqar-L64.png"]
    assert "seeds per scheme: 2." in md  # every scheme has two seeds: one number, not a range
    upsert_rows(tmp_path / "tasks.csv", [dict(rows[0], seed=2)])
    build_task_report(tmp_path)
    assert "seeds per scheme: 2-3." in (tmp_path / "tasks.md").read_text()
    upsert_rows(tmp_path / "tasks.csv", [dict(rows[0], token_acc=0.0)])  # the same cell again replaces its row
    assert len(pd.read_csv(tmp_path / "tasks.csv")) == len(rows) + 1


def test_every_file_the_report_writes_is_one_a_finished_commit_rebuilds(tmp_path):
    """The suite's commit removes the report's files (REPORT_FILES) from its copy before rebuilding them from the
    rows left, so that no plot of a run under way is committed: every file the report writes, the over-training
    and depth plots included, must match a pattern there, or a stale one would be committed."""
    from alibi_lm.results.task_report import REPORT_FILES, build_task_report

    committed = REPO / "results" / "tasks"
    for table in ("tasks.csv", "over_training.csv", "retrieval.csv"):
        shutil.copy(committed / table, tmp_path / table)
    names = [path.name for path in build_task_report(tmp_path)]
    assert {"tasks-passkey-L64-depth.png", "tasks-mqar-L64-over-training.png"} <= set(names)
    assert [n for n in names if not any(fnmatch.fnmatch(n, pattern) for pattern in REPORT_FILES)] == []
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix in {".md", ".png"}) == sorted(names)


def test_every_task_has_its_config_and_a_one_line_description():
    from pathlib import Path

    configs = Path(__file__).resolve().parents[1] / "configs" / "task"
    for name, task in TASKS.items():
        assert (configs / f"{name}.yaml").is_file(), name
        assert task.description and "\n" not in task.description
        assert dataclasses.is_dataclass(task.Options)


def small_task_job(tmp_path, *overrides):
    return compose_job("train", "experiment=tasks", "task=copy", "position=rope", "model.n_layer=1", "model.d_model=32",
                       "model.d_ff=64", "task.symbols=4", "train.seq_len=16", "train.batch_size=4", "train.max_steps=8",
                       "train.warmup_steps=2", "train.eval_every=4", "train.checkpoint_every=4", "train.progress=false",
                       "train.evaluate_after=false", f"paths.runs={tmp_path / 'runs'}", *overrides)


def test_a_randomized_task_run_resumes_to_the_same_weights(tmp_path, monkeypatch):
    """The batches, lengths and positions of a step follow from the step: a run stopped after its first checkpoint
    and resumed ends with the weights of a run that never stopped, bit for bit."""
    from alibi_lm import checkpoint as ckpt
    from alibi_lm.training.trainer import Trainer

    random = ("train.positions=random", "train.max_position=256")
    Trainer(small_task_job(tmp_path, *random), tmp_path / "ref").run()
    step = Trainer.train_step

    def stop_at_4(self):
        if self.step == 4:
            raise KeyboardInterrupt
        step(self)

    monkeypatch.setattr(Trainer, "train_step", stop_at_4)
    with pytest.raises(KeyboardInterrupt):
        Trainer(small_task_job(tmp_path, *random), tmp_path / "run").run()
    monkeypatch.undo()
    Trainer(small_task_job(tmp_path, *random, "train.resume=true"), tmp_path / "run").run()
    ref, resumed = ckpt.load_checkpoint(tmp_path / "ref"), ckpt.load_checkpoint(tmp_path / "run")
    for name, weight in ref["model"].items():
        assert torch.equal(weight, resumed["model"][name]), name
    status = ckpt.read_status(tmp_path / "run")
    assert status["status"] == "completed" and 0 <= status["val_exact"] <= 1
    assert (tmp_path / "run" / "vocab.txt").read_text().splitlines() == build_task("copy").vocab


def test_training_stops_at_the_first_validation_that_reaches_the_target_and_a_resume_stops_there_too(tmp_path,
                                                                                                       monkeypatch):
    """train.stop_at_accuracy ends a run at the validation step that reaches it, checkpointed there; killed before
    it is marked completed, the resumed run trains no further step."""
    from alibi_lm import checkpoint as ckpt
    from alibi_lm.tasks.stream import TaskStream
    from alibi_lm.training.trainer import Trainer

    scripted = iter([0.5, 0.95, 0.2, 0.2])  # validations at steps 4, 8, (12, 16: never reached)
    monkeypatch.setattr(TaskStream, "validate", lambda self, model, device, dtype=None: next(scripted))
    finish = Trainer.finish
    monkeypatch.setattr(Trainer, "finish", lambda self, stop=None: (_ for _ in ()).throw(KeyboardInterrupt))
    job = small_task_job(tmp_path, "train.max_steps=16", "train.checkpoint_every=12", "train.stop_at_accuracy=0.9")
    with pytest.raises(KeyboardInterrupt):
        Trainer(job, tmp_path / "run").run()
    assert ckpt.load_checkpoint(tmp_path / "run")["step"] == 8  # checkpointed at the solving step, not at 12
    monkeypatch.setattr(Trainer, "finish", finish)
    steps = []
    monkeypatch.setattr(Trainer, "train_step", lambda self: steps.append(self.step))
    resumed = small_task_job(tmp_path, "train.max_steps=16", "train.checkpoint_every=12", "train.stop_at_accuracy=0.9",
                             "train.resume=true")
    Trainer(resumed, tmp_path / "run").run()
    status = ckpt.read_status(tmp_path / "run")
    assert steps == [] and status["status"] == "completed"
    assert (status["step"], status["steps"], status["solved_at_step"], status["val_exact"]) == (8, 16, 8, 0.95)


@pytest.mark.slow
def test_train_evaluate_and_report_from_the_command_line(tmp_path):
    """python -m alibi_lm.train task=... with evaluate_after, then the evaluate app and the report, as a user runs
    them; a setting that cannot work is one line and exit 2 before anything is written."""
    import os

    env = {**os.environ, "WANDB_MODE": "disabled"}
    common = ["experiment=tasks", "name=tasks", "task=passkey", "model.n_layer=1", "model.d_model=32",
              "train.seq_len=32", "train.max_steps=6", "train.eval_every=3", "train.checkpoint_every=3",
              "eval.multipliers=[1,2]", "eval.examples=16", f"paths.runs={tmp_path / 'runs'}",
              f"paths.results={tmp_path / 'results'}"]

    def run(*args):
        return run_python(["-m", *args], env, timeout=600)

    bad = run("alibi_lm.train", *common, "position=learned", "train.positions=random", "train.max_position=512")
    common.insert(3, "position=alibi")
    common.insert(4, "position.learn_slopes=true")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "cannot take" in bad.stderr
    assert not (tmp_path / "runs").exists()
    done = run("alibi_lm.train", *common)
    assert done.returncode == 0, done.stderr[-2000:]
    folder = tmp_path / "runs" / "tasks" / "passkey-alibi+learn_slopes-L32-seed0"
    rows = pd.read_csv(tmp_path / "results" / "tasks" / "tasks.csv", keep_default_na=False)
    assert len(rows) == 2 * 6  # Lv = 32, 64: the task as trained and five depths
    assert (rows["examples"] == 16).all()  # eval.examples in every cell, the depth grid's too
    assert set(rows["positions"]) == {"sequential"} and set(rows["eval_len"]) == {32, 64}
    main = rows[rows["variant"] == ""]
    assert (main["greedy_agree"].astype(float) == 1).all() and (main["examples"] == 16).all()
    assert (rows.loc[rows["variant"] != "", "greedy"] == "").all()  # the depth grid: teacher forcing alone
    assert rows["command"].str.contains("alibi_lm.train").all() and rows["run"].str.endswith(folder.name).all()
    again = run("alibi_lm.eval", f"run={folder}", "eval.multipliers=[1,2]", "eval.examples=16",
                f"paths.results={tmp_path / 'results'}")
    assert again.returncode == 0, again.stderr[-2000:]
    rescored = pd.read_csv(tmp_path / "results" / "tasks" / "tasks.csv", keep_default_na=False)
    assert len(rescored) == len(rows) and rescored["command"].str.contains("alibi_lm.eval").all()
    assert (rescored["token_acc"].to_numpy() == rows["token_acc"].to_numpy()).all()  # the same test sequences
    retrieval = pd.read_csv(tmp_path / "results" / "tasks" / "retrieval.csv")  # each head's attention on the source
    assert set(retrieval["eval_len"]) == {32, 64} and set(retrieval["layer"]) == {0} and set(retrieval["head"]) == {0, 1, 2, 3}
    learned = pd.read_csv(tmp_path / "results" / "tasks" / "learned.csv").set_index("name")  # the learned slopes
    assert learned["initial"].tolist() == pytest.approx(alibi_slopes(4).tolist()) and (learned["task"] == "passkey").all()
    assert learned["value"].tolist() != pytest.approx(learned["initial"].tolist())  # trained (a little) away from them
    by_head = retrieval.groupby("head")["slope"].unique()
    assert [float(by_head[h][0]) for h in range(4)] == pytest.approx(learned["value"].tolist())  # the heads' own slopes
    assert retrieval.groupby("eval_len")["answers"].sum().tolist() == [4 * 5 * 4] * 2  # 16 // 4 seqs x 5 digits x 4 heads
    assert retrieval["attention"].between(0, 1).all() and retrieval["command"].str.contains("alibi_lm.eval").all()
    report = run("alibi_lm.results", str(tmp_path / "results" / "tasks"))
    assert report.returncode == 0 and "tasks.md" in report.stdout
    md = (tmp_path / "results" / "tasks" / "tasks.md").read_text()
    assert "## passkey, L = 32" in md and "exact match by needle depth" in md and "*chance*" in md
    assert "attention on the copied token" in md and "alibi+learn_slopes: every head, beside its slope m" in md
    assert "## Learned values" in md and "| alibi+learn_slopes | alibi_slope_3 | 0.003906 |" in md
    assert "## Findings on these rows" in md and "- passkey, L = 32: at 2L = 64, exact match ≥ 0.95 over the seeds" in md
    assert md.index("## Published results beside these rows") < md.index("## passkey, L = 32")


def test_a_learned_table_past_its_end_is_a_not_applicable_row(tmp_path):
    """position=learned (a table of L rows) scored at 2L: that cell's row says "not applicable" and the report
    shows n/a; the run's other cells are scored as usual."""
    from alibi_lm.eval.task_evaluation import evaluate_task_run
    from alibi_lm.results.task_report import build_task_report
    from alibi_lm.training.trainer import Trainer

    job = small_task_job(tmp_path, "position=learned", "train.max_steps=2")
    Trainer(job, tmp_path / "run").run()
    rows = evaluate_task_run(tmp_path / "run", {"multipliers": [1, 2], "examples": 8}, tmp_path / "results",
                             device=torch.device("cpu"), progress=False)
    by_len = {r["eval_len"]: r for r in rows}
    assert by_len[16]["note"] == "" and 0 <= by_len[16]["token_acc"] <= 1
    assert by_len[32]["note"].startswith("not applicable") and "token_acc" not in by_len[32]
    build_task_report(tmp_path / "results" / job.name)
    assert "| learned | " in (md := (tmp_path / "results" / job.name / "tasks.md").read_text()) and "| n/a |" in md


def test_a_task_evaluation_says_its_tokens_and_an_estimate_before_the_long_cells(tmp_path, capsys, monkeypatch):
    """A huge eval.multipliers on a task run started without a word on its cost: the plan names the tokens through
    the model, and the first batch gives the estimate the bar (counting tokens, not sequences) then keeps."""
    from alibi_lm.eval import task_evaluation
    from alibi_lm.training.trainer import Trainer

    job = small_task_job(tmp_path, "position=nope", "train.max_steps=2")
    Trainer(job, tmp_path / "run").run()
    counted = []
    real_update = task_evaluation.FirstBatchEstimate.update
    monkeypatch.setattr(task_evaluation.FirstBatchEstimate, "update",
                        lambda self, n: (counted.append(n), real_update(self, n)))
    capsys.readouterr()
    task_evaluation.evaluate_task_run(tmp_path / "run", {"multipliers": [1, 4], "examples": 8}, tmp_path / "results",
                                      device=torch.device("cpu"), progress=False)
    out = capsys.readouterr().out
    assert f"{tmp_path / 'run'}: 2 cells x 8 sequences (Lv=16, Lv=64): 640 tokens through the model" in out
    assert out.count("estimate: about ") == 1 and "for 640 tokens through the model" in out
    assert "(at Lv = 16; longer sequences cost more per token)" in out and sum(counted) == 640


def test_an_eval_length_shorter_than_the_task_is_refused_before_any_cell(tmp_path):
    from alibi_lm.eval.task_evaluation import evaluate_task_run
    from alibi_lm.training.trainer import Trainer

    job = small_task_job(tmp_path, "train.max_steps=2")
    Trainer(job, tmp_path / "run").run()
    with pytest.raises(UserError, match=r"^eval length 5 is too short: task copy needs sequences of at least \d+ "
                                        r"positions; set eval.lengths and eval.multipliers to lengths >= \d+$"):
        evaluate_task_run(tmp_path / "run", {"multipliers": [1], "lengths": [5], "examples": 8}, tmp_path / "results",
                          device=torch.device("cpu"), progress=False)
    assert not (tmp_path / "results").exists()


def test_findings_compare_each_variant_with_its_base_at_4L_and_16L():
    """Over the seeds that learned the task at L (exact match >= 0.95 there) and over all seeds; 95% intervals
    (t over seeds, Wilson over sequences: tests/test_task_claims.py checks their values); no verdict below 2 seeds."""
    from alibi_lm.results.task_findings import comparison_rows, solved_at

    acc = {("alibi", 64): [1.0, 1.0, 0.5], ("alibi", 256): [0.80, 0.80, 0.10], ("alibi", 1024): [0.40, 0.50, 0.0],
           ("fox", 64): [1.0, 1.0, 1.0], ("fox", 256): [0.20, 0.22, 0.24], ("fox", 1024): [0.45, 0.50, 0.55],
           ("rope+random", 64): [1.0], ("rope+random", 256): [0.9], ("rope+random", 1024): [0.9],
           ("rope", 64): [1.0], ("rope", 256): [0.3], ("rope", 1024): [0.1],
           ("nope", 64): [0.96, 0.99, 0.97], ("nope", 256): [0.95, 0.97, 0.99], ("nope", 1024): [0.3]}
    main = pd.DataFrame([dict(label=s, eval_len=lv, token_acc=a, exact=a, seed=i, examples=256, answers=1024)
                         for (s, lv), values in acc.items() for i, a in enumerate(values)])
    learned = {r[2]: r for r in comparison_rows(main, "mqar", 64)}
    every = {r[2]: r for r in comparison_rows(main, "mqar", 64, learned_only=False)}
    # comparisons whose two schemes have rows (t5 and sinusoidal have none), each +random against its base first
    assert list(learned) == ["rope+random vs rope", "nope vs alibi", "nope vs rope", "fox vs alibi"]
    verdicts = {name: (row[4], row[6]) for name, row in learned.items()}
    assert verdicts == {"rope+random vs rope": ("fewer than 2 learned seeds",) * 2,
                        "nope vs alibi": ("above", "fewer than 2 learned seeds"),  # alibi's seed 2 did not learn
                        "nope vs rope": ("fewer than 2 learned seeds",) * 2, "fox vs alibi": ("below", "within")}
    assert learned["nope vs alibi"][3].endswith("(n=3) vs " + learned["nope vs alibi"][3].split(" vs ")[1])
    assert "(n=2)" in learned["nope vs alibi"][3].split(" vs ")[1] and "(n=3)" in every["nope vs alibi"][3].split(" vs ")[1]
    assert every["nope vs alibi"][4] == "within"  # with alibi's seed 2 (0.10 at 4L) the t interval spans both
    assert every["rope+random vs rope"][4] == "fewer than 2 seeds"
    assert solved_at(main, 64, 1024, "exact", 0.9) == []  # rope+random's 0.9 is one seed: no verdict
    assert solved_at(main, 64, 1024, "exact", 0.4) == ["alibi", "fox"]  # alibi: 0.45 over seeds 0, 1
