"""WikiText splits -> tokenizer -> one token-id array per split, cached on disk and memory-mapped.

Lines become tokens plus one <eos> each, as in fairseq. A cache entry <cache_dir>/<data>-<tokenizer>-<hash>/ holds
tokenizer.json, {train,valid,test}.bin and meta.json; the hash covers the data content, the tokenizer settings and
FORMAT_VERSION. meta.json is written last, so an entry without it (a killed build) is treated as absent and rebuilt.
"""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import json
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from itertools import chain
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import torch
from omegaconf import OmegaConf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from .checkpoint import atomic_file, atomic_write_text
from .config import CONFIG_DIR, DataConfig, TokenizerConfig, check_fits, typed
from .errors import UserError
from .fairseq_format.dictionary import tokenizer_from_lines
from .special_tokens import EOS, UNK

FORMAT_VERSION = 1
SPLITS = ("train", "valid", "test")
HUB_SPLITS = {"train": "train", "valid": "validation", "test": "test"}
HF_OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
SNIFF_BYTES = 1 << 16  # the head of each split file checked before any work starts
CHUNK_LINES = 20_000  # lines per encode_batch call: bounds memory on WikiText-103's 1.8M lines
log = logging.getLogger(__name__)


def _check_split(split: str) -> str:
    if split not in SPLITS:
        raise UserError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
    return split


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _check_text(path: Path, data: bytes, whole: bool) -> None:
    """Empty, NUL bytes or not UTF-8 is a UserError; `data` is the file, or its head (whole=False), where a
    character cut at the end is fine."""
    if not data.strip() and (whole or path.stat().st_size <= SNIFF_BYTES):
        raise UserError(f"{path} is empty; replace it with the WikiText split")
    try:
        if b"\0" in data:
            raise ValueError("it contains NUL bytes")
        codecs.getincrementaldecoder("utf-8")().decode(data, final=whole)
    except (ValueError, UnicodeDecodeError) as e:  # UnicodeDecodeError says where the bad byte is
        raise UserError(f"{path} is not a UTF-8 text file ({e}); replace it with the WikiText split") from None


def _read_lines(path: Path) -> list[str]:
    data = path.read_bytes()
    _check_text(path, data, whole=True)
    lines = data.decode("utf-8").replace("\r\n", "\n").split("\n")
    return lines[:-1] if lines[-1] == "" else lines  # a final newline ends the last line, it opens none


def _split_files(folder: Path, raw: bool) -> dict[str, Path]:
    """split -> its file in a local copy; a missing, empty or binary file is a UserError."""
    ext, other = (".raw", ".tokens") if raw else (".tokens", ".raw")
    files = {}
    for split in SPLITS:
        path = folder / f"wiki.{split}{ext}"
        if not path.is_file():
            alt = path.with_suffix(other)
            hint = f" (found {alt.name}: set data.raw={str(not raw).lower()})" if alt.is_file() else ""
            raise UserError(f"missing split file {path}{hint}; put wiki.{{train,valid,test}}{ext} in {folder}")
        try:  # a cheap look at the head, before any work; _read_lines checks all of it later
            with open(path, "rb") as f:
                _check_text(path, f.read(SNIFF_BYTES), whole=False)
        except OSError as e:
            raise UserError(f"cannot read {path} ({e.strerror}); fix its permissions or set data.root=...") from None
        files[split] = path
    return files


def _hub_reachable(url: str, timeout: float) -> bool:
    """Can a TCP connection to the hub be opened? Runs in a thread, since a DNS lookup ignores socket timeouts."""
    parts = urlsplit(url)
    address = (parts.hostname or "", parts.port or (80 if parts.scheme == "http" else 443))
    reached = threading.Event()

    def connect():
        with contextlib.suppress(OSError):
            socket.create_connection(address, timeout=timeout).close()
            reached.set()

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(timeout)  # returns early when the connection is refused or made
    return reached.is_set()


def local_data_sets(cfg: DataConfig) -> list[str]:
    """The other data sets of configs/data/ whose local folder is under cfg's root (data.root, else $ALIBI_LM_DATA,
    else ./data, as cfg.local_folder resolves it: an imported fairseq run's config names no root)."""
    found, root = [], cfg.local_folder.parent
    for path in sorted(Path(CONFIG_DIR, "data").glob("*.yaml")):
        folder = OmegaConf.load(path).get("folder")
        if path.stem != cfg.name and folder and (root / str(folder)).is_dir():
            found.append(path.stem)
    return found


def _check_hub(cfg: DataConfig) -> tuple[str, str]:
    """No local copy: the hub must be configured and reachable (or `datasets` offline, reading its cache).
    Returns (what is missing, how to fix it), for the messages that follow."""
    where = f"no local copy of {cfg.name} ({cfg.local_folder} does not exist)"
    fix = f"set data.root=<folder that holds {cfg.folder}/> or ALIBI_LM_DATA=<that folder>"
    if others := local_data_sets(cfg):  # WikiText-2 alone beside the default WikiText-103
        fix += f", or use the data set {cfg.local_folder.parent} holds: {' or '.join(f'data={name}' for name in others)}"
    if not cfg.hub_path:
        raise UserError(f"{where} and data.hub_path is not set; {fix}")
    # Offline mode makes `datasets` read only its own cache, without network, so it cannot hang.
    offline = any(os.environ.get(v, "").strip().upper() in ("1", "ON", "YES", "TRUE") for v in HF_OFFLINE_VARS)
    if not offline:
        try:
            timeout = float(os.environ.get("ALIBI_LM_HUB_TIMEOUT", "2"))
        except ValueError:
            raise UserError("ALIBI_LM_HUB_TIMEOUT must be a number of seconds, e.g. ALIBI_LM_HUB_TIMEOUT=2") from None
        endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
        if not _hub_reachable(endpoint, timeout):
            raise UserError(f"{where} and the dataset hub ({endpoint}) is unreachable; {fix} "
                            f"(or HF_DATASETS_OFFLINE=1 to use a copy cached by `datasets` earlier)")
    return where, fix


def _sources(cfg: DataConfig) -> dict[str, tuple[Callable[[], str], Callable[[], list[str]]]]:
    """split -> (function returning its sha256, function returning its lines): local files are read only when asked."""
    if cfg.local_folder.is_dir():
        files = _split_files(cfg.local_folder, cfg.raw)
        return {split: (partial(sha256_file, path), partial(_read_lines, path)) for split, path in files.items()}
    where, fix = _check_hub(cfg)
    import datasets  # slow to import: only on this path

    try:
        dataset = datasets.load_dataset(cfg.hub_path, cfg.hub_config_name)
    except Exception as e:  # any failure of the hub or its cache is the user's to fix, not a bug here
        reason = (str(e).splitlines() or [""])[0]
        raise UserError(f"{where} and loading {cfg.hub_path} ({cfg.hub_config_name}) with `datasets` failed "
                        f"({type(e).__name__}: {reason}); {fix}") from None
    sources = {}
    for split, hub_split in HUB_SPLITS.items():
        lines = [line.removesuffix("\n") for line in dataset[hub_split][:]["text"]]  # one row is one line
        digest = hashlib.sha256()
        for line in lines:
            digest.update(line.encode("utf-8") + b"\n")
        sha = digest.hexdigest()
        sources[split] = (lambda sha=sha: sha, lambda lines=lines: lines)
    return sources


def check_data(data_cfg: DataConfig) -> None:
    """The checks that need no reading or tokenizing, run before any work: the local copy's split files (present,
    not empty, text), or, without one, a configured and reachable hub."""
    if data_cfg.local_folder.is_dir():
        _split_files(data_cfg.local_folder, data_cfg.raw)
    else:
        _check_hub(data_cfg)


def local_checksums(data_cfg: DataConfig) -> dict[str, str] | None:
    """split -> sha256 of its file in the local copy (the cache key's, checked like it), or None without one."""
    cfg = typed(DataConfig, data_cfg, "data")
    return {split: sha() for split, (sha, _) in _sources(cfg).items()} if cfg.local_folder.is_dir() else None


def split_checksum(data_cfg: DataConfig, split: str) -> str:
    """The sha256 of one split's text, as the cache key takes it (its file in a local copy, its lines from the
    hub): the data_sha of the rows of a model that brings its own tokenizer (run=hf:...)."""
    cfg, split = typed(DataConfig, data_cfg, "data"), _check_split(split)
    return _sources(cfg)[split][0]()


def split_lines(data_cfg: DataConfig, split: str) -> list[str]:
    """The text lines of one split (local copy or hub), for a model that brings its own tokenizer (run=hf:...).
    Reads only that split's file: no cache entry, no hashing of the training split."""
    cfg, split = typed(DataConfig, data_cfg, "data"), _check_split(split)
    return _sources(cfg)[split][1]()


def _with_eos(tokenizer: Tokenizer) -> Tokenizer:
    """Append <eos> to every encoded line, in the saved tokenizer too (so evaluation encodes the same way)."""
    tokenizer.add_special_tokens([EOS])
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}", special_tokens=[(EOS, tokenizer.token_to_id(EOS))]
    )
    return tokenizer


def _word_tokenizer(vocab: dict[str, int] | None = None) -> Tokenizer:
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tokenizer


def _batches(lines: list[str]) -> Iterator[list[str]]:
    return (lines[i : i + CHUNK_LINES] for i in range(0, len(lines), CHUNK_LINES))


def _encode(tokenizer: Tokenizer, lines: list[str]) -> Iterator[np.ndarray]:
    """Token ids of `lines` (with one <eos> each), one array per chunk of lines."""
    for batch in _batches(lines):
        yield np.fromiter(chain.from_iterable(e.ids for e in tokenizer.encode_batch(batch)), dtype=np.int64)


def _train_tokenizer(settings: dict, lines: list[str]) -> Tokenizer:
    name, vocab_size = settings["name"], settings["vocab_size"]
    if name == "fairseq":  # fairseq-preprocess's dictionary, for imported checkpoints
        return tokenizer_from_lines(lines)
    if name == "bpe":
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # lossless: decode(encode(s)) == s
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tokenizer.train_from_iterator(_batches(lines), trainer, length=len(lines))
        return _with_eos(tokenizer)
    # WordLevelTrainer puts the special tokens first (and, when the text holds "<unk>", leaves id 0 unused), while
    # the adaptive softmax needs ids in descending frequency. So the trainer only lists the types; every id is
    # then counted with the library's own pre-tokenizer (<eos> included), the vocabulary is cut to the most
    # frequent vocab_size (dropped words counting as <unk>) and renumbered by count.
    trainer = trainers.WordLevelTrainer(vocab_size=2**31, special_tokens=[UNK, EOS], show_progress=False)
    draft = _word_tokenizer()
    draft.train_from_iterator(_batches(lines), trainer, length=len(lines))
    words = sorted(draft.get_vocab(), key=draft.get_vocab().get)  # by count, then by word
    draft = _with_eos(_word_tokenizer({word: i for i, word in enumerate(words)}))
    counts = np.zeros(len(words), dtype=np.int64)
    for ids in _encode(draft, lines):
        counts += np.bincount(ids, minlength=len(counts))
    order = np.argsort(-counts, kind="stable")  # ties keep the trainer's order
    if vocab_size is not None:
        specials = [words.index(UNK), words.index(EOS)]
        dropped = order[~np.isin(order, specials)][vocab_size - len(specials) :]
        counts[specials[0]] += counts[dropped].sum()
        counts[dropped] = -1  # after every kept word
        order = np.argsort(-counts, kind="stable")[:vocab_size]
    return _with_eos(_word_tokenizer({words[i]: new for new, i in enumerate(order.tolist())}))


def load_tokenizer(path) -> Tokenizer:
    if not Path(path).is_file():
        raise UserError(f"tokenizer file {path} does not exist; point at the tokenizer.json of a run or cache entry")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - the tokenizers library raises a bare Exception for any damage
        raise UserError(f"tokenizer file {path} is damaged ({str(e).splitlines()[0][:120]}); delete it (a run's is "
                        f"written again from its data/tokenizer config by its next training) or restore it") from None


def write_tokens(path: Path, chunks: Iterable[np.ndarray], dtype) -> int:
    """Write the concatenated chunks of ids to `path` as `dtype` (which check_fits found wide enough for
    every id of the vocabulary); returns the number of tokens."""
    total = 0
    with atomic_file(path) as f:
        for ids in chunks:
            f.write(ids.astype(dtype).tobytes())
            total += ids.size
    return total


def _read_meta(entry: Path) -> dict | None:
    """meta.json of a complete entry, else None (no meta: a build that did not finish; wrong sizes: damage)."""
    try:
        meta = json.loads((entry / "meta.json").read_text())
        itemsize = np.dtype(meta["dtype"]).itemsize
        complete = all((entry / f"{s}.bin").stat().st_size == meta["num_tokens"][s] * itemsize for s in SPLITS)
    except (OSError, ValueError, KeyError):
        return None
    return meta if complete else None


class TokenData:
    """A complete cache entry: the tokenizer and a read-only memory map of each split."""

    def __init__(self, cache_dir: Path, meta: dict):
        self.cache_dir, self.meta = cache_dir, meta
        self.tokenizer = Tokenizer.from_file(str(cache_dir / "tokenizer.json"))
        self.vocab_size: int = meta["vocab_size"]
        self.eos_id: int = meta["eos_id"]
        self._splits: dict[str, np.memmap] = {}

    def split(self, name: str) -> np.memmap:
        if name not in self._splits:
            self._splits[name] = np.memmap(self.cache_dir / f"{_check_split(name)}.bin", dtype=self.meta["dtype"], mode="r")
        return self._splits[name]

    def save_tokenizer(self, path) -> None:
        with atomic_file(Path(path)) as f:  # bytes: the file is UTF-8 whatever the locale
            f.write((self.cache_dir / "tokenizer.json").read_bytes())


def prepare_data(data_cfg: DataConfig, tokenizer_cfg: TokenizerConfig) -> TokenData:
    """Load (or build, on first use) the tokenized splits of `data_cfg` under `tokenizer_cfg` (either may
    also be a dict or a DictConfig, e.g. a run's config.yaml)."""
    cfg, settings = typed(DataConfig, data_cfg, "data"), typed(TokenizerConfig, tokenizer_cfg, "tokenizer").settings
    sources = _sources(cfg)
    key_inputs = {"format": FORMAT_VERSION, "tokenizer": settings, "data": {s: sha() for s, (sha, _) in sources.items()}}
    digest = hashlib.sha256(json.dumps(key_inputs, sort_keys=True).encode()).hexdigest()[:16]
    entry = Path(cfg.cache_dir).expanduser().resolve() / f"{cfg.name}-{settings['name']}-{digest}"
    meta = _read_meta(entry)
    if meta is None:
        meta = _build(entry, sources, settings, key_inputs)
    return TokenData(entry, meta)


def _build(entry: Path, sources: dict, settings: dict, key_inputs: dict) -> dict:
    log.info("tokenizing into %s", entry)
    try:
        entry.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create cache folder {entry} ({e.strerror}); set paths.cache=<writable folder>") from e
    train_lines = sources["train"][1]()
    tokenizer = _train_tokenizer(settings, train_lines)
    vocab_size = tokenizer.get_vocab_size()
    # settings hold token_dtype only when it is not auto (TokenizerConfig.settings)
    dtype = np.dtype(settings.get("token_dtype") or (np.uint16 if vocab_size <= 65535 else np.uint32))
    check_fits(vocab_size, dtype)  # a word vocabulary's size is known only now
    atomic_write_text(entry / "tokenizer.json", tokenizer.to_str())
    num_tokens = {}
    # fairseq-eval-lm reads a split as [</s>] + its ids (the first block's input opens with </s>), so a
    # tokenizer=fairseq stream carries that </s>: its N - 1 targets are then fairseq's N, in fairseq's blocks
    opening = [np.array([tokenizer.token_to_id(EOS)], dtype=np.int64)] if settings["name"] == "fairseq" else []
    for split, (_, read_lines) in sources.items():
        lines = train_lines if split == "train" else read_lines()
        num_tokens[split] = write_tokens(entry / f"{split}.bin", chain(opening, _encode(tokenizer, lines)), dtype)
    meta = {**key_inputs, "vocab_size": vocab_size, "eos_id": tokenizer.token_to_id(EOS), "dtype": dtype.name,
            "num_tokens": num_tokens}
    atomic_write_text(entry / "meta.json", json.dumps(meta, indent=1))  # last: its presence marks the entry complete
    return meta


class WindowSampler:
    """Random order over the non-overlapping windows tokens[kL : kL+L+1] (fairseq's --sample-break-mode none).

    Each epoch is a fresh permutation drawn from (seed, epoch). Under DDP rank r takes permutation[r::world_size],
    cut to the same length on every rank so that all ranks cross epochs together (a few windows per epoch,
    different each epoch, go unused when the count is not a multiple of world_size).
    """

    def __init__(self, num_tokens: int, seq_len: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        self.num_tokens, self.seq_len, self.batch_size = int(num_tokens), int(seq_len), int(batch_size)
        self.seed, self.rank, self.world_size = int(seed), int(rank), int(world_size)
        self.num_windows = (self.num_tokens - 1) // self.seq_len
        self.windows_per_rank = self.num_windows // self.world_size
        if self.windows_per_rank < 1:
            raise UserError(f"the training split ({num_tokens} tokens) holds {self.num_windows} windows of "
                            f"train.seq_len={seq_len}, fewer than the {world_size} process(es); lower train.seq_len")
        self.epoch, self.cursor = 0, 0
        self._order = self._rank_order(0)

    def _rank_order(self, epoch: int) -> np.ndarray:
        permutation = np.random.default_rng((self.seed, epoch)).permutation(self.num_windows)
        return permutation[self.rank : self.windows_per_rank * self.world_size : self.world_size]

    def next_batch(self) -> np.ndarray:
        """Start offsets (batch_size,) of the next windows; an epoch's end continues into the next one."""
        parts, need = [], self.batch_size
        while need:
            if self.cursor == self.windows_per_rank:
                self.epoch, self.cursor = self.epoch + 1, 0
                self._order = self._rank_order(self.epoch)
            take = min(need, self.windows_per_rank - self.cursor)
            parts.append(self._order[self.cursor : self.cursor + take])
            self.cursor, need = self.cursor + take, need - take
        return np.concatenate(parts) * self.seq_len

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor, "num_tokens": self.num_tokens, "seq_len": self.seq_len,
                "batch_size": self.batch_size, "seed": self.seed, "rank": self.rank, "world_size": self.world_size}

    def load_state_dict(self, state: dict) -> None:
        # batch_size may change on resume: the cursor counts windows, not batches.
        for key in ("num_tokens", "seq_len", "world_size", "seed"):
            if state[key] != getattr(self, key):
                raise UserError(f"the sampler state has {key}={state[key]} but this run has {getattr(self, key)}; "
                                f"resume with the run's own data, seq_len, seed and process count, or start a new run")
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self._order = self._rank_order(self.epoch)


def get_batch(tokens: np.ndarray, starts: np.ndarray, seq_len: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs tokens[s : s+L] and targets tokens[s+1 : s+L+1] for each start s, as (B, L) int64 tensors."""
    windows = tokens[np.asarray(starts)[:, None] + np.arange(seq_len + 1)].astype(np.int64)  # (B, L+1)
    x, y = torch.from_numpy(windows[:, :-1].copy()), torch.from_numpy(windows[:, 1:].copy())
    device = torch.device(device)
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x, y
