"""Any Hugging Face causal LM under the project's protocols: run=hf:<folder written by save_pretrained>.

    python -m alibi_lm.eval run=hf:path/to/model data=wikitext2 eval.lengths=[512,1024,2048]
    python -m alibi_lm.probes run=hf:path/to/model data=wikitext2 hf.train_len=1024

The folder holds a `transformers` AutoModelForCausalLM and its tokenizer. The text is the WikiText split's
lines, detokenized (WikiText's " @-@ ", " , ", " ( " spacing undone, `<unk>` kept as text; data.raw=true
reads the raw files as they are), stripped and joined with "\\n", then tokenized once with the model's
tokenizer without special tokens. That one token stream goes through scoring.py exactly as a trained
run's does (nonoverlapping, sliding, per-position loss). Perplexity counts the model's own tokens:
`ppl` = exp(total loss / `tokens`), `tokens` = its N - 1 targets. `word_ppl` spreads the same total loss
over WikiText's word-level count instead (whitespace words + one <eos> per line, minus the first token,
which is never a target), the count the word-level runs use, so models with different tokenizers compare.

L, the training length, is hf.train_len or the first of LENGTH_FIELDS that the model's config has. A model
whose config names none (BLOOM: ALiBi, no length in its config) is evaluated at eval.lengths alone; its rows
then have no L (multipliers x L and the ratios to L are left out); the probes need L.

`transformers` is an optional extra (pip install -e '.[hf]'); without it run=hf: stops with one line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..config import DataConfig, autocast_dtype
from ..data import check_data, split_checksum, split_lines
from ..errors import UserError
from ..extension import RESCALINGS, method_of
from ..extension.hf import install_bloom, install_llama
from ..positions import PositionRangeError, rescaling_refusal
from ..provenance import device_name, git_commit, model_digest, weights_digest
from .base import Subject, digit_ids

PREFIX = "hf:"
REQUIREMENT = "transformers==5.23.0"
# Config fields that name a model's training context, in the order they are tried.
LENGTH_FIELDS = ("max_position_embeddings", "n_positions", "seq_length", "max_sequence_length")
# The nn.Embedding modules that hold a learned absolute position table in transformers' causal LMs (GPT-2
# and GPT-Neo: wpe; OPT, BioGPT, MBart: embed_positions), and the config fields of the positions it covers
# (GPT-2's n_positions; OPT's table has 2 more rows, an offset that no position reaches). A table not named
# here is found only on CPU, by the IndexError of the forward.
LEARNED_TABLES = ("wpe", "embed_positions")
TABLE_FIELDS = ("n_positions", "max_position_embeddings")
# WikiText's tokenized text -> plain text, in order.
_DETOKENIZE = [
    (re.compile(r" @(.)@ "), r"\1"),  # 1 @,@ 000 -> 1,000; well @-@ known -> well-known; 0 @.@ 7 -> 0.7
    (re.compile(r" ([.,;:!?%)\]}])"), r"\1"),  # no space before closing punctuation
    (re.compile(r"([(\[{$]) "), r"\1"),  # nor after opening brackets
    (re.compile(r" (n't|'s|'re|'ve|'m|'ll|'d)\b"), r"\1"),  # clitics: it 's -> it's
]


def is_hf(run) -> bool:
    return isinstance(run, str) and run.startswith(PREFIX)


def folder_of(run: str) -> Path:
    return Path(run[len(PREFIX) :]).expanduser()


def require_transformers():
    try:
        import transformers
    except ImportError:
        raise UserError(f"run=hf:... needs the optional package transformers: pip install -e '.[hf]' "
                        f"(or pip install {REQUIREMENT})") from None
    return transformers


def detokenize(line: str) -> str:
    """One line of WikiText's tokenized text as plain text."""
    line = line.strip()
    for pattern, repl in _DETOKENIZE:
        line = pattern.sub(repl, line)
    return line


def word_count(lines: list[str]) -> int:
    """WikiText's word-level token count of these lines: whitespace words plus one <eos> per line."""
    return sum(len(line.split()) + 1 for line in lines)


PICKLED_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")  # torch.save / pickle files: loading can run code


def check_weights(folder: Path) -> None:
    """Weights are read from *.safetensors only: a folder whose weights are pickled (pytorch_model.bin) and that
    has no safetensors is refused in one line saying how to convert it, and nothing of it is unpickled."""
    if any(folder.glob("*.safetensors")):
        return
    if pickled := sorted(p.name for pattern in PICKLED_WEIGHTS for p in folder.glob(pattern)):
        raise UserError(f"{folder} holds its weights pickled ({pickled[0]}), and unpickling can run code: convert them "
                        f"to safetensors where you trust their source, e.g. python -c \"from transformers import "
                        f"AutoModelForCausalLM as M; M.from_pretrained('{folder}').save_pretrained('{folder}-st')\" "
                        f"(save_pretrained writes safetensors), then pass run=hf:{folder}-st")


# what a Hugging Face model has instead: transformers applies a Llama-family config.json's rope_scaling itself
HF_OWN_SCALING = "a Hugging Face model: for a Llama-family one, set rope_scaling in its config.json"


def check(job, needs_train_len: bool = True) -> None:
    """Preflight of run=hf:<folder> (job: an EvalJob or a ProbesJob): transformers installed, a model
    folder whose config names L (or hf.train_len; unless needs_train_len is false), data to score, no RoPE
    extension (ours only)."""
    transformers, folder = require_transformers(), folder_of(job.run)
    if not (folder / "config.json").is_file():
        what = "does not exist" if not folder.exists() else "has no config.json"
        raise UserError(f"run={job.run}: {folder} {what}; pass run=hf:<a folder written by save_pretrained>")
    if job.data is None:
        raise UserError(f"run={job.run} needs the text to score: add data=wikitext2 (or data=wikitext103)")
    scaling = getattr(getattr(job, "position", None), "scaling", None)
    extension = getattr(job, "extension", None)
    if scaling is None and extension is not None and method_of(extension) in RESCALINGS:
        scaling = method_of(extension)
    if scaling is not None:
        raise UserError(rescaling_refusal(scaling, f"run={job.run} ({HF_OWN_SCALING})"))
    check_data(job.data)  # the data source only: the model brings its own tokenizer
    check_weights(folder)
    try:
        config = transformers.AutoConfig.from_pretrained(folder, trust_remote_code=job.hf.trust_remote_code)
    except (OSError, ValueError, KeyError) as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        code = "; its config asks to run code from the folder: add hf.trust_remote_code=true only if you trust it" \
            if "trust_remote_code" in str(e) else ""
        raise UserError(f"run={job.run}: {folder}/config.json is not a model config ({reason}){code}") from None
    if needs_train_len:
        train_len(config, job.hf.train_len)  # L is known (multipliers x L, the probes need it)
    results_dir(job)  # its results name is not another folder's


def name_of(folder: Path) -> str:
    """The model's name in results tables (the position column): hf:<folder name>."""
    return f"{PREFIX}{folder.expanduser().resolve().name}"


def results_dir(job) -> Path:
    """paths.results/<hf.experiment>/ for run=hf:<folder> (job: an EvalJob or a ProbesJob). Its tables key
    rows by the name (hf:<folder name>), not by the folder, so a second folder of the same name would
    replace the first's rows or, with skip_done, be skipped as done: refused. A stored run written relative
    to another working directory resolves here, so it may be refused though it is the same folder."""
    import pandas as pd  # import cost: the evaluate app's --help and one-line errors never read a table

    folder, out_dir = folder_of(job.run).resolve(), job.results_root() / job.hf.experiment
    name = name_of(folder)
    for csv in sorted(out_dir.glob("*.csv")):  # extrapolation.csv, passkey.csv, context_use.csv
        try:
            df = pd.read_csv(csv, usecols=["position", "run"], dtype=str)
        except (OSError, ValueError):  # not a results table, or damaged: its own reader says so
            continue
        for run in df.loc[df["position"] == name, "run"].dropna().unique():
            other = folder_of(run).resolve() if is_hf(run) else run
            if other != folder:
                raise UserError(f"{csv} already holds {name} from {other}, not {folder}: two models named "
                                f"{folder.name} cannot share {out_dir}; set hf.experiment={job.hf.experiment}-"
                                f"{folder.parent.name or 'other'} (another results folder) or rename one of the folders")
    return out_dir


class HFScorer:
    """An AutoModelForCausalLM seen by scoring.py and the probes: per-token loss, log-probs of the last targets."""

    def __init__(self, model):
        self.model = model
        self.max_positions = learned_table(model)  # None: no learned table (RoPE, ALiBi), any length

    def check_positions(self, end: int) -> None:
        # Before the forward: past a learned table, nn.Embedding raises IndexError on CPU but fails a
        # device-side assert on CUDA, which is not catchable and leaves the CUDA context unusable.
        if self.max_positions is not None and end > self.max_positions:
            raise PositionRangeError(f"position {end - 1} is beyond the model's learned position table of "
                                     f"{self.max_positions} positions")

    def loss(self, idx, targets):
        logits = self.model(input_ids=idx, use_cache=False).logits  # (B, T, V)
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none").view_as(targets)

    __call__ = loss  # how scoring.score_stream calls a model: model(idx, targets=...)

    def set_scaling(self, method, factor, train_len) -> None:
        """Inference-time RoPE extension: ours applies to runs trained with position=rope only."""
        if method is not None:
            raise ValueError(rescaling_refusal(method, HF_OWN_SCALING))

    def set_extension(self, method) -> None:
        """A training-free extension (alibi_lm.extension) on a Llama-family (RoPE) or BLOOM (ALiBi) model."""
        kind = self.model.config.model_type
        if kind == "bloom":
            install_bloom(self.model, method)
        elif hasattr(self.model, "model") and hasattr(self.model.model, "rotary_emb"):
            install_llama(self.model, method)
        else:
            raise UserError(f"extension= applies to Llama-family (RoPE) and BLOOM (ALiBi) models, not model_type "
                            f"{kind}; drop extension")

    def last_logprobs(self, idx, n: int):
        logits = self.model(input_ids=idx, use_cache=False, logits_to_keep=n).logits  # (B, n, V)
        return logits.float().log_softmax(-1)


def learned_table(model) -> int | None:
    """The positions a model's learned absolute position table covers (LEARNED_TABLES), else None."""
    tables = [m for name, m in model.named_modules()
              if name.rsplit(".", 1)[-1] in LEARNED_TABLES and isinstance(m, torch.nn.Embedding)]
    sizes = [getattr(model.config, f) for f in TABLE_FIELDS if isinstance(getattr(model.config, f, None), int)]
    if not tables or not sizes:  # e.g. RoPE (Llama), ALiBi (BLOOM), a sinusoidal module (XGLM): any length
        return None
    return min(sizes[0], tables[0].num_embeddings)


@dataclass
class HFModel:
    scorer: HFScorer
    tokenizer: object
    position: str  # the name in results tables: hf:<folder name>
    train_len: int | None  # None: its config names none, and no hf.train_len


def train_len(config, override, required: bool = True) -> int | None:
    """L of a Hugging Face model: hf.train_len, else the first length field its config has, else None when
    not required."""
    if override is not None:  # checked by HFConfig
        return int(override)
    for field in LENGTH_FIELDS:
        value = getattr(config, field, None)
        if isinstance(value, int) and value > 0:
            return value
    if not required:
        return None
    raise UserError(f"the model's config names no training length ({', '.join(LENGTH_FIELDS)}); "
                    f"set hf.train_len=<the length it was trained at>")


def load(run: str, device, train_len_override=None, trust_remote_code: bool = False) -> HFModel:
    """The model and tokenizer of a save_pretrained folder. Code shipped in the folder runs only with
    trust_remote_code (hf.trust_remote_code=true); weights come from its safetensors files only (check_weights)."""
    transformers = require_transformers()
    transformers.utils.logging.disable_progress_bar()  # no "Loading weights" bar between the rows
    folder = folder_of(run)
    check_weights(folder)  # safetensors only: no pickle is ever read
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, use_safetensors=True,
                                                                  trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise UserError(f"cannot load a causal LM and its tokenizer from {folder} ({reason}); "
                        f"save both there with save_pretrained") from None
    tokenizer.model_max_length = 1 << 62  # the split is tokenized whole; windows are cut by the protocols
    return HFModel(HFScorer(model.to(device).eval()), tokenizer, name_of(folder),
                   train_len(model.config, train_len_override, required=False))


def token_stream(tokenizer, data_cfg: DataConfig, split: str) -> tuple[np.ndarray, int]:
    """(the split as the model's token ids (N,), its WikiText word-level token count)."""
    lines = split_lines(data_cfg, split)
    text = "\n".join(line.strip() if data_cfg.raw else detokenize(line) for line in lines)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return np.asarray(ids, dtype=np.int64), word_count(lines)


def encoder(tokenizer):
    """text in WikiText's tokenized form -> the model's ids (detokenized first, as the data is). A piece
    of a prompt follows other text, so it gets a leading space unless it opens with punctuation."""

    def encode(text: str) -> list[int]:
        text = detokenize(text)
        text = text if text[:1] in tuple(".,;:!?)]}%'") else " " + text
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    return encode


class HFSubject(Subject):
    """run=hf:<folder> (job: an EvalJob or a ProbesJob): a Hugging Face causal LM on the text of job.data."""

    def __init__(self, job, device: torch.device):
        self.out_dir = results_dir(job)  # before the model loads: its name may be taken
        model = load(job.run, device, job.hf.train_len, job.hf.trust_remote_code)
        self.scorer, self.tokenizer, self.data_cfg, self.device = model.scorer, model.tokenizer, job.data, device
        self.dtype = autocast_dtype(device, job.precision)
        self._encode, self._digits, self.completed = encoder(model.tokenizer), None, True
        self._streams: dict[str, tuple[np.ndarray, int]] = {}  # split -> (ids (N,), word count), tokenized once
        self.identity = dict(position=model.position, train_len=model.train_len, seed=None)
        self.provenance = dict(run=str(job.run), step=None, weights=weights_digest(model.scorer.model),
                               model=model_digest(model.scorer.model.config.to_dict()), data=job.data.name,
                               commit=git_commit(), device=device_name(device, self.dtype))

    def _stream(self, split: str) -> tuple[np.ndarray, int]:
        if split not in self._streams:
            self._streams[split] = token_stream(self.tokenizer, self.data_cfg, split)
        return self._streams[split]

    def encode(self, text: str) -> list[int]:
        return self._encode(text)

    def tokens(self, split: str) -> np.ndarray:
        return self._stream(split)[0]

    def word_count(self, split: str) -> int:
        return self._stream(split)[1]

    def split_sha(self, split: str) -> str:
        return split_checksum(self.data_cfg, split)[:16]

    def digit_ids(self) -> list[int]:
        if self._digits is None:
            self._digits = digit_ids(self.encode, self._lookup, self.tokenizer.unk_token_id)
        return list(self._digits)

    def _lookup(self, token: str) -> int | None:
        found = self.tokenizer.convert_tokens_to_ids(token)
        return None if found is None or found == self.tokenizer.unk_token_id else found


def open_hf(job, device: torch.device) -> HFSubject:
    """run=hf:<folder> as a Subject."""
    return HFSubject(job, device)
