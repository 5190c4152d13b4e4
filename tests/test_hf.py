"""run=hf:<folder>: tiny random Hugging Face models (BLOOM, which uses ALiBi; Llama, which uses RoPE; GPT-2,
which has a learned position table) and a tokenizer built offline, saved with save_pretrained and evaluated
through the command line on a toy WikiText-2 folder."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import REPO, compose_job
from forked_app import run_python

from alibi_lm.config import DataConfig
from alibi_lm.data import split_lines
from alibi_lm.errors import ConfigError, UserError
from alibi_lm.positions import PositionRangeError
from alibi_lm.subjects import hf

transformers = pytest.importorskip("transformers")
WORDS = ("the a of and to in was is on for with as by he it game season first new also played team two "
         "series war album film year 1 000 2 5 10").split()
TABLE = 32  # the tiny GPT-2's learned position table
PROMPT = ("The grass is green . The sky is blue . The sun is yellow . Here we go . There and back again . "
          "The pass key is 0 1 2 3 4 5 6 7 8 9 . Remember it . What is the pass key ?")


def toy_lines(rng, n: int) -> list[str]:
    lines = []
    for i in range(n):
        if i % 10 == 0:
            lines += [" ", f" = {' '.join(rng.choice(WORDS, 2))} = ", " "]
        words = list(rng.choice(WORDS, 14))
        lines.append(" " + " ".join(words[:5]) + " @-@ " + " ".join(words[5:9]) + " , 1 @,@ 000 ( "
                     + " ".join(words[9:]) + " ) . ")
    return lines


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """root/wikitext-2/ (toy text in WikiText's format) and root/{bloom,llama,gpt2}/ (model + tokenizer)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    root = tmp_path_factory.mktemp("hf")
    rng = np.random.default_rng(0)
    folder = root / "wikitext-2"
    folder.mkdir()
    for split, n in (("train", 200), ("valid", 60), ("test", 20)):
        lines = toy_lines(rng, n) + ([" " + PROMPT + " "] if split == "train" else [])
        (folder / f"wiki.{split}.tokens").write_text("\n".join(lines) + "\n")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    train_text = [hf.detokenize(line) for line in (folder / "wiki.train.tokens").read_text().splitlines()]
    tok.train_from_iterator(train_text, trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=tok)
    V = tok.get_vocab_size()
    torch.manual_seed(0)
    configs = {
        "bloom": transformers.BloomConfig(vocab_size=V, hidden_size=32, n_layer=2, n_head=4),
        "llama": transformers.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32),
        "gpt2": transformers.GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=TABLE,
                                        bos_token_id=0, eos_token_id=0),
    }
    for name, config in configs.items():
        transformers.AutoModelForCausalLM.from_config(config).save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root


def cli(module, *args, cwd, pre=None):
    """python -m module args; with pre, python -c "pre; run module" (e.g. to hide a package)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    command = ["-m", module] if pre is None else ["-c", f"{pre}; import runpy; runpy.run_module({module!r}, run_name='__main__')"]
    return run_python([*command, *args], env, cwd, timeout=300)


def direct_loss(model_dir: Path, data_cfg: dict, eval_len: int) -> tuple[float, int]:
    """The mean loss of nonoverlapping blocks computed with the model's own `labels=` loss."""
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    tokens, _ = hf.token_stream(tokenizer, DataConfig(**data_cfg), "valid")
    t = torch.from_numpy(tokens)
    total, n = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(t) - 1, eval_len):
            block = t[s : s + eval_len + 1][None]  # Lv inputs and their Lv next tokens
            k = block.shape[1] - 1
            total += model(input_ids=block, labels=block).loss.item() * k  # HF shifts the labels itself
            n += k
    return total / n, n


def data_cfg(root: Path) -> dict:
    return {"name": "wikitext2", "folder": "wikitext-2", "root": str(root), "raw": False}


def test_detokenize_undoes_wikitext_spacing():
    line = " The game 's well @-@ known score , 1 @,@ 000 ( or 0 @.@ 7 ) ; it is n't over . "
    assert hf.detokenize(line) == "The game's well-known score, 1,000 (or 0.7); it isn't over."
    assert hf.detokenize(" = = Reception = = ") == "= = Reception = ="
    assert hf.word_count([" a b , c ", " ", ""]) == (4 + 1) + 1 + 1  # words + one <eos> per line


def test_word_count_is_the_word_tokenizers_count(models, tmp_path):
    from alibi_lm.data import prepare_data

    cfg = dict(data_cfg(models), cache_dir=str(tmp_path / "cache"))
    data = prepare_data(cfg, {"name": "word", "vocab_size": None})
    assert hf.word_count(split_lines(cfg, "valid")) == len(data.split("valid"))


@pytest.mark.slow
@pytest.mark.parametrize("name,args,lengths", [
    ("bloom", ["hf.train_len=16", "eval.multipliers=[]", "eval.lengths=[16,48]"], [16, 48]),
    ("llama", ["eval.multipliers=[1,2]"], [32, 64]),  # L from max_position_embeddings; RoPE runs past it
])
def test_nonoverlapping_perplexity_equals_the_models_own_loss(models, tmp_path, name, args, lengths):
    out = cli("alibi_lm.eval", f"run=hf:{models / name}", "data=wikitext2", f"data.root={models}",
              f"paths.results={tmp_path}/results", *args, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    df = pd.read_csv(tmp_path / "results" / "hf" / "extrapolation.csv")
    assert sorted(df["eval_len"]) == lengths and set(df["position"]) == {f"hf:{name}"}
    assert set(df["train_len"]) == {lengths[0] if name == "llama" else 16}
    words = hf.word_count(split_lines(data_cfg(models), "valid"))
    for row in df.itertuples():
        loss, n = direct_loss(models / name, data_cfg(models), row.eval_len)
        assert row.tokens == n and row.loss == pytest.approx(loss, rel=1e-5)
        assert row.ppl == pytest.approx(math.exp(loss), rel=1e-5)
        assert row.words == words - 1 and row.word_ppl == pytest.approx(math.exp(loss * n / (words - 1)), rel=1e-5)
        assert row.commit and row.device.startswith("cpu: ") and row.wall_s > 0 and pd.isna(row.note)
        assert row.command.startswith("python -m alibi_lm.eval run=hf:")
    valid = (models / "wikitext-2" / "wiki.valid.tokens").read_bytes()
    assert set(df["data_sha"]) == {hashlib.sha256(valid).hexdigest()[:16]}  # which copy of the split was scored
    assert (tmp_path / "results" / "hf" / "extrapolation.md").is_file()
    per_position = tmp_path / "results" / "hf" / "per_position"
    assert (per_position / f"hf-{name}-L{df['train_len'].iloc[0]}-seedNA-nonoverlapping-Lv{lengths[0]}.csv").is_file()


@pytest.mark.slow
def test_sliding_rows_and_the_probes_on_a_hf_model(models, tmp_path):
    common = [f"run=hf:{models / 'bloom'}", "data=wikitext2", f"data.root={models}", "hf.train_len=16",
              f"paths.results={tmp_path}/results"]
    out = cli("alibi_lm.eval", *common, "eval.mode=sliding", "eval.stride=8", "eval.multipliers=[1,2]", cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    df = pd.read_csv(tmp_path / "results" / "hf" / "extrapolation.csv")
    assert (df["mode"] == "sliding").all() and (df["stride"] == 8).all() and df["tokens"].nunique() == 1

    out = cli("alibi_lm.probes", *common, "passkey.multipliers=[4,8]", "passkey.trials=3", "passkey.depths=[0,1]",
              "context.multiplier=4", cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    pk = pd.read_csv(tmp_path / "results" / "hf" / "passkey.csv")
    assert len(pk) == 4 and set(pk["position"]) == {"hf:bloom"} and pk["acc"].between(0, 1).all()
    assert pk["run"].str.startswith("hf:").all() and pk["seed"].isna().all()
    cu = pd.read_csv(tmp_path / "results" / "hf" / "context_use.csv")
    assert cu["context_hi"].max() == 64 and cu["loss"].notna().all()
    assert "hf:bloom" in (tmp_path / "results" / "hf" / "probes.md").read_text()


def test_scorer_matches_the_models_logits(models):
    model = transformers.AutoModelForCausalLM.from_pretrained(models / "llama", dtype=torch.float32).eval()
    scorer, idx = hf.HFScorer(model), torch.randint(0, model.config.vocab_size, (2, 40))
    with torch.no_grad():
        logits = model(input_ids=idx).logits.float()
        torch.testing.assert_close(scorer.last_logprobs(idx, 3), logits.log_softmax(-1)[:, -3:])
        torch.testing.assert_close(scorer.loss(idx[:, :-1], idx[:, 1:]).mean(),
                                   model(input_ids=idx, labels=idx).loss, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_bloom_at_explicit_lengths_needs_no_training_length(models, tmp_path):
    """BLOOM (ALiBi) names no training length in its config: eval.lengths alone scores it, its rows have no L,
    and the report gives its table without ratios to L and says so; without eval.lengths L is asked for."""
    common = (f"run=hf:{models / 'bloom'}", "data=wikitext2", f"data.root={models}", f"paths.results={tmp_path}/results")
    out = cli("alibi_lm.eval", *common, "eval.lengths=[16,48]", cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "names no training length: scoring eval.lengths only" in out.stdout  # the default multipliers need L
    results = tmp_path / "results" / "hf"
    df = pd.read_csv(results / "extrapolation.csv")
    assert sorted(df["eval_len"]) == [16, 48] and df["train_len"].isna().all() and set(df["position"]) == {"hf:bloom"}
    for row in df.itertuples():
        loss, n = direct_loss(models / "bloom", data_cfg(models), row.eval_len)
        assert row.tokens == n and row.loss == pytest.approx(loss, rel=1e-5)
    report = (results / "extrapolation.md").read_text()
    assert "## L unknown (nonoverlapping, valid" in report and "no ratios to L are given" in report
    assert "Ratios to Lv = L" not in report and (results / "extrapolation.png").is_file()
    again = cli("alibi_lm.eval", *common, "eval.lengths=[16,48]", "eval.skip_done=true", cwd=REPO)
    assert again.returncode == 0 and "already in" in again.stdout  # rows without L are found as done
    without = cli("alibi_lm.eval", *common, cwd=REPO)
    assert without.returncode == 2 and "set hf.train_len" in without.stderr


def hf_job(models, *overrides, run=None):
    """The evaluate app's typed job for run=hf:<models>/bloom on the toy data."""
    run = run or f"hf:{models / 'bloom'}"
    return compose_job("evaluate", f"run={run}", "data=wikitext2", f"data.root={models}", *overrides)


def test_check_errors(models, tmp_path):
    hf.check(hf_job(models, "hf.train_len=16"))
    with pytest.raises(UserError, match="config names no training length.*set hf.train_len"):  # BLOOM names none
        hf.check(hf_job(models))
    hf.check(hf_job(models, "eval.lengths=[16]"), needs_train_len=False)  # every length given: L is not needed
    with pytest.raises(UserError, match="needs the text to score: add data=wikitext2"):
        hf.check(compose_job("evaluate", f"run=hf:{models / 'bloom'}", "hf.train_len=16"))
    with pytest.raises(UserError, match="has no config.json"):
        hf.check(hf_job(models, run=f"hf:{tmp_path}"))
    for chosen in ("position.scaling=yarn", "extension=yarn"):  # the older spelling and the method: the same line
        with pytest.raises(UserError, match=r"^the RoPE rescaling yarn \(extension=yarn, or position.scaling=yarn\) "
                                            r"applies to runs trained with position=rope, not run=hf:.*; drop it$"):
            hf.check(hf_job(models, "hf.train_len=16", chosen))
    with pytest.raises(UserError, match="set hf.train_len"):
        hf.train_len(transformers.BloomConfig(), None)
    with pytest.raises(ConfigError, match="hf.train_len must be a positive integer"):
        hf_job(models, "hf.train_len=0")


@pytest.mark.slow
def test_without_transformers_one_line(tmp_path):
    out = cli("alibi_lm.eval", "run=hf:/some/model", "data=wikitext2", cwd=REPO,
              pre="import sys; sys.modules['transformers'] = None")
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0, out.stderr
    assert "pip install -e '.[hf]'" in out.stderr and out.stderr.startswith("error: ")


# ---- learned position tables (item: the table's end is known before any forward) ----


def test_max_positions_is_where_the_models_own_forward_stops(models):
    """GPT-2 (wpe, n_positions) and OPT (embed_positions, max_position_embeddings, a table of 2 more rows):
    max_positions is the longest input the model's own forward takes; RoPE and ALiBi models have none."""
    gpt2 = transformers.AutoModelForCausalLM.from_pretrained(models / "gpt2").eval()
    opt = transformers.OPTForCausalLM(transformers.OPTConfig(
        vocab_size=50, hidden_size=16, word_embed_proj_dim=16, num_hidden_layers=1, num_attention_heads=2, ffn_dim=32,
        max_position_embeddings=24)).eval()
    for model, n in ((gpt2, TABLE), (opt, 24)):
        scorer = hf.HFScorer(model)
        assert scorer.max_positions == n
        with torch.no_grad():
            model(input_ids=torch.zeros(1, n, dtype=torch.long))  # the table's last position: runs
            with pytest.raises(IndexError):  # one past it (on CPU; on CUDA a device-side assert)
                model(input_ids=torch.zeros(1, n + 1, dtype=torch.long))
        scorer.check_positions(n)
        with pytest.raises(PositionRangeError, match=f"position {n} is beyond the model's learned position table of {n} "):
            scorer.check_positions(n + 1)
    for name in ("bloom", "llama"):
        scorer = hf.HFScorer(transformers.AutoModelForCausalLM.from_pretrained(models / name))
        assert scorer.max_positions is None
        scorer.check_positions(10**6)


# An index past an nn.Embedding's table as on CUDA: a RuntimeError (a device-side assert), not an IndexError.
CUDA_LIKE_EMBEDDING = '''
import torch

_forward = torch.nn.Embedding.forward


def forward(self, idx):
    if idx.numel() and int(idx.max()) >= self.num_embeddings:
        raise RuntimeError("CUDA error: device-side assert triggered")
    return _forward(self, idx)


torch.nn.Embedding.forward = forward
'''


@pytest.mark.slow
def test_past_a_learned_table_is_not_applicable_without_running_the_forward(models, tmp_path):
    (tmp_path / "cuda_like_embedding.py").write_text(CUDA_LIKE_EMBEDDING)
    pre = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import cuda_like_embedding"
    common = [f"run=hf:{models / 'gpt2'}", "data=wikitext2", f"data.root={models}", f"paths.results={tmp_path}/results"]
    out = cli("alibi_lm.eval", *common, "eval.multipliers=[1,2]", cwd=REPO, pre=pre)  # L = n_positions = 32
    assert out.returncode == 0, out.stderr[-3000:]
    df = pd.read_csv(tmp_path / "results" / "hf" / "extrapolation.csv").set_index("eval_len")
    assert sorted(df.index) == [TABLE, 2 * TABLE] and np.isfinite(df.loc[TABLE, "ppl"]) and pd.isna(df.loc[TABLE, "note"])
    assert pd.isna(df.loc[2 * TABLE, "ppl"])
    assert df.loc[2 * TABLE, "note"] == f"not applicable: position {2 * TABLE - 1} is beyond the model's learned " \
                                         f"position table of {TABLE} positions"

    out = cli("alibi_lm.probes", *common, "passkey.multipliers=[2]", "passkey.trials=2", "passkey.depths=[0,1]",
              "context.multiplier=4", cwd=REPO, pre=pre)
    assert out.returncode == 0, out.stderr[-3000:]
    pk = pd.read_csv(tmp_path / "results" / "hf" / "passkey.csv")
    assert len(pk) == 2 and pk["note"].str.startswith(f"not applicable: position {2 * TABLE - 1} is beyond").all()
    cu = pd.read_csv(tmp_path / "results" / "hf" / "context_use.csv")  # Lv = 4 x 32, cut to the table's end
    assert cu["context_hi"].max() == TABLE and (cu["eval_len"] == TABLE).all() and cu["loss"].notna().all()
    assert (cu["note"] == f"curve up to context {TABLE} only: the position table's end").all()


# ---- two model folders of the same name (item: one results name, two models) ----


def test_a_results_name_taken_by_another_folder_is_refused(models, tmp_path):
    """Any table in the results folder counts (here the passkey probe's); the same folder, given by another
    path, is not refused."""
    a, b = (tmp_path / "a" / "final").resolve(), (tmp_path / "b" / "final").resolve()
    for folder in (a, b):
        shutil.copytree(models / "bloom", folder)
    results = tmp_path / "results"
    (results / "hf").mkdir(parents=True)
    pd.DataFrame([dict(position="hf:final", train_len=16, eval_len=64, run=f"hf:{a}", acc=0.5)]).to_csv(
        results / "hf" / "passkey.csv", index=False)
    job = hf_job(models, "hf.train_len=16", f"paths.results={results}", run=f"hf:{b}")
    with pytest.raises(UserError) as error:
        hf.results_dir(job)
    assert str(error.value) == (f"{results / 'hf' / 'passkey.csv'} already holds hf:final from {a}, not {b}: two models "
                                f"named final cannot share {results / 'hf'}; set hf.experiment=hf-b (another results "
                                f"folder) or rename one of the folders")
    same = hf_job(models, "hf.train_len=16", f"paths.results={results}", run=f"hf:{tmp_path}/b/../a/final")
    assert hf.results_dir(same) == results / "hf"
    other = hf_job(models, "hf.train_len=16", f"paths.results={results}", "hf.experiment=hf-b", run=f"hf:{b}")
    assert hf.results_dir(other) == results / "hf-b"


@pytest.mark.slow
def test_two_folders_of_the_same_name_do_not_share_results(models, tmp_path):
    a, b = (tmp_path / "a" / "final").resolve(), (tmp_path / "b" / "final").resolve()
    shutil.copytree(models / "bloom", a)
    shutil.copytree(models / "llama", b)
    common = ["data=wikitext2", f"data.root={models}", "hf.train_len=16", "eval.multipliers=[1]",
              f"paths.results={tmp_path}/results"]
    csv = tmp_path / "results" / "hf" / "extrapolation.csv"
    out = cli("alibi_lm.eval", "run=hf:a/final", *common, cwd=tmp_path)  # relative to the working directory
    assert out.returncode == 0, out.stderr[-3000:]
    first = pd.read_csv(csv)
    assert first[["position", "run"]].values.tolist() == [["hf:final", "hf:a/final"]]

    out = cli("alibi_lm.eval", "run=hf:b/final", *common, cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0, out.stderr
    assert out.stderr.startswith(f"error: {csv} already holds hf:final from {a}, not {b}: ")
    assert "set hf.experiment=hf-b" in out.stderr
    pd.testing.assert_frame_equal(pd.read_csv(csv), first)  # nothing replaced, nothing skipped as done

    # a -m sweep over both: the preflight sees an empty folder, so the second job is refused when it starts
    out = cli("alibi_lm.eval", "-m", f"run=hf:{a},hf:b/final", *common, "hf.experiment=both", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.strip().splitlines()[-1].startswith("error: "), out.stderr
    both = pd.read_csv(tmp_path / "results" / "both" / "extrapolation.csv")
    assert both[["position", "run"]].values.tolist() == [["hf:final", f"hf:{a}"]]

    out = cli("alibi_lm.eval", "run=hf:b/final", *common, "hf.experiment=hf-b", cwd=tmp_path)  # the fix it names
    assert out.returncode == 0, out.stderr[-3000:]
    assert pd.read_csv(tmp_path / "results" / "hf-b" / "extrapolation.csv")["run"].tolist() == ["hf:b/final"]
    out = cli("alibi_lm.probes", "run=hf:b/final", *common[:3], "probe=context", f"paths.results={tmp_path}/results",
              cwd=tmp_path)  # the probes share the folder's names
    assert out.returncode == 2 and out.stderr.startswith(f"error: {csv} already holds hf:final from {a}"), out.stderr


# ---- code and pickles from a model folder -----------------------------------------------------------------


def test_code_shipped_in_a_model_folder_never_runs_unless_asked(models, tmp_path):
    """A folder whose config maps AutoConfig to its own module (custom architectures do this): without
    hf.trust_remote_code the check refuses it in one line, and the module is never imported."""
    folder = tmp_path / "custom"
    shutil.copytree(models / "bloom", folder)
    marker = tmp_path / "RAN"
    (folder / "custom_config.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
        "from transformers import BloomConfig\n\nclass CustomConfig(BloomConfig):\n    model_type = 'custom'\n")
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="custom", auto_map={"AutoConfig": "custom_config.CustomConfig"})  # not a built-in type
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="hf.trust_remote_code=true only if you trust it"):
        hf.check(hf_job(models, "eval.lengths=[16]", run=f"hf:{folder}"), needs_train_len=False)
    assert not marker.exists()
    assert compose_job("evaluate", f"run=hf:{folder}").hf.trust_remote_code is False


def test_weights_come_from_safetensors_where_the_folder_has_them(models, monkeypatch):
    seen = {}
    real = transformers.AutoModelForCausalLM.from_pretrained

    def spy(folder, **kwargs):
        seen.update(kwargs)
        return real(folder, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy)
    assert list((models / "bloom").glob("*.safetensors"))
    hf.load(f"hf:{models / 'bloom'}", torch.device("cpu"))
    assert seen["use_safetensors"] is True and seen["trust_remote_code"] is False
