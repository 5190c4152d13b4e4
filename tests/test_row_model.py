"""A results row names the model it was scored from (provenance.model_digest of its config) and is replaced only by
a row of the same model: two run folders of the same name, scheme, L and seed but different models cannot
overwrite each other's rows."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict

import pandas as pd
import pytest
import torch
from conftest import fake_run_data, write_run

from alibi_lm.config import EvalConfig
from alibi_lm.errors import UserError
from alibi_lm.eval import evaluation
from alibi_lm.model import LMConfig, TransformerLM
from alibi_lm.provenance import model_digest
from alibi_lm.results import retrieval_store, store, task_store

V = 50


def model(d_model: int) -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(LMConfig(vocab_size=V, n_layer=2, n_head=2, d_model=d_model, position="alibi")).eval()


@pytest.fixture
def fake_data(monkeypatch):
    return fake_run_data(monkeypatch, V, 16 * 4 + 1)


def evaluate(run, results):
    cfg = EvalConfig(multipliers=[1], tokens_per_batch=256)
    return evaluation.evaluate_run(run, cfg, results, device="cpu", progress=False)


def test_the_digest_is_sha256_of_the_sorted_config():
    cfg = asdict(model(16).cfg)
    expected = hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()[:12]
    assert model_digest(cfg) == expected
    assert model_digest(asdict(model(32).cfg)) != expected


def test_another_model_with_the_same_key_is_refused_and_the_table_is_unchanged(tmp_path, fake_data):
    results = tmp_path / "results"
    first = write_run(tmp_path / "a", model(16))
    rows = evaluate(first, results)
    assert rows[0]["model"] == model_digest(asdict(model(16).cfg))
    csv = results / "exp" / store.CSV_NAME
    before = csv.read_bytes()
    other = write_run(tmp_path / "b", model(32))  # same name, scheme, L and seed: the same row key
    per_position = {f: f.read_bytes() for f in (results / "exp" / "per_position").glob("*.csv")}
    with pytest.raises(UserError, match=r"holds rows of another model .* evaluate it with paths.results=<another "):
        evaluate(other, results)
    assert csv.read_bytes() == before
    # refused before any length is scored: the first model's per-position losses are its own still
    assert per_position and {f: f.read_bytes() for f in (results / "exp" / "per_position").glob("*.csv")} == per_position
    assert len(evaluate(first, results)) == 1  # the same model's row is replaced, as before


def test_a_row_written_before_the_model_column_is_replaced(tmp_path, fake_data):
    results = tmp_path / "results"
    run = write_run(tmp_path / "a", model(16))
    evaluate(run, results)
    csv = results / "exp" / store.CSV_NAME
    old = pd.read_csv(csv).drop(columns=["model"]).assign(ppl=1.0, loss=0.0)  # an earlier version's table, another value
    csv.write_text(old.to_csv(index=False))
    evaluate(run, results)
    after = pd.read_csv(csv)
    assert len(after) == 1 and after["ppl"].iloc[0] != 1.0 and after["model"].iloc[0] == model_digest(
        asdict(model(16).cfg))


@pytest.mark.parametrize("table", ["over_training", "retrieval"])
def test_a_task_tables_row_of_another_model_is_refused_and_an_older_row_without_one_is_replaced(tmp_path, table):
    """over_training.csv and retrieval.csv name the model too: a row of the same key from another model is refused
    in one line and the file is left as it was; a row written before the column existed (no model) is replaced."""
    key = dict(task="passkey", task_options="", position="alibi", positions="sequential", train_len=64, seed=0,
               eval_len=256, run="runs/tasks/passkey-alibi-L64-seed0", weights="0123456789abcdef")
    write, read, path = {
        "over_training": (task_store.upsert_over_training, task_store.read_over_training,
                          tmp_path / task_store.OVER_TRAINING_CSV),
        "retrieval": (retrieval_store.write_rows, retrieval_store.read_retrieval, tmp_path / retrieval_store.RETRIEVAL_CSV),
    }[table]
    extra = dict(step=1000, exact=0.5, token_acc=0.5, examples=1024) if table == "over_training" else dict(
        distance=8, layer=0, head=0, attention=0.5, token_acc=0.5, answers=10, step=1000)
    write(path, [dict(key, **extra, model="aaaaaaaaaaaa")])
    assert read(path)["model"].tolist() == ["aaaaaaaaaaaa"]
    before = path.read_bytes()
    with pytest.raises(UserError, match=r"holds rows of another model \(aaaaaaaaaaaa, this one is bbbbbbbbbbbb\)"):
        write(path, [dict(key, **extra, model="bbbbbbbbbbbb")])
    assert path.read_bytes() == before
    path.write_text(read(path).drop(columns=["model"]).to_csv(index=False))  # an earlier version's table
    write(path, [dict(key, **extra, model="bbbbbbbbbbbb")])
    assert read(path)["model"].tolist() == ["bbbbbbbbbbbb"]


@pytest.mark.parametrize("digest", ["123e45678901", "012345678901"])
def test_a_model_digest_that_reads_as_a_number_stays_text_and_its_row_is_replaced(tmp_path, digest):
    """A digest of digits (and one 'e') would be read by pandas as a number (inf; a leading zero lost) and then differ
    from itself: the model column is read as text, so the same model's row is replaced, not refused."""
    key = dict(task="passkey", task_options="", position="alibi", positions="sequential", train_len=64, seed=0,
               eval_len=256, step=1000, run="runs/tasks/passkey-alibi-L64-seed0", weights="0123456789abcdef")
    path = tmp_path / task_store.OVER_TRAINING_CSV
    for exact in (0.5, 0.25):
        task_store.upsert_over_training(path, [dict(key, exact=exact, token_acc=exact, examples=1024, model=digest)])
    rows = task_store.read_over_training(path)
    assert rows["model"].tolist() == [digest] and rows["exact"].tolist() == [0.25]
