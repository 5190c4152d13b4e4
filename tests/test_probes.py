"""Probes beyond perplexity: passkey prompts and scores, the context-use curve and its threshold, and the
probes command line on toy run folders (no real data, no network)."""

from __future__ import annotations

import hashlib
import math
import os
import re
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import REPO, HandMadeSubject, compose_job, make, write_corpus
from forked_app import run_python
from omegaconf import OmegaConf

from alibi_lm.data import prepare_data
from alibi_lm.errors import ConfigError, UserError
from alibi_lm.probes import context_use, report
from alibi_lm.probes import passkey_probe as passkey
from alibi_lm.probes.config import ContextConfig, PasskeyConfig
from alibi_lm.subjects import NativeScorer

FILLER = "The grass is green . The sky is blue . The sun is yellow . Here we go . There and back again ."
KEY_TEXT = "The pass key is {key} . Remember it . {key} is the pass key ."
CUE = "What is the pass key ? The pass key is"


class Vocab:
    """A word-level encoder that gives every new word the next id (digits first, as ids 0-9)."""

    def __init__(self):
        self.ids = {str(d): d for d in range(10)}

    def encode(self, text: str) -> list[int]:
        return [self.ids.setdefault(w, len(self.ids)) for w in text.split()]


def template(vocab=None, key_text=KEY_TEXT, cue=CUE, filler=FILLER):
    vocab = vocab or Vocab()
    return passkey.make_template(vocab.encode, list(range(10)), key_text, cue, filler), vocab


def find(seq, sub) -> list[int]:
    seq, sub = list(seq), list(sub)
    return [i for i in range(len(seq) - len(sub) + 1) if seq[i : i + len(sub)] == sub]


# ---- prompt construction ----


@pytest.mark.parametrize("eval_len", [38, 39, 64, 100, 1024])
@pytest.mark.parametrize("depth", [0, 0.1, 0.25, 0.5, 0.75, 1])
def test_prompt_has_length_lv_plus_1_and_the_key_at_the_requested_depth(eval_len, depth):
    t, _ = template()
    key = [3, 1, 4, 1, 5]
    statement = t.statement(key)
    n_filler = eval_len + 1 - len(statement) - len(t.cue) - len(key)
    filler = passkey.repeat_filler(t)(n_filler + len(statement), None)
    seq, at = passkey.build_prompt(t, key, eval_len, depth, filler)
    assert len(seq) == eval_len + 1  # the model reads exactly Lv tokens; the last key token is only a target
    assert at == round(depth * n_filler) == passkey.key_position(t, len(key), eval_len, depth)
    assert find(seq, statement) == [at]  # the key statement once, exactly where asked
    assert list(seq[:at]) == list(filler[:at]) and list(seq[at + len(statement) : -len(t.cue) - 5]) == list(filler[at:n_filler])
    assert list(seq[-5:]) == key and list(seq[-5 - len(t.cue) : -5]) == t.cue
    # no key: the statement's place is taken by the filler that follows; same length, cue and targets
    base, _ = passkey.build_prompt(t, key, eval_len, depth, filler, with_key=False)
    assert len(base) == eval_len + 1 and list(base[-5 - len(t.cue) :]) == t.cue + key
    assert list(base[: -5 - len(t.cue)]) == list(filler) and not find(base, statement)
    # another key in the statement: only the statement's digits differ, the targets are still the key
    other, _ = passkey.build_prompt(t, key, eval_len, depth, filler, statement_key=[3, 9, 4, 9, 5])
    assert find(other, t.statement([3, 9, 4, 9, 5])) == [at] and list(other[-5:]) == key
    assert (other != seq).sum() == 2 * 2  # the 2 digits that differ (3 1 4 1 5 vs 3 9 4 9 5), in both copies


def test_statement_holds_the_key_twice_and_filler_repeats_the_sentences():
    t, vocab = template()
    assert t.statement([7, 7]) == vocab.encode("The pass key is 7 7 . Remember it . 7 7 is the pass key .")
    sentence = vocab.encode(FILLER)
    assert list(passkey.repeat_filler(t)(len(sentence) * 2 + 3, None)) == sentence * 2 + sentence[:3]


def test_a_length_shorter_than_the_prompt_is_not_applicable():
    t, _ = template()
    fixed = t.fixed_length(5)  # 23 statement + 10 cue + 5 key
    assert fixed == 38
    passkey.build_prompt(t, [1] * 5, fixed - 1, 0.5, np.zeros(100, np.int64))  # no filler at all: fits
    with pytest.raises(passkey.PromptTooLong, match="shorter than the passkey prompt"):
        passkey.build_prompt(t, [1] * 5, fixed - 2, 0.5, np.zeros(100, np.int64))


def test_split_filler_takes_random_spans_of_the_split():
    tokens = np.arange(1000, 2000)
    fill = passkey.split_filler(tokens)
    a, b = fill(50, np.random.default_rng(0)), fill(50, np.random.default_rng(1))
    assert len(a) == 50 and (np.diff(a) == 1).all() and a[0] != b[0]


# ---- teacher-forced scoring with hand-made scorers ----


class CopyingScorer:
    """Attends perfectly: predicts the token that followed the earlier position whose preceding tokens match
    the current ones longest (an induction head with unbounded lookback). Log-probs: 0.9 on that token."""

    def __init__(self, vocab_size=64):
        self.V = vocab_size

    def check_positions(self, end):
        pass

    def predict(self, seq, t):
        best, best_len = None, 0
        for j in range(t):
            n = 0
            while n <= j and seq[j - n] == seq[t - n]:
                n += 1
            if n > best_len:
                best, best_len = seq[j + 1], n
        return best

    def last_logprobs(self, idx, n):
        out = torch.full((idx.shape[0], n, self.V), math.log(0.1 / (self.V - 1)))  # (B, n, V)
        for b, row in enumerate(idx.tolist()):
            for k, t in enumerate(range(len(row) - n, len(row))):
                guess = self.predict(row, t)
                if guess is not None:
                    out[b, k, guess] = math.log(0.9)
        return out


class GuessingScorer:
    """Ignores the context: the same distribution (digits likelier) at every position."""

    def __init__(self, vocab_size=64):
        self.logits = torch.randn(vocab_size, generator=torch.Generator().manual_seed(0))
        self.logits[:10] += 3

    def check_positions(self, end):
        pass

    def last_logprobs(self, idx, n):
        return self.logits.log_softmax(-1).expand(idx.shape[0], n, -1)


def subject_of(scorer, vocab=None, train_len=64, tokens=None):
    vocab = vocab or Vocab()
    return HandMadeSubject(scorer, tokens, dict(position="toy", train_len=train_len, seed=0), encoder=vocab.encode)


def passkey_cfg(**kw):
    return PasskeyConfig(**{**dict(multipliers=[1, 2, 4], depths=[0, 0.5, 1], trials=6), **kw})


def test_a_model_that_attends_perfectly_gets_accuracy_1():
    rows = passkey.probe(subject_of(CopyingScorer()), passkey_cfg(), "valid", tokens_per_batch=512)
    assert len(rows) == 9 and all(r["note"] == "" for r in rows)
    for r in rows:
        assert r["acc"] == 1 and r["exact"] == 1 and r["trials"] == 6
        assert r["logp"] == pytest.approx(math.log(0.9))
        assert r["acc_nokey"] < 0.5 and r["gain"] > 3  # without the key it can only guess
        assert r["acc_other"] < 0.5 and r["copy_gain"] > 3  # with another key it copies the wrong digits


def test_a_model_that_guesses_has_zero_gain():
    rows = passkey.probe(subject_of(GuessingScorer()), passkey_cfg(), "valid", tokens_per_batch=512)
    for r in rows:
        assert r["gain"] == pytest.approx(0, abs=1e-6) and r["acc"] == r["acc_nokey"] == r["acc_other"]
        assert r["logp"] == pytest.approx(r["logp_nokey"]) and r["copy_gain"] == pytest.approx(0, abs=1e-6)


class DigitPriorScorer(GuessingScorer):
    """Expects digits once any digit has appeared, without knowing which: not retrieval."""

    def last_logprobs(self, idx, n):
        seen = ((idx < 10).int().cumsum(1) > 0)[:, -n:, None]  # (B, n, 1): a digit so far; ids 0-9 are digits
        boost = torch.zeros_like(self.logits)
        boost[:10] = 4
        return torch.where(seen, (self.logits + boost).log_softmax(-1), self.logits.log_softmax(-1))  # (B, n, V)


def test_a_model_that_only_expects_digits_gains_over_no_key_but_not_over_another_key():
    rows = passkey.probe(subject_of(DigitPriorScorer()), passkey_cfg(), "valid", tokens_per_batch=512)
    for r in rows:
        assert r["gain"] > 0.05 and r["copy_gain"] == pytest.approx(0, abs=1e-6)  # the first key token only


def test_valid_filler_and_reruns_give_the_same_cells():
    tokens = np.random.default_rng(0).integers(10, 60, 5000)
    subject = subject_of(CopyingScorer(), tokens=tokens)
    cfg = passkey_cfg(filler="valid", multipliers=[1], depths=[0.3])
    a = passkey.probe(subject, cfg, "valid", 512)
    b = passkey.probe(subject, cfg, "valid", 100)  # another batch size: the same numbers
    assert a[0]["acc"] == b[0]["acc"] == 1 and a[0]["logp_nokey"] == b[0]["logp_nokey"]


def tiny_model(position="alibi", V=64, options=None, **overrides):
    return make(position, vocab_size=V, n_head=2, d_model=16, position_options=options or {}, **overrides)


@pytest.mark.parametrize("cutoffs", [None, [20, 40]])
def test_native_scorer_log_probs_are_the_models_softmax(cutoffs):
    model, idx = tiny_model(adaptive_cutoffs=cutoffs), torch.randint(0, 64, (3, 20))
    with torch.no_grad():
        got = NativeScorer(model).last_logprobs(idx, 4)
        full = model(idx).float().log_softmax(-1)[:, -4:]
        nll = model(idx[:, :-1], targets=idx[:, 1:])
    torch.testing.assert_close(got, full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(-full[:, :-1].gather(-1, idx[:, -3:, None])[..., 0], nll[:, -3:], atol=1e-5, rtol=1e-5)


def test_learned_past_its_table_is_not_applicable():
    subject = subject_of(NativeScorer(tiny_model("learned", options={"max_len": 100})))
    rows = passkey.probe(subject, passkey_cfg(trials=2), "valid", 512)
    by_len = {r["eval_len"]: r for r in rows}
    assert by_len[64]["note"] == "" and "acc" in by_len[64]
    assert by_len[128]["note"].startswith("not applicable") and "acc" not in by_len[128]


# ---- context use ----


def test_saturation_context_on_synthetic_curves():
    c = 2.0 ** np.arange(11)  # 1 .. 1024
    flat_from_64 = np.maximum(6 - 0.5 * np.log2(c), 3)  # stops improving at 64
    assert context_use.saturation_context(c, flat_from_64, eps=0.01) == 64
    noisy = flat_from_64 + np.where(c > 64, [0, 0, 0, 0, 0, 0, 0.004, -0.006, 0.003, -0.008, 0.002], 0)
    assert context_use.saturation_context(c, noisy, eps=0.01) == 64  # dips smaller than eps do not count
    assert context_use.saturation_context(c, noisy, eps=0.001) == 512  # the last dip below eps is at 512
    still_helping = 6 - 0.1 * np.log2(c)
    assert context_use.saturation_context(c, still_helping, eps=0.01) == 1024  # the last bin: helped until Lv
    assert context_use.saturation_context(c, still_helping, eps=0.25) == 256  # 3 doublings lower it 0.3 > eps
    worse_later = np.maximum(6 - np.log2(c), 2) + np.where(c > 128, 1.0, 0)  # flat from 16, breaks past 128
    assert context_use.saturation_context(c, worse_later, eps=0.01) == 16


def test_saturation_context_discounts_differences_within_the_noise():
    c = 2.0 ** np.arange(11)
    se = np.where(c <= 4, 0.12, 0.02)  # narrow early bins are noisy
    lucky = np.where(c == 2, 4.8, 5.0)  # flat, with one bin low by chance
    assert context_use.saturation_context(c, lucky, eps=0.01) == 2  # the plain rule takes the dip at face value
    assert context_use.saturation_context(c, lucky, eps=0.01, se=se, z=2) == 1  # 0.2 < 2 x 0.17: noise
    helping = 5 - 0.1 * np.log2(c)  # 0.1 nats per doubling, well above 2 x 0.028
    assert context_use.saturation_context(c, helping, eps=0.01, se=se, z=2) == 1024
    small_gain = np.where(c > 64, 4.97, 5.0)  # a 0.03 step past 64: within 2 standard errors of 0.028
    assert context_use.saturation_context(c, small_gain, eps=0.01) == 128
    assert context_use.saturation_context(c, small_gain, eps=0.01, se=se, z=2) == 1


def test_log_bins_cover_every_context_once():
    for lv, per_octave in [(1, 4), (7, 1), (64, 4), (1024, 4), (1000, 8)]:
        edges = context_use.log_bins(lv, per_octave)
        assert edges[0] == 1 and edges[-1] == lv + 1 and (np.diff(edges) > 0).all()
        assert len(edges) - 1 <= math.ceil(math.log2(lv + 1) * per_octave)
    assert list(context_use.log_bins(1024, 4)[:5]) == [1, 2, 3, 4, 5]


class ContextStub:
    """loss of the target at window position p = 10 / (p + 1): the curve is known exactly."""

    def check_positions(self, end):
        pass

    def loss(self, x, y):
        return (10.0 / torch.arange(1, y.shape[1] + 1, dtype=torch.float64))[None, :].expand(y.shape)


def test_context_sums_and_bins_with_a_known_curve():
    subject = subject_of(ContextStub(), train_len=8)
    tokens = np.arange(1000)
    total, total_sq, count = context_use.context_sums(subject, tokens, 64, 16, tokens_per_batch=256)
    n_windows = (999 - 64) // 16 + 1  # windows of 65 tokens starting every 16
    assert (count == n_windows).all() and len(count) == 64
    np.testing.assert_allclose(total / count, 10 / np.arange(1, 65))
    curve = context_use.binned_curve(total, total_sq, count, per_octave=2)
    assert curve["count"].sum() == 64 * n_windows and curve["context_lo"].iloc[0] == 1
    assert (curve["context_hi"].iloc[:-1].to_numpy() + 1 == curve["context_lo"].iloc[1:].to_numpy()).all()
    for r in curve.itertuples():
        c = np.arange(r.context_lo, r.context_hi + 1)
        assert r.loss == pytest.approx(np.mean(10 / c)) and r.context == pytest.approx(c.mean())


def test_context_sums_equal_the_models_own_window_losses():
    model = tiny_model("t5")
    subject = subject_of(NativeScorer(model), train_len=8)
    tokens = np.random.default_rng(1).integers(0, 64, 300)
    total, _, count = context_use.context_sums(subject, tokens, 32, 10, tokens_per_batch=100)
    t = torch.from_numpy(tokens)
    with torch.no_grad():
        direct = sum(model(t[None, s : s + 32], targets=t[None, s + 1 : s + 33])[0] for s in range(0, 300 - 32, 10))
    np.testing.assert_allclose(total, direct.double().numpy(), rtol=1e-5)
    assert count[0] == len(range(0, 300 - 32, 10))


def test_window_lengths_go_down_by_four_to_the_minimum():
    assert context_use.window_lengths(2048, 4) == [2048, 512, 128, 32]
    assert context_use.window_lengths(2048, 9) == [2048, 512, 128, 32]  # none under MIN_WINDOW = 16
    assert context_use.window_lengths(128, 4) == [128, 32] and context_use.window_lengths(10, 4) == [10]
    assert context_use.window_lengths(2048, 1) == [2048]


def test_short_contexts_get_the_targets_of_the_shorter_windows():
    subject = subject_of(ContextStub(), train_len=8)
    tokens = np.arange(1000)
    total, _, count = context_use.multi_resolution_sums(subject, tokens, 128, 3, None, tokens_per_batch=512)
    long, short = (999 - 128) // 32 + 1, (999 - 32) // 8 + 1  # windows of 128 every 32, of 32 every 8
    assert (count[:32] == short).all() and (count[32:] == long).all()  # contexts <= 32: the 32-windows' only
    np.testing.assert_allclose(total / count, 10 / np.arange(1, 129))  # the same curve, from more targets
    rows = context_use.probe(subject_of(ContextStub(), train_len=8, tokens=tokens), ContextConfig(multiplier=16),
                             "valid", 512)
    assert rows[0]["count"] == short and rows[0]["levels"] == 2
    # the plan says why the rows' levels are fewer than context.levels asked (none under MIN_WINDOW)
    line = context_use.plan(subject_of(ContextStub(), train_len=8, tokens=tokens), ContextConfig(multiplier=16),
                            "valid", 512)
    assert line.endswith("(context.levels=4 asks for 4; at Lv = 128 only 2 are 16 tokens or longer, the rows' levels)")


@pytest.mark.parametrize("stride", [None, 10, 32])
def test_every_distinct_target_and_context_pair_counts_once(stride):
    """The counts equal the distinct (target, context) pairs of all windows, enumerated by brute force: a long
    window's first W / 4 targets repeat the W / 4 window at the same start, so they are not counted again."""
    subject = subject_of(ContextStub(), train_len=8)
    n, eval_len = 1500, 512
    _, _, count = context_use.multi_resolution_sums(subject, np.arange(n), eval_len, 4, stride, tokens_per_batch=4096)
    pairs = set()
    for window in context_use.window_lengths(eval_len, 4):  # 512, 128, 32
        step = stride or window // 4
        for start in range(0, n - 1 - window + 1, step):
            pairs.update((start + p, p + 1) for p in range(window))  # (target index, its context)
    distinct = np.bincount([c for _, c in pairs], minlength=eval_len + 1)[1:]
    np.testing.assert_array_equal(count, distinct)


def test_context_probe_rows_and_summary():
    subject = subject_of(ContextStub(), train_len=8, tokens=np.arange(2000))
    cfg = ContextConfig(multiplier=16, levels=1)
    rows = context_use.probe(subject, cfg, "valid", 4096)
    df = pd.DataFrame(rows)
    assert (df["eval_len"] == 128).all() and (df["stride"] == 32).all() and df["context_hi"].max() == 128
    s = context_use.summary(df, 8, 0.01)  # z = 0: the plain rule, checked by brute force
    loss, ctx = df["loss"].to_numpy(), df["context"].to_numpy()
    first = next(i for i in range(len(loss)) if all(loss[j] >= loss[i] - 0.01 for j in range(i + 1, len(loss))))
    assert s["c_star"] == ctx[first] and 8 < s["c_star"] < 128  # 10/c keeps falling, by less than eps late
    at_8 = df[(df["context_lo"] <= 8) & (df["context_hi"] >= 8)].iloc[0]
    last = df.sort_values("context").iloc[-1]  # the longest contexts: a fixed bin, not the best of many
    assert s["loss_at_L"] == pytest.approx(at_8["loss"]) and s["loss_at_end"] == pytest.approx(last["loss"])
    assert s["gain_beyond_L"] == pytest.approx(at_8["loss"] - last["loss"])
    assert s["gain_beyond_L_se"] == pytest.approx(np.hypot(at_8["se"], last["se"]))


def test_a_split_shorter_than_a_window_is_one_line():
    subject = subject_of(ContextStub(), train_len=8, tokens=np.arange(100))
    with pytest.raises(UserError, match=r"fewer than a context-use window of Lv \+ 1 = 129; lower context.multiplier"):
        context_use.probe(subject, ContextConfig(multiplier=16), "valid", 4096)


# ---- the command line on toy run folders ----

def write_prompt_corpus(root: Path) -> Path:
    """conftest's toy WikiText-2 folder, its training split also holding the prompts' words and the digits."""
    write_corpus(root)
    prompt_words = " ".join([FILLER, KEY_TEXT.replace("{key}", "0 1 2 3 4 5 6 7 8 9"), CUE])
    with open(root / "wikitext-2" / "wiki.train.tokens", "a", encoding="utf-8") as f:
        f.write(f" {prompt_words} \n")
    return root


def make_run(root: Path, position="alibi", L=16, status="completed", name="exp", **options) -> Path:
    data_cfg = {"name": "wikitext2", "folder": "wikitext-2", "root": str(root), "raw": False,
                "cache_dir": str(root / "cache")}
    tok_cfg = {"name": "word", "vocab_size": None}
    vocab = prepare_data(data_cfg, tok_cfg).vocab_size
    model = tiny_model(position, V=vocab, options=options)
    run = root / "runs" / name / f"{position}-L{L}-seed0"
    run.mkdir(parents=True)
    cfg = {"name": name, "seed": 0, "train": {"seq_len": L}, "position": {"name": position, **options},
           "data": data_cfg, "tokenizer": tok_cfg}
    (run / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(cfg)))
    torch.save({"model": model.state_dict(), "model_config": asdict(model.cfg), "config": cfg, "step": 3},
               run / "checkpoint.pt")
    (run / "status.json").write_text(f'{{"status": "{status}"}}')
    return run


def probes_cli(*args, cwd):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return run_python(["-m", "alibi_lm.probes", *args], env, cwd, timeout=300)


FAST = ["passkey.trials=3", "passkey.multipliers=[1,4,8]", "passkey.depths=[0,1]", "context.multiplier=8",
        "tokens_per_batch=2048"]


@pytest.mark.slow
def test_sweep_probes_every_completed_run_and_skips_what_is_done(tmp_path):
    write_prompt_corpus(tmp_path)
    make_run(tmp_path, "alibi")
    make_run(tmp_path, "learned", max_len=64)
    make_run(tmp_path, "rope", status="running")
    common = [f"paths.runs={tmp_path}/runs", f"paths.results={tmp_path}/results", *FAST]
    out = probes_cli("sweep=exp", *common, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "rope-L16-seed0: not a completed run; skipped (probe it with run=" in out.stdout
    res = tmp_path / "results" / "exp"
    pk = pd.read_csv(res / "passkey.csv")
    assert len(pk) == 2 * 3 * 2 and set(pk["position"]) == {"alibi", "learned"}
    short = pk[pk["eval_len"] == 16]  # the prompt alone is 37 tokens: longer than Lv = 16
    assert short["acc"].isna().all() and short["note"].str.contains("shorter than the passkey prompt").all()
    assert pk.loc[(pk["position"] == "learned") & (pk["eval_len"] == 128), "note"].str.startswith("not applicable").all()
    scored = pk[pk["acc"].notna()]
    assert len(scored) == 6 and (scored["trials"] == 3).all() and scored["gain"].abs().lt(20).all()
    for col in ("command", "commit", "device", "wall_s", "run", "timestamp"):
        assert pk[col].notna().all(), col
    valid_sha = hashlib.sha256((tmp_path / "wikitext-2" / "wiki.valid.tokens").read_bytes()).hexdigest()[:16]
    assert set(pk["data_sha"]) == {valid_sha}  # the scored split's copy
    assert pk["command"].iloc[0].startswith("python -m alibi_lm.probes sweep=exp")
    assert pk["device"].str.match(r"cpu: .+, \d+ cores, \d+ threads$").all()  # the hardware, as provenance.cpu_description
    cu = pd.read_csv(res / "context_use.csv")
    assert set(cu["position"]) == {"alibi", "learned"}
    assert cu.groupby("position")["context_hi"].max().to_dict() == {"alibi": 128, "learned": 64}  # learned: its table
    assert set(cu["data_sha"]) == {valid_sha}
    report_md = (res / "probes.md").read_text()
    assert "## Passkey retrieval" in report_md and "## Context use" in report_md and "| alibi | 16 |" in report_md
    for png in ("passkey-alibi-L16.png", "passkey-learned-L16.png", "context_use.png", "context_use_vs_L.png"):
        assert (res / "probes" / png).stat().st_size > 0, png

    again = probes_cli("sweep=exp", *common, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("every cell is already in") == 2 and again.stdout.count("context use: already in") == 2
    pd.testing.assert_frame_equal(pd.read_csv(res / "passkey.csv"), pk)

    checkpoint = tmp_path / "runs" / "exp" / "alibi-L16-seed0" / "checkpoint.pt"  # alibi trained again: other weights
    state = torch.load(checkpoint, weights_only=True)
    state["model"]["blocks.0.attn.qkv.weight"][0, 0] += 0.5
    torch.save(state, checkpoint)
    third = probes_cli("sweep=exp", *common, cwd=tmp_path)
    assert third.returncode == 0, third.stderr[-3000:]
    assert third.stdout.count("every cell is already in") == 1 and third.stdout.count("context use: already in") == 1
    redone = pd.read_csv(res / "passkey.csv")
    assert len(redone) == len(pk) and redone.groupby("position")["weights"].nunique().to_dict() == {"alibi": 1, "learned": 1}
    assert set(redone.loc[redone["position"] == "alibi", "weights"]) != set(pk.loc[pk["position"] == "alibi", "weights"])


@pytest.mark.slow
def test_a_context_window_that_does_not_fit_is_refused_before_any_passkey_cell_runs(tmp_path):
    write_prompt_corpus(tmp_path)
    make_run(tmp_path, "alibi")
    common = [f"paths.runs={tmp_path}/runs", f"paths.results={tmp_path}/results", *FAST]
    out = probes_cli("sweep=exp", *common, "context.max_tokens=64", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.startswith("error: the valid split has 65 tokens, fewer than a "
                                                         "context-use window of Lv + 1 = 129"), out.stderr
    assert not (tmp_path / "results" / "exp" / "passkey.csv").exists() and "passkey Lv=" not in out.stdout


@pytest.mark.parametrize("overrides, message", [
    (["passkey.depths=[0,1.5]"], "passkey.depths must be numbers in [0, 1]"),
    (["passkey.trials=0"], "passkey.trials must be an integer >= 1"),
    (["passkey.multipliers=[]"], "no passkey lengths"),
    (["passkey.filler=random"], "passkey.filler must be one of repeat, valid"),
    (["probe=perplexity"], "probe must be one of passkey, context, all"),
    (["passkey.key_text=no_placeholder"], "passkey.key_text must contain {key}"),
    (["context.stride=0"], "context.stride must be an integer >= 1 or null"),
    (["context.eps=-1"], "context.eps must be a number >= 0"),
    (["run=a", "sweep=b"], "set run= or sweep=, not both"),
    (["hf.train_len=0"], "hf.train_len must be a positive integer"),
])
def test_composing_a_probes_config_is_its_check(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as error:
        compose_job("probes", *overrides)
    assert "\n" not in str(error.value)


def test_the_probes_job_composes_with_its_defaults():
    job = compose_job("probes", "run=hf:x", "data=wikitext2", "hf.train_len=64", "probe=passkey")
    assert (job.probe, job.data.name, job.hf.train_len, job.hf.experiment) == ("passkey", "wikitext2", 64, "hf")
    assert job.passkey == PasskeyConfig() and job.context == ContextConfig()
    assert compose_job("probes").data is None


@pytest.mark.slow
@pytest.mark.parametrize("override,message", [
    ("passkey.depths=[0,1.5]", "passkey.depths must be numbers in [0, 1]"),
    ("passkey.trials=0", "passkey.trials must be an integer >= 1"),
    ("probe=perplexity", "probe must be one of passkey, context, all"),
    ("passkey.key_text=no_placeholder", "passkey.key_text must contain {key}"),
    ("run=hf:/nowhere", "/nowhere does not exist"),
    ("sweep=nothing", "sweep=nothing: no run folder"),
])
def test_bad_input_is_one_line(tmp_path, override, message):
    out = probes_cli(override, f"paths.runs={tmp_path}/runs", f"paths.results={tmp_path}/results", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.startswith("error: ") and out.stderr.strip().count("\n") == 0, out.stderr
    assert message in out.stderr
    assert not (tmp_path / "results").exists()


def test_report_rebuilds_from_the_csvs(tmp_path):
    rows = [dict(position="alibi", train_len=64, seed=0, split="valid", filler="repeat", key_tokens=5, eval_len=lv,
                 depth=d, trials=10, acc=1.0 if lv == 64 else 0.2, gain=2.0 if lv == 64 else 0.0, note="",
                 settings="seed=0 texts=aaaa", weights="w1", data_sha="d1")
            for lv in (64, 128) for d in (0, 1)]
    report.replace_rows(tmp_path / report.PASSKEY_CSV, rows, report.PASSKEY_KEY)
    report.replace_rows(tmp_path / report.PASSKEY_CSV, rows[:1], report.PASSKEY_KEY)  # replaces, not adds
    assert len(pd.read_csv(tmp_path / report.PASSKEY_CSV)) == 4
    done = report.passkey_done(tmp_path / report.PASSKEY_CSV, "w1", "d1")
    cell = {k: rows[0].get(k, "") for k in [*report.PASSKEY_KEY, "settings"]}  # as passkey.probe builds a cell
    assert done(cell, 10)
    assert not report.passkey_done(tmp_path / report.PASSKEY_CSV, "w2", "d1")(cell, 10)  # other weights
    assert not report.passkey_done(tmp_path / report.PASSKEY_CSV, "w1", "d2")(cell, 10)  # another copy of the data
    assert not done(cell, 20)  # more trials asked: redo
    assert not done({**cell, "settings": "seed=1 texts=aaaa"}, 10)  # other keys or texts
    assert not done({**cell, "depth": 0.5}, 10)
    written = report.build(tmp_path)
    md = (tmp_path / "probes.md").read_text()
    assert "| alibi (L=64) | 1.00 | 0.20 |" in md and "| alibi (L=64) | +2.00 | +0.00 |" in md
    assert {p.name for p in written} == {"probes.md", "passkey-alibi-L64.png"}


def test_replace_rows_reads_old_csvs_and_refuses_damaged_ones(tmp_path):
    csv = tmp_path / report.PASSKEY_CSV
    # written before the seed column existed (a Hugging Face model: no seed): its rows read as seed "" and are
    # replaced by the same cells without a seed, not duplicated (kept rows first, new ones appended); a seeded
    # model's cell is another cell
    csv.write_text("position,train_len,split,filler,key_tokens,eval_len,depth,acc\n"
                   "hf:gpt2,1024,valid,repeat,5,2048,0.0,0.1\nhf:gpt2,1024,valid,repeat,5,2048,0.5,0.2\n")
    cell = dict(position="hf:gpt2", train_len=1024, seed=None, split="valid", filler="repeat", key_tokens=5,
                eval_len=2048, depth=0.0)
    report.replace_rows(csv, [dict(cell, acc=0.9), dict(cell, seed=0, depth=0.5, acc=0.8)], report.PASSKEY_KEY)
    df = pd.read_csv(csv)
    assert list(zip(df["seed"].fillna(-1), df["depth"], df["acc"])) == [(-1, 0.5, 0.2), (-1, 0.0, 0.9), (0, 0.5, 0.8)]
    csv.write_bytes(b"position,depth\n\xff\xfe\n")
    with pytest.raises(UserError, match="is not a readable table .*; fix or delete it and run the probes again$"):
        report.replace_rows(csv, [dict(cell, acc=0.9)], report.PASSKEY_KEY)


def test_report_never_averages_cells_of_different_settings(tmp_path):
    rows = [dict(position="alibi", train_len=64, seed=0, split=split, filler=filler, key_tokens=5, eval_len=64,
                 depth=0.0, trials=10, acc=acc, gain=0.0, note="", settings="seed=0 texts=aaaa")
            for split, filler, acc in (("valid", "repeat", 1.0), ("valid", "valid", 0.0), ("test", "repeat", 0.5))]
    report.replace_rows(tmp_path / report.PASSKEY_CSV, rows, report.PASSKEY_KEY)
    written = {p.name for p in report.build(tmp_path)}
    md = (tmp_path / "probes.md").read_text()
    for split, filler, acc in (("valid", "repeat", "1.00"), ("valid", "valid", "0.00"), ("test", "repeat", "0.50")):
        section = md.split(f"### Filler: {filler}, split: {split},")[1].split("###")[0]
        assert f"| alibi (L=64) | {acc} |" in section
        assert f"passkey-alibi-L64-{split}-{filler}-k5.png" in written
    assert "0.33" not in md and "0.50 |" in md  # no mean over the three settings


def test_context_report_has_a_split_column_and_survives_a_not_applicable_curve(tmp_path):
    curve = [dict(position="alibi", train_len=8, seed=0, split=split, eval_len=32, stride=8, levels=1, eps=0.01, z=2.0,
                  context_lo=lo, context_hi=lo, context=float(lo), loss=5.0 - 0.1 * i + (split == "test"), se=0.01,
                  count=100, note="") for split in ("valid", "test") for i, lo in enumerate((1, 8, 32))]
    report.replace_rows(tmp_path / report.CONTEXT_CSV, curve, report.MODEL_KEY)
    report.build(tmp_path)
    md = (tmp_path / "probes.md").read_text()
    assert "| scheme | L | seed | split | Lv |" in md
    assert "| alibi | 8 | 0 | test | 32 |" in md and "| alibi | 8 | 0 | valid | 32 |" in md
    na = tmp_path / "na"
    report.replace_rows(na / report.CONTEXT_CSV, [dict(position="hf:gpt2", train_len=1024, seed=None, split="valid",
                                                     note="not applicable: past the table")], report.MODEL_KEY)
    assert [p.name for p in report.build(na)] == ["probes.md"]  # no curve to draw, no KeyError
