"""Passkey retrieval (after Mohtashami & Jaggi 2023, "Landmark Attention", epfml/landmark-attention
llama/run_test.py), scored by teacher forcing.

A prompt of exactly Lv + 1 tokens (the model reads the first Lv, as in perplexity at Lv):

    [filler before | key statement | filler after | cue | key]
     "The grass is green . The sky is blue . ..."  (passkey.filler=repeat, the paper's filler sentences)
     or a random span of the evaluation split           (passkey.filler=valid)
    key statement: "The pass key is 3 9 1 4 7 . Remember it . 3 9 1 4 7 is the pass key ."
    cue:           "What is the pass key ? The pass key is"
    key:           3 9 1 4 7   (passkey.key_tokens random digits, one token each)

The depth d in [0, 1] puts round(d x filler length) filler tokens before the key statement (0: the key
statement opens the prompt, 1: it ends just before the cue). Each key token is scored given the true
tokens before it: accuracy = the argmax is the key token; logp = its log-probability (mean over the key's
tokens). The same prompt with the key statement replaced by more filler (same length, same cue, same key
targets) is the baseline: a model that only guesses digits scores the same with and without the key, so
its gain logp - logp_nokey is 0 and its accuracy equals acc_nokey.

A second control: the same prompt whose key statement holds another random key (the targets stay the true
key). A model that merely expects digits once digits have appeared gains over the no-key prompt but not
over this one; copy_gain = logp - logp_other is the part of the gain that needs the key itself.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np
import torch
from tqdm import tqdm

from ..costs import FirstBatchEstimate
from ..errors import UserError
from ..eval.extension import apply_method
from ..eval.scoring import eval_lengths
from ..subjects import NOT_APPLICABLE, Subject
from .config import KEY_PLACEHOLDER


class PromptTooLong(ValueError):
    """The key statement, cue and key alone are longer than Lv: the cell is not applicable."""


@dataclass
class Template:
    """The prompt's pieces as token ids."""

    statement_parts: list[list[int]]  # the key statement's text around each {key}
    cue: list[int]
    filler: list[int]  # one round of the filler sentences (filler=repeat)
    digits: list[int]  # the id of each digit 0-9

    def statement(self, key: list[int]) -> list[int]:
        out = list(self.statement_parts[0])
        for part in self.statement_parts[1:]:
            out += list(key) + list(part)
        return out

    def fixed_length(self, key_tokens: int) -> int:
        """Tokens of a prompt that are not filler."""
        return len(self.statement([0] * key_tokens)) + len(self.cue) + key_tokens

    def filler_length(self, eval_len: int, key_tokens: int, with_key: bool = True) -> int:
        """Filler tokens in a prompt of eval_len + 1 tokens (the no-key prompt has the statement's too)."""
        n = eval_len + 1 - self.fixed_length(key_tokens)
        if n < 0:
            raise PromptTooLong(f"Lv={eval_len} is shorter than the passkey prompt without filler "
                                f"({self.fixed_length(key_tokens) - 1} tokens); shorten passkey.key_text/cue_text")
        return n if with_key else n + len(self.statement([0] * key_tokens))


def make_template(encode, digits: list[int], key_text: str, cue_text: str, filler_text: str) -> Template:
    if KEY_PLACEHOLDER not in key_text:
        raise UserError(f"passkey.key_text must contain {KEY_PLACEHOLDER} where the key goes, got {key_text!r}")
    parts = [encode(p) if p.strip() else [] for p in key_text.split(KEY_PLACEHOLDER)]
    filler = encode(filler_text)
    if not filler:
        raise UserError("passkey.filler_text encodes to no tokens; give it some text")
    return Template(parts, encode(cue_text), filler, list(digits))


def repeat_filler(template: Template):
    """filler=repeat: the filler sentences over and over (the same for every trial)."""
    return lambda n, rng: np.resize(np.asarray(template.filler, dtype=np.int64), n)


def split_filler(tokens: np.ndarray):
    """filler=valid: a random span of the evaluation split, drawn per trial."""

    def filler(n: int, rng) -> np.ndarray:
        if n > len(tokens):
            raise UserError(f"the split has {len(tokens)} tokens, fewer than the {n} filler tokens asked for")
        start = int(rng.integers(0, len(tokens) - n + 1))
        return np.asarray(tokens[start : start + n], dtype=np.int64)

    return filler


def key_position(template: Template, key_tokens: int, eval_len: int, depth: float) -> int:
    """Where the key statement starts: after round(depth x filler length) filler tokens."""
    return int(round(depth * template.filler_length(eval_len, key_tokens)))


def build_prompt(template: Template, key: list[int], eval_len: int, depth: float, filler: np.ndarray,
                 with_key: bool = True, statement_key: list[int] | None = None) -> tuple[np.ndarray, int]:
    """(the prompt's ids (eval_len + 1,), the index where the key statement starts or would start).
    The targets are always `key`; the statement holds statement_key (default: key), or is left out
    (with_key=False). filler: at least template.filler_length(eval_len, len(key), with_key=False) tokens."""
    statement = template.statement(key if statement_key is None else statement_key)
    n_filler = template.filler_length(eval_len, len(key))
    before = key_position(template, len(key), eval_len, depth)
    if with_key:
        parts = [filler[:before], statement, filler[before:n_filler]]
    else:  # the key statement's place taken by the filler that follows: same length, same cue
        parts = [filler[: n_filler + len(statement)]]
    seq = np.concatenate([np.asarray(p, dtype=np.int64) for p in [*parts, template.cue, key]])
    assert len(seq) == eval_len + 1, (len(seq), eval_len)
    return seq, before


@torch.no_grad()
def score_keys(subject: Subject, seqs: np.ndarray, key_tokens: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Teacher-forced scores of the last key_tokens targets of each sequence (S, Lv + 1):
    (log-probabilities (S, K), argmax == target (S, K))."""
    logp, hit = [], []
    for b in range(0, len(seqs), batch):
        chunk = torch.from_numpy(seqs[b : b + batch]).to(subject.device)  # (B, Lv + 1)
        targets = chunk[:, -key_tokens:]  # (B, K)
        with subject.autocast():
            lp = subject.scorer.last_logprobs(chunk[:, :-1], key_tokens).float()  # (B, K, V)
        logp.append(lp.gather(-1, targets[..., None])[..., 0].cpu().numpy())
        hit.append((lp.argmax(-1) == targets).cpu().numpy())
    return np.concatenate(logp), np.concatenate(hit)


def _se(x: np.ndarray) -> float:
    return float(x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else float("nan")


def run_cell(subject: Subject, template: Template, filler_fn, eval_len: int, depth: float, trials: int,
             key_tokens: int, rng: np.random.Generator, batch: int) -> dict:
    """trials prompts with the key, the same without it and the same with another key, at one (Lv, depth):
    the cell's means."""
    prompts = {"key": [], "nokey": [], "other": []}
    n_filler = template.filler_length(eval_len, key_tokens, with_key=False)  # PromptTooLong when Lv is too short
    for _ in range(trials):
        key, other = ([template.digits[d] for d in row] for row in rng.integers(0, 10, (2, key_tokens)))
        filler = filler_fn(n_filler, rng)
        prompts["key"].append(build_prompt(template, key, eval_len, depth, filler)[0])
        prompts["nokey"].append(build_prompt(template, key, eval_len, depth, filler, with_key=False)[0])
        prompts["other"].append(build_prompt(template, key, eval_len, depth, filler, statement_key=other)[0])
    logp, hit = score_keys(subject, np.concatenate([np.stack(p) for p in prompts.values()]), key_tokens, batch)
    lp, lp0, lp1 = logp.reshape(3, trials, key_tokens).mean(-1)  # (trials,) each: mean over the key's tokens
    hit = hit.reshape(3, trials, key_tokens)
    acc, acc0, acc1 = hit.mean(-1)
    return dict(trials=trials, acc=acc.mean(), acc_se=_se(acc), acc_nokey=acc0.mean(), acc_other=acc1.mean(),
                exact=hit[0].all(-1).mean(), exact_nokey=hit[1].all(-1).mean(),
                logp=lp.mean(), logp_nokey=lp0.mean(), logp_other=lp1.mean(), gain=(lp - lp0).mean(),
                gain_se=_se(lp - lp0), copy_gain=(lp - lp1).mean(), copy_gain_se=_se(lp - lp1),
                key_at=key_position(template, key_tokens, eval_len, depth))


def settings(cfg) -> str:
    """What a cell's rows depend on beyond their key columns (passkey.seed, the three texts), as the rows record
    it: a cell made with other settings is not done (report.passkey_done)."""
    texts = hashlib.sha256("\n".join((cfg.filler_text, cfg.key_text, cfg.cue_text)).encode()).hexdigest()[:8]
    return f"seed={int(cfg.seed)} texts={texts}"


def check_fits(subject: Subject, cfg, split: str) -> None:
    """Before any forward: the template's texts encode, and with filler=valid the split holds the longest
    filler a prompt needs (a missing length is found here, not after the grid's other cells have run)."""
    template = make_template(subject.encode, subject.digit_ids(), cfg.key_text, cfg.cue_text, cfg.filler_text)
    if cfg.filler != "valid":
        return
    n_tokens, key_tokens = len(subject.tokens(split)), int(cfg.key_tokens)
    for lv in eval_lengths(subject.identity["train_len"], cfg.multipliers, cfg.lengths):
        try:
            need = template.filler_length(lv, key_tokens, with_key=False)
        except PromptTooLong:
            continue  # that length's cells are "not applicable", as the probe itself reports them
        if need > n_tokens:
            raise UserError(f"passkey at Lv={lv} needs {need} filler tokens but the {split} split has {n_tokens}; "
                            f"lower passkey.multipliers/lengths or use passkey.filler=repeat")


def grid(subject: Subject, cfg, split: str, done=None, method=None) -> dict[int, list[dict]]:
    """{Lv: the cells (Lv, depth) still to do}; done(cell, trials) -> bool leaves a finished cell out. Under an
    extension `method` (eval/extension.py) the cells carry its label in rope_scaling, as perplexity rows do."""
    common = dict(subject.identity, split=split, filler=cfg.filler, key_tokens=int(cfg.key_tokens), settings=settings(cfg),
                  rope_scaling="" if method is None else method.label())
    cells = {lv: [dict(common, eval_len=lv, depth=float(d)) for d in cfg.depths]
             for lv in eval_lengths(subject.identity["train_len"], cfg.multipliers, cfg.lengths)}
    return {lv: [c for c in row if not (done and done(c, int(cfg.trials)))] for lv, row in cells.items()}


def plan(subject: Subject, cfg, split: str, tokens_per_batch: int, done=None, method=None) -> str:
    """The line printed before the grid runs: prompts and forward passes per length still to do (the three
    prompts of a trial, with the key, without it and with another key, are batched together)."""
    trials, parts, total = int(cfg.trials), [], 0
    for lv, cells in grid(subject, cfg, split, done, method).items():
        forwards = len(cells) * math.ceil(3 * trials / max(1, tokens_per_batch // lv))
        total += forwards
        parts.append(f"Lv={lv}: {len(cells)} cells, {3 * trials * len(cells):,} prompts in {forwards:,} forward passes")
    return f"passkey plan: {'; '.join(parts)}; {total:,} forward passes in all (a line per length follows)"


def probe(subject: Subject, cfg, split: str, tokens_per_batch: int, done=None, on_rows=None, method=None) -> list[dict]:
    """The grid Lv x depth of cfg (the passkey config section). done(cell, trials) -> bool skips a finished cell;
    on_rows(rows) receives each length's rows as soon as they are scored. method: a training-free extension
    (eval/extension.chosen_method), set on the subject's scorer at each length (settings that follow Lv)."""
    template = make_template(subject.encode, subject.digit_ids(), cfg.key_text, cfg.cue_text, cfg.filler_text)
    filler_fn = repeat_filler(template) if cfg.filler == "repeat" else split_filler(subject.tokens(split))
    rows, trials, todo = [], int(cfg.trials), grid(subject, cfg, split, done, method)
    # the bar counts tokens through the model (3 prompts of Lv + 1 per trial), so its ETA holds across lengths
    bar = tqdm(total=sum(3 * trials * (lv + 1) * len(cells) for lv, cells in todo.items()), unit="tok", unit_scale=True,
               desc="passkey", dynamic_ncols=True, disable=not any(todo.values()))
    progress = FirstBatchEstimate(bar, "tokens through the model", " (at the first cell; longer prompts cost more)")
    for lv, cells in todo.items():
        length_rows = []
        if cells:
            apply_method(subject.scorer, method, lv)  # Self-Extend's group, a rescaling's factor: per Lv
        for cell in cells:
            t0, note = time.perf_counter(), ""
            # the same keys and filler for a cell whichever other cells run
            rng = np.random.default_rng([int(cfg.seed), lv, int(round(cell["depth"] * 1_000_000))])
            try:
                subject.scorer.check_positions(lv)
                stats = run_cell(subject, template, filler_fn, lv, cell["depth"], trials, int(cfg.key_tokens), rng,
                                 max(1, tokens_per_batch // lv))
            except (PromptTooLong, *NOT_APPLICABLE) as e:
                stats, note = dict(trials=trials), f"not applicable: {str(e).splitlines()[0][:160]}"
            note = "; ".join(filter(None, (subject.note, note)))  # a failed run scored on purpose says so
            length_rows.append(dict(cell, **stats, note=note, wall_s=round(time.perf_counter() - t0, 3),
                                    timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds")))
            progress.update(3 * trials * (lv + 1))
        if length_rows and on_rows:
            on_rows(length_rows)
        rows += length_rows
    bar.close()
    return rows
