"""The passkey prompt as a trained run's own tokenizer reads it: a byte-level BPE gets the ids of the whole
prompt as running text (no stray space tokens, digits as " 3"), the word-level tokenizer's ids stay those of
its vocabulary word by word, and a vocabulary without the ten digits is refused (the passkey probe only)."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest
import torch
from conftest import make
from omegaconf import OmegaConf

from alibi_lm.data import UNK, prepare_data
from alibi_lm.errors import UserError
from alibi_lm.probes import context_use
from alibi_lm.probes import passkey_probe as passkey
from alibi_lm.probes.config import KEY_PLACEHOLDER, ContextConfig, PasskeyConfig
from alibi_lm.subjects import open_native
from alibi_lm.subjects.base import DIGITS, digit_ids

TEXTS = PasskeyConfig()  # the default filler, key statement and cue
KEY = "3 9 1 4 7"


def statement_text(key: str) -> str:
    return TEXTS.key_text.replace(KEY_PLACEHOLDER, key)


def write_data(root, key_digits: str, lines: int = 150, rare: str = "") -> dict:
    """A WikiText-style folder whose training lines are passkey prompts with random keys of key_digits
    (each digit of `rare` once, on a last line); its data config."""
    rng = np.random.default_rng(0)

    def prompt():
        key = " ".join(rng.choice(list(key_digits), 5))
        return f" {TEXTS.filler_text} {statement_text(key)} {TEXTS.cue_text} {key} "

    folder = root / "wikitext-2"
    folder.mkdir(parents=True)
    train = [prompt() for _ in range(lines)] + ([f" {' '.join(rare)} "] if rare else [])
    for split, text in (("train", train), ("valid", [prompt() for _ in range(40)]), ("test", [prompt()])):
        (folder / f"wiki.{split}.tokens").write_text("\n".join(text) + "\n", encoding="utf-8")
    return {"name": "wikitext2", "folder": "wikitext-2", "root": str(root), "raw": False, "cache_dir": str(root / "cache")}


def open_run(root, data_cfg: dict, tok_cfg: dict, L: int = 16):
    """A run folder trained (untrained weights) on data_cfg with tok_cfg, opened as the probes open it."""
    model = make("alibi", vocab_size=prepare_data(data_cfg, tok_cfg).vocab_size)
    run = root / "runs" / "exp" / f"alibi-L{L}-seed0"
    run.mkdir(parents=True)
    cfg = {"name": "exp", "seed": 0, "train": {"seq_len": L}, "position": {"name": "alibi"}, "data": data_cfg,
           "tokenizer": tok_cfg}
    (run / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(cfg)))
    torch.save({"model": model.state_dict(), "model_config": asdict(model.cfg), "config": cfg, "step": 1},
               run / "checkpoint.pt")
    (run / "status.json").write_text('{"status": "completed"}')
    return open_native(run, root / "results", torch.device("cpu"))


def prompt_texts(depth: float, statement: str) -> list[str]:
    """The pieces of a prompt with two rounds of filler, in order (depth 0, 0.5 or 1: whole rounds)."""
    before = {0: 0, 0.5: 1, 1: 2}[depth]
    return [*[TEXTS.filler_text] * before, statement, *[TEXTS.filler_text] * (2 - before), TEXTS.cue_text, KEY]


def prompts(subject, digits: list[int]):
    """(depth, the prompt's ids, its statement's text) at depths 0, 0.5 and 1, with the true key and another."""
    t = passkey.make_template(subject.encode, digits, TEXTS.key_text, TEXTS.cue_text, TEXTS.filler_text)
    key, other = ([digits[int(d)] for d in k.split()] for k in (KEY, "0 2 6 5 9"))
    eval_len = t.fixed_length(5) - 1 + 2 * len(t.filler)  # two whole rounds of filler
    filler = passkey.repeat_filler(t)(t.filler_length(eval_len, 5, with_key=False), None)
    for depth in (0, 0.5, 1):
        yield depth, passkey.build_prompt(t, key, eval_len, depth, filler)[0].tolist(), statement_text(KEY)
        other_seq = passkey.build_prompt(t, key, eval_len, depth, filler, statement_key=other)[0].tolist()
        yield depth, other_seq, statement_text("0 2 6 5 9")


def test_a_bpe_run_reads_the_prompt_as_running_text(tmp_path):
    """tokenizer=bpe (byte-level, add_prefix_space=False): the prompt's ids are those of its whole text with
    a space before every word, as WikiText's lines have; the digits are " d" tokens, and "d" where " d" is
    not one token (8: never after a space in this training text)."""
    data_cfg, tok_cfg = write_data(tmp_path, "012345679"), {"name": "bpe", "vocab_size": 600}
    subject, tok = open_run(tmp_path, data_cfg, tok_cfg), prepare_data(data_cfg, tok_cfg).tokenizer
    assert tok.encode("The pass key is ", add_special_tokens=False).tokens[-2:] == ["Ġis", "Ġ"]  # a piece's edge
    assert tok.token_to_id("Ġ8") is None and tok.encode(" 8", add_special_tokens=False).tokens == ["Ġ", "8"]
    digits = subject.digit_ids()
    assert digits == [tok.token_to_id("8" if d == "8" else f"Ġ{d}") for d in DIGITS]
    for depth, seq, statement in prompts(subject, digits):
        text = " " + " ".join(prompt_texts(depth, statement))
        assert seq == tok.encode(text, add_special_tokens=False).ids, depth
        assert tok.decode(seq) == text and tok.token_to_id("Ġ") not in seq  # reads as written: no lone space


def test_the_word_level_prompt_is_its_words_ids(tmp_path):
    """tokenizer=word (the reproduction's): every piece and every prompt is the vocabulary's id of each
    whitespace word, as before the BPE fix, token for token."""
    data_cfg, tok_cfg = write_data(tmp_path, DIGITS), {"name": "word", "vocab_size": None}
    subject, tok = open_run(tmp_path, data_cfg, tok_cfg), prepare_data(data_cfg, tok_cfg).tokenizer
    vocab = tok.get_vocab()

    def words(text: str) -> list[int]:
        return [vocab[w] for w in text.split()]

    for piece in [*TEXTS.key_text.split(KEY_PLACEHOLDER), TEXTS.cue_text, TEXTS.filler_text, "3", " 3 "]:
        assert subject.encode(piece) == words(piece) == tok.encode(piece, add_special_tokens=False).ids, piece
    digits = subject.digit_ids()
    assert digits == words(" ".join(DIGITS)) and UNK in vocab and vocab[UNK] not in digits
    for depth, seq, statement in prompts(subject, digits):
        assert seq == words(" ".join(prompt_texts(depth, statement))), depth


def test_a_word_vocabulary_without_the_digits_is_refused_by_the_passkey_probe_only(tmp_path):
    """tokenizer.vocab_size cuts the rare words: digits 5-9 (once each) become <unk>, one id for all five."""
    data_cfg = write_data(tmp_path, "01234", rare="56789")
    types = {w for line in (tmp_path / "wikitext-2" / "wiki.train.tokens").read_text().splitlines() for w in line.split()}
    tok_cfg = {"name": "word", "vocab_size": len(types) - 5 + 2}  # every type but 5-9, and <unk>, <eos>
    subject, tok = open_run(tmp_path, data_cfg, tok_cfg), prepare_data(data_cfg, tok_cfg).tokenizer
    unk = tok.token_to_id(UNK)
    assert [tok.encode(d, add_special_tokens=False).ids for d in "0456789"] == [[tok.token_to_id(d)] for d in "04"] + [[unk]] * 5
    message = ("the digits 5 6 7 8 9 are not in the vocabulary (<unk>): the passkey probe needs ten distinct digit "
               "tokens, probe=context does not (a word vocabulary keeps the digits with a larger tokenizer.vocab_size, "
               "or null)")
    with pytest.raises(UserError) as error:
        passkey.probe(subject, PasskeyConfig(multipliers=[4], trials=2, depths=[0]), "valid", 4096)
    assert str(error.value) == message
    rows = context_use.probe(subject, ContextConfig(multiplier=2), "valid", 4096)  # needs no digits: runs
    assert rows[-1]["context_hi"] == 32 and all(np.isfinite(r["loss"]) for r in rows)


def test_digits_that_share_an_id_are_refused():
    with pytest.raises(UserError, match=r"^digit ids \[0, 1, 2, 5, 4, 5, 6, 7, 8, 9\] repeat: the passkey probe needs "
                                        r"ten distinct digit tokens"):
        digit_ids(lambda d: [5 if d == "3" else int(d)])
    assert digit_ids(lambda d: [int(d) + 10], unk_id=0) == list(range(10, 20))
