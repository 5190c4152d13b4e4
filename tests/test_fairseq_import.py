"""Importing the paper's official fairseq checkpoints (alibi_lm/fairseq_format/, alibi_lm/fairseq_import.py).

The fixtures (../shared/fixtures/fairseq-alibi, beside the checkout, never copied in) hold two small
transformer_lm checkpoints made with the official code, its dict.txt of WikiText-2's training split, and the
official fairseq-eval-lm's per-token log-probabilities on the first 71 lines of the validation split. The
imports read the real WikiText-2 (its dictionary must give the checkpoints' ids).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from forked_app import run_python

from alibi_lm.eval.evaluation import Evaluation
from alibi_lm.eval.scoring import plan_windows, score_stream
from alibi_lm.fairseq_format.dictionary import build_entries, count_words, dictionary_text
from alibi_lm.fairseq_import import main
from alibi_lm.model import KVCache
from alibi_lm.positions.alibi import alibi_slopes
from alibi_lm.subjects import open_native

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO.parent / "shared" / "fixtures" / "fairseq-alibi"
MODELS = ("alibi-h4", "alibi-h6-fp16")


def wikitext2_root() -> Path | None:
    for root in (os.environ.get("ALIBI_LM_DATA"), REPO.parent / "shared" / "data"):
        if root and (Path(root) / "wikitext-2" / "wiki.train.tokens").is_file():
            return Path(root)
    return None


pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason=f"the fairseq fixtures are not at {FIXTURES}")
needs_wikitext2 = pytest.mark.skipif(wikitext2_root() is None, reason="real WikiText-2 not found ($ALIBI_LM_DATA/wikitext-2)")


def reference(model: str) -> dict:
    return json.loads((FIXTURES / model / "reference.json").read_text())


def import_args(checkpoint: Path, out: Path, cache: Path) -> list[str]:
    return [str(checkpoint), "--dict", str(FIXTURES / "dict.txt"), "--data", "wikitext2", "--data-root",
            str(wikitext2_root()), "--cache", str(cache), "--out", str(out)]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")  # WikiText-2 tokenized once with tokenizer=fairseq for the module


@pytest.fixture(scope="module")
def runs(tmp_path_factory, cache) -> dict[str, Path]:
    """Both fixtures imported through the command line's main()."""
    if wikitext2_root() is None:
        pytest.skip("real WikiText-2 not found ($ALIBI_LM_DATA/wikitext-2)")
    root = tmp_path_factory.mktemp("runs")
    for model in MODELS:
        main(import_args(FIXTURES / model / "checkpoint.pt", root / model, cache))
    return {model: root / model for model in MODELS}


# ---- the dictionary ------------------------------------------------------------------------------------

@needs_wikitext2
def test_dictionary_built_from_text_is_fairseqs_byte_for_byte(tmp_path):
    out = tmp_path / "dict.txt"
    main(["dict", str(wikitext2_root() / "wikitext-2" / "wiki.train.tokens"), "--out", str(out)])
    assert out.read_bytes() == (FIXTURES / "dict.txt").read_bytes()


def test_the_dictionary_command_keeps_an_existing_file_and_refuses_empty_text(tmp_path, capsys):
    """--out over an existing dict.txt replaced it silently (the importer refuses the same without --force)."""
    text, out = tmp_path / "train.tokens", tmp_path / "dict.txt"
    text.write_text("a b b\n")
    out.write_text("kept 1\n")
    for argv, said in ((["--out", str(out)], "exists and would be replaced; add --force"),
                       (["--out", str(tmp_path)], "is a folder; give the path of the file to write")):
        with pytest.raises(SystemExit) as stop:
            main(["dict", str(text), *argv])
        assert stop.value.code == 2 and said in capsys.readouterr().err
    assert out.read_text() == "kept 1\n"
    main(["dict", str(text), "--out", str(out), "--force"])
    assert out.read_text().startswith("b 2\na 1\n")
    text.write_text("\n\n")
    with pytest.raises(SystemExit):
        main(["dict", str(text), "--out", str(tmp_path / "new.txt")])
    assert "holds no words" in capsys.readouterr().err and not (tmp_path / "new.txt").exists()


def test_dictionary_order_ties_and_padding():
    # counts descending, equal counts by code point ("B" < "a" < "b" < "é"), </s> once per line (blank ones
    # too) and <unk> counted as the special, never written; 4 specials + 5 words padded to 16 ids
    lines = ["b a é B", "", "a <unk> c", "c c"]
    assert dictionary_text(build_entries(count_words(lines))) == (
        "c 3\na 2\nB 1\nb 1\né 1\n" + "".join(f"madeupword{i:04d} 0\n" for i in range(7)))


# ---- the import --------------------------------------------------------------------------------------

@needs_wikitext2
@pytest.mark.parametrize("model", MODELS)
def test_run_folder_records_its_source_and_official_slopes(runs, model):
    status = json.loads((runs[model] / "status.json").read_text())
    assert status["status"] == "completed"
    source = status["imported_from"]
    assert source["path"] == str((FIXTURES / model / "checkpoint.pt").resolve()) and len(source["sha256"]) == 64
    assert source["dtype"] == ("float16" if "fp16" in model else "float32") and source["stored_as"] == "float32"
    subject = open_native(runs[model], runs[model].parent / "results", torch.device("cpu"))
    slopes = subject.scorer.model.position.slopes
    assert slopes.tolist() == reference(model)["slopes"] == alibi_slopes(len(slopes)).tolist()
    assert subject.identity == dict(position="alibi", train_len=32, seed=1)
    assert all(p.dtype == torch.float32 for p in subject.scorer.model.parameters())


class Recorder:
    """A scorer that keeps the per-token NLL of every window score_stream asks for, in call order."""

    def __init__(self, scorer):
        self.scorer, self.calls = scorer, []

    def __call__(self, idx, targets):
        nll = self.scorer(idx, targets)  # (B, T)
        self.calls.extend(nll.float().numpy())
        return nll


def per_token_logprobs(scorer, tokens: np.ndarray, eval_len: int, mode: str) -> tuple[np.ndarray, float]:
    """Each target's log-probability as score_stream scores it, and score_stream's own mean loss."""
    stride = 1 if mode == "sliding" else None
    recorder = Recorder(scorer)
    result = score_stream(recorder, tokens, eval_len, mode, stride)
    windows = plan_windows(len(tokens), eval_len, mode, stride)
    # score_stream scores windows grouped by length, in the order each length first appears
    ordered = [w for length in dict.fromkeys(w.length for w in windows) for w in windows if w.length == length]
    logprobs = np.full(len(tokens) - 1, np.nan)
    for w, nll in zip(ordered, recorder.calls, strict=True):
        logprobs[w.start + w.first_scored : w.start + w.length] = -nll[w.first_scored : w.length]
    return logprobs, result.loss


@needs_wikitext2
@pytest.mark.parametrize("model", MODELS)
def test_scores_match_the_official_fairseq_eval_lm(runs, model):
    """Every per-token log-probability of every protocol in reference.json, through score_stream on the run's
    own token stream: the tokenizer=fairseq stream opens with <eos>, so its N - 1 targets are fairseq's N ids in
    fairseq's blocks (first block [</s>] + ids[:l-1]; sliding src = [</s>] + ids[:-1])."""
    ref = reference(model)
    subject = open_native(runs[model], runs[model].parent / "results", torch.device("cpu"))
    ids = ref["valid_ids"]
    tokens = np.asarray(subject.tokens("valid")[: len(ids) + 1], dtype=np.int64)
    assert tokens.tolist() == [2, *ids]  # the run's stream of valid.tokens' lines, after its opening <eos>
    worst = {}
    for run in ref["runs"]:
        mode = "nonoverlapping" if run["context_window"] == 0 else "sliding"
        logprobs, loss = per_token_logprobs(subject.scorer, tokens, run["eval_len"], mode)
        official = np.asarray(run["logprobs"])
        worst[f"{mode} {run['eval_len']}"] = float(np.abs(logprobs - official).max())
        assert loss == pytest.approx(-official.mean(), abs=1e-5)
    print(f"{model}: largest |difference| per protocol {worst}")
    assert max(worst.values()) <= 1e-4, worst


@needs_wikitext2
def test_evaluation_rows_are_the_official_perplexities(runs, tmp_path):
    """The evaluate app's path (Evaluation over the run's Subject) on the fixture's 4,070 targets."""
    ref = reference("alibi-h6-fp16")
    subject = open_native(runs["alibi-h6-fp16"], tmp_path / "results", torch.device("cpu"))
    for mode, stride, lengths in (("nonoverlapping", None, [32, 64, 128]), ("sliding", 1, [32])):
        eval_cfg = dict(mode=mode, stride=stride, lengths=lengths, multipliers=[], max_tokens=len(ref["valid_ids"]))
        rows = Evaluation(subject, eval_cfg, progress=False).run()
        official = {(r["eval_len"], r["context_window"] > 0): -np.mean(r["logprobs"]) for r in ref["runs"]}
        for row in rows:
            assert row["tokens"] == len(ref["valid_ids"])
            assert row["loss"] == pytest.approx(official[row["eval_len"], mode == "sliding"], abs=1e-5)
    table = pd.read_csv(tmp_path / "results" / "fairseq" / "extrapolation.csv")
    assert len(table) == 4 and set(table["position"]) == {"alibi"}


@needs_wikitext2
def test_kv_cache_decoding_matches_the_full_forward(runs):
    """The project's KV cache keeps ALiBi's bias (the official incremental decoder drops it)."""
    model = open_native(runs["alibi-h6-fp16"], runs["alibi-h6-fp16"].parent / "r", torch.device("cpu")).scorer.model
    idx = torch.tensor([[2, *reference("alibi-h6-fp16")["valid_ids"][:47]]])  # (1, 48): past L = 32
    with torch.no_grad():
        full = model(idx)  # (1, 48, V)
        cache = KVCache(model.cfg.n_layer)
        steps = [model(idx[:, :8], start_pos=0, cache=cache)]
        steps += [model(idx[:, t : t + 1], start_pos=t, cache=cache) for t in range(8, idx.shape[1])]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


# ---- safe loading and errors -------------------------------------------------------------------------

class Payload:
    """Runs a shell command when unpickled by a full unpickler."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def fixture_state() -> dict:
    return torch.load(FIXTURES / "alibi-h4" / "checkpoint.pt", map_location="cpu", weights_only=True)


def run_import(checkpoint: Path, out: Path, capsys) -> tuple[int, str]:
    """main() on checkpoint: (exit status, stderr); nothing may be written at out or beside it."""
    with pytest.raises(SystemExit) as exit_info:
        main(import_args(checkpoint, out, out.parent / "cache"))
    err = capsys.readouterr().err
    assert not out.exists() and not list(out.parent.glob(f".{out.name}*"))
    return exit_info.value.code, err


def test_a_pickled_payload_is_refused_and_never_runs(tmp_path, capsys):
    marker = tmp_path / "payload-ran"
    state = fixture_state()
    state["extra_state"] = {"hook": Payload(f"touch {marker}")}
    torch.save(state, tmp_path / "evil.pt")
    status, err = run_import(tmp_path / "evil.pt", tmp_path / "run", capsys)
    assert status == 2 and not marker.exists()
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err
    assert str(tmp_path / "evil.pt") in err and ("posix.system" in err or "nt.system" in err)


def damaged(tmp_path: Path, how: str) -> Path:
    path = tmp_path / f"{how}.pt"
    raw = (FIXTURES / "alibi-h4" / "checkpoint.pt").read_bytes()
    if how == "random":
        path.write_bytes(np.random.default_rng(0).bytes(4096))
        return path
    if how == "truncated":
        path.write_bytes(raw[: len(raw) // 2])
        return path
    state = fixture_state()
    if how == "wrong_arch":
        state["cfg"]["model"]["_name"] = "transformer_wmt_en_de"
    elif how == "no_decoder":
        state["model"] = {k: v for k, v in state["model"].items() if not k.startswith("decoder.layers.")}
    elif how == "no_cutoffs":
        del state["cfg"]["model"]["adaptive_input_cutoff"]
    elif how == "extra_tensor":  # a final LayerNorm the architecture says it does not have
        state["model"]["decoder.layer_norm.weight"] = torch.ones(32)
    elif how == "post_ln":
        state["cfg"]["model"]["decoder_normalize_before"] = False
    torch.save(state, path)
    return path


@pytest.mark.parametrize("how, says", [
    ("random", "not a torch checkpoint"), ("truncated", "truncated or corrupt"),
    ("wrong_arch", "not a fairseq transformer_lm"), ("no_decoder", "no decoder.layers"),
    ("no_cutoffs", "no adaptive_input_cutoff"), ("extra_tensor", "decoder.layer_norm.weight"),
    ("post_ln", "decoder_normalize_before=False"),
])  # fmt: skip
def test_a_checkpoint_that_cannot_be_imported_is_one_line(tmp_path, capsys, how, says):
    status, err = run_import(damaged(tmp_path, how), tmp_path / "run", capsys)
    assert status == 2 and err.count("\n") == 1 and err.startswith("error: ") and says in err, err


def test_a_dictionary_of_another_size_is_refused(tmp_path, capsys):
    small = tmp_path / "dict.txt"
    small.write_text("".join((FIXTURES / "dict.txt").read_text().splitlines(keepends=True)[:100]))
    with pytest.raises(SystemExit) as exit_info:
        main([str(FIXTURES / "alibi-h4" / "checkpoint.pt"), "--dict", str(small), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "33,280 token ids but the dictionary gives 104" in err
    assert not (tmp_path / "run").exists()


def test_a_reordered_dictionary_is_refused(tmp_path, capsys):
    """Two lines of dict.txt swapped imported without a word, and the run scored 47,732 where it scores 49,520."""
    lines = (FIXTURES / "dict.txt").read_text().splitlines(keepends=True)
    swapped = tmp_path / "dict.txt"
    swapped.write_text("".join([lines[1], lines[0], *lines[2:]]))
    with pytest.raises(SystemExit) as exit_info:
        main([str(FIXTURES / "alibi-h4" / "checkpoint.pt"), "--dict", str(swapped), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and f"{swapped}:2: 'the' counts 113161 after a word counting 99913" in err
    assert not (tmp_path / "run").exists()


@needs_wikitext2
def test_an_older_file_with_argparse_args_imports_the_same(runs, tmp_path, cache):
    """Older fairseq files hold an argparse.Namespace in `args` (the one type allowed by name) and no cfg."""
    state = fixture_state()
    cfg = state.pop("cfg")
    state["args"] = argparse.Namespace(**{**cfg["model"], "arch": cfg["model"]["_name"], "seed": 1})
    torch.save(state, tmp_path / "old.pt")
    main(import_args(tmp_path / "old.pt", tmp_path / "run", cache))
    old = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    new = torch.load(runs["alibi-h4"] / "checkpoint.pt", weights_only=True)
    assert old["model_config"] == new["model_config"]
    assert all(torch.equal(old["model"][k], new["model"][k]) for k in new["model"])


# ---- the apps on an imported run folder --------------------------------------------------------------

@pytest.mark.slow
@needs_wikitext2
def test_command_lines_on_imported_runs(tmp_path):
    """Import both fixtures with the command line, then a sweep of the evaluate app over them (both
    protocols) and the probes app on one."""
    env = {**os.environ, "ALIBI_LM_DATA": str(wikitext2_root()), "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO)}
    paths = [f"paths.cache={tmp_path / 'cache'}", f"paths.results={tmp_path / 'results'}"]

    def run(*args):
        done = run_python(["-m", *args], env, tmp_path, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    for model in MODELS:  # two experiments: both fixtures are alibi, L = 32, seed 1 (one results key)
        run("alibi_lm.fairseq_import", str(FIXTURES / model / "checkpoint.pt"), "--dict", str(FIXTURES / "dict.txt"),
            "--data", "wikitext2", "--cache", str(tmp_path / "cache"), "--name", model, "--runs", str(tmp_path / "runs"))
    folders = ",".join(str(p) for p in sorted((tmp_path / "runs").glob("*/alibi-L32-seed1")))
    run("alibi_lm.eval", "-m", f"run={folders}", "eval.max_tokens=4070", "eval.multipliers=[1,2,4]", *paths)
    run("alibi_lm.eval", f"run={tmp_path / 'runs' / 'alibi-h6-fp16' / 'alibi-L32-seed1'}", "eval.mode=sliding",
        "eval.stride=1", "eval.max_tokens=4070", "eval.multipliers=[1,2]", *paths)
    table = pd.read_csv(tmp_path / "results" / "alibi-h6-fp16" / "extrapolation.csv")
    official = {(r["eval_len"], r["context_window"] > 0): -np.mean(r["logprobs"]) for r in reference("alibi-h6-fp16")["runs"]}
    for row in table.itertuples():
        assert row.loss == pytest.approx(official[row.eval_len, row.mode == "sliding"], abs=1e-5)
    assert len(pd.read_csv(tmp_path / "results" / "alibi-h4" / "extrapolation.csv")) == 3
    run("alibi_lm.results", str(tmp_path / "results" / "alibi-h4"))  # the report app
    assert "| alibi |" in (tmp_path / "results" / "alibi-h4" / "extrapolation.md").read_text()
    run("alibi_lm.probes", "-m", f"run={tmp_path / 'runs' / 'alibi-h6-fp16' / 'alibi-L32-seed1'}",
        "passkey.multipliers=[1,2]", "passkey.trials=2", "passkey.depths=[0,1]", "context.multiplier=4",
        "context.max_tokens=4000", *paths)
    assert (tmp_path / "results" / "alibi-h6-fp16" / "probes.md").is_file()
    # the sweeps (-m) wrote their rows to results/, Hydra's record into the cache: no multirun/<date>/<time>/<n>/
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "results", "runs"]
    assert sorted(p.name for p in (tmp_path / "cache" / "multirun").iterdir()) == ["multirun.yaml"]


def test_a_dictionary_in_another_order_moves_rows_within_their_band():
    from alibi_lm.errors import UserError
    from alibi_lm.fairseq_format.convert import reorder_vocab, vocabulary_order

    edges = [0, 6, 8]  # band 0: ids 0-5 (4 specials, a, b), band 1: ids 6-7 (c, d)
    order = vocabulary_order(["b", "a", "d", "c"], ["a", "b", "c", "d"], edges, Path("dict.txt"))
    assert order == [0, 1, 2, 3, 5, 4, 7, 6]
    weights = {"vocab.tables.0": torch.arange(6.0)[:, None], "vocab.tables.1": torch.arange(6.0, 8.0)[:, None]}
    reorder_vocab(weights, order, edges)
    assert weights["vocab.tables.0"].flatten().tolist() == [0, 1, 2, 3, 5, 4]
    assert weights["vocab.tables.1"].flatten().tolist() == [7, 6]
    assert vocabulary_order(["a", "b"], ["a", "b"], [0, 6], Path("d")) is None
    with pytest.raises(UserError, match="'d' is id 5 in the data's, id 7 there, in another adaptive band"):
        vocabulary_order(["a", "d", "c", "b"], ["a", "c", "b", "d"], edges, Path("dict.txt"))


def test_tokenizer_fairseq_keeps_every_type():
    from alibi_lm.config import TokenizerConfig
    from alibi_lm.errors import ConfigError

    assert TokenizerConfig(name="fairseq").settings == {"name": "fairseq", "vocab_size": None}
    with pytest.raises(ConfigError, match="tokenizer.vocab_size must be null for fairseq"):
        TokenizerConfig(name="fairseq", vocab_size=1000)


@needs_wikitext2
@pytest.mark.parametrize("what, says", [
    ("file", "is a file; --force replaces only a run folder"),
    ("runs_tree", "holds no checkpoint.pt, status.json or config.yaml; --force replaces only a run folder"),
])
def test_force_replaces_a_run_folder_never_a_file_or_a_folder_of_runs(runs, tmp_path, cache, capsys, what, says):
    """--force replaces an imported or trained run; a file of the user's or a runs tree given as --out is refused
    in one line before any work, and left as it was."""
    out = tmp_path / "out"
    if what == "file":
        out.write_text("my notes\n")
    else:
        shutil.copytree(runs["alibi-h4"], out / "some-run")  # a folder of runs
    before = sorted((p.relative_to(tmp_path), p.read_bytes() if p.is_file() else b"") for p in tmp_path.rglob("*"))
    with pytest.raises(SystemExit) as exit_info:
        main([*import_args(FIXTURES / "alibi-h4" / "checkpoint.pt", out, cache), "--force"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and says in err, err
    assert sorted((p.relative_to(tmp_path), p.read_bytes() if p.is_file() else b"") for p in tmp_path.rglob("*")) == before
    replaced = tmp_path / "replaced"
    shutil.copytree(runs["alibi-h4"], replaced)  # a run folder: --force replaces it
    main([*import_args(FIXTURES / "alibi-h4" / "checkpoint.pt", replaced, cache), "--force"])
    assert (replaced / "checkpoint.pt").is_file()
