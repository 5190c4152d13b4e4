"""The data pipeline: loading, tokenizers, the token cache, the window sampler and batches."""

import json
import os
import socket
import time
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from conftest import REPO, compose_job

from alibi_lm import data as data_module
from alibi_lm.config import DataConfig
from alibi_lm.data import TokenData, WindowSampler, get_batch, load_tokenizer, prepare_data, write_tokens
from alibi_lm.errors import UserError

WORD = {"name": "word", "vocab_size": None}

# Word counts: the 5, cat 3, dog 1, end 1, plus 4 lines (one blank) -> 4 <eos>.
TRAIN = ["the cat the dog the", "", "cat the cat", " the end "]
VALID = ["the bird", "cat"]
TEST = ["dog"]
# Frequency order: the, <eos>, cat, dog, end (ties by word), then <unk> (never seen in training).
THE, EOS, CAT, DOG, END, UNK = range(6)


def write_corpus(root: Path, folder="toy", ext=".tokens", train=TRAIN, valid=VALID, test=TEST) -> Path:
    path = root / folder
    path.mkdir(parents=True, exist_ok=True)
    for split, lines in (("train", train), ("valid", valid), ("test", test)):
        (path / f"wiki.{split}{ext}").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def data_cfg(tmp_path: Path, **overrides) -> dict:
    cfg = {"name": "toy", "folder": "toy", "hub_path": "Salesforce/wikitext", "hub_config": "wikitext-2-v1",
           "raw": False, "root": str(tmp_path / "corpora"), "cache_dir": str(tmp_path / "cache")}
    return {**cfg, **overrides}


@pytest.fixture
def corpus(tmp_path):
    return write_corpus(tmp_path / "corpora")


@pytest.fixture
def train_calls(monkeypatch):
    """Counts tokenizer trainings, i.e. cache builds."""
    calls = []
    original = data_module._train_tokenizer

    def spy(settings, lines):
        calls.append(settings)
        return original(settings, lines)

    monkeypatch.setattr(data_module, "_train_tokenizer", spy)
    return calls


@pytest.fixture
def online(monkeypatch):
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_ENDPOINT", "ALIBI_LM_HUB_TIMEOUT"):
        monkeypatch.delenv(var, raising=False)


def error_of(call) -> str:
    with pytest.raises(UserError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    return message


def test_word_ids_are_frequency_ordered_with_one_eos_per_line(tmp_path, corpus):
    data = prepare_data(data_cfg(tmp_path), WORD)
    vocab = data.tokenizer.get_vocab()
    assert vocab == {"the": THE, "<eos>": EOS, "cat": CAT, "dog": DOG, "end": END, "<unk>": UNK}
    assert (data.vocab_size, data.eos_id) == (6, EOS)
    assert data.split("train").tolist() == [THE, CAT, THE, DOG, THE, EOS, EOS, CAT, THE, CAT, EOS, THE, END, EOS]
    assert data.split("valid").tolist() == [THE, UNK, EOS, CAT, EOS]
    assert data.split("test").tolist() == [DOG, EOS]
    assert isinstance(data.split("train"), np.memmap) and data.split("train").dtype == np.uint16
    assert data.tokenizer.decode([THE, CAT, UNK]) == "the cat <unk>"


def test_word_vocab_size_keeps_the_most_frequent_and_counts_the_rest_as_unk(tmp_path, corpus):
    data = prepare_data(data_cfg(tmp_path), {"name": "word", "vocab_size": 4})
    # dog and end are dropped: <unk> now occurs twice in training, less often than cat (3).
    assert data.tokenizer.get_vocab() == {"the": 0, "<eos>": 1, "cat": 2, "<unk>": 3}
    assert data.split("train").tolist() == [0, 2, 0, 3, 0, 1, 1, 2, 0, 2, 1, 0, 3, 1]


def test_word_vocab_with_literal_unk_in_text_has_no_gaps(tmp_path):
    # WordLevelTrainer alone leaves id 0 unused when the text holds "<unk>".
    write_corpus(tmp_path / "corpora", train=["<unk> <unk> <unk> <unk> a", "a a b"])
    data = prepare_data(data_cfg(tmp_path), WORD)
    assert data.tokenizer.get_vocab() == {"<unk>": 0, "a": 1, "<eos>": 2, "b": 3}


def test_bpe_round_trips_every_line(tmp_path):
    lines = [" = Café Zürich = ", "", " the naïve cat sat on the mat , 東京 — 3 @.@ 5 % ", " the  mat\tsat "] * 20
    write_corpus(tmp_path / "corpora", train=lines, valid=lines[:3], test=lines[:2])
    data = prepare_data(data_cfg(tmp_path), {"name": "bpe", "vocab_size": 300})
    assert data.vocab_size == 300
    train = data.split("train")
    ends = np.flatnonzero(train == data.eos_id)
    assert len(ends) == len(lines) and ends[-1] == len(train) - 1
    pieces = np.split(np.asarray(train), ends + 1)[:-1]
    assert [data.tokenizer.decode(piece.tolist()) for piece in pieces] == lines
    assert data.tokenizer.encode(lines[2]).ids == pieces[2].tolist()  # the saved tokenizer appends <eos> too


def test_cache_is_reused_and_invalidated_by_content_and_settings(tmp_path, corpus, train_calls):
    first = prepare_data(data_cfg(tmp_path), WORD)
    again = prepare_data(data_cfg(tmp_path), WORD)
    assert len(train_calls) == 1 and again.cache_dir == first.cache_dir
    assert sorted(p.name for p in first.cache_dir.iterdir()) == ["meta.json", "test.bin", "tokenizer.json",
                                                                 "train.bin", "valid.bin"]
    (corpus / "wiki.valid.tokens").write_text("dog dog\n")
    changed = prepare_data(data_cfg(tmp_path), WORD)
    assert len(train_calls) == 2 and changed.cache_dir != first.cache_dir
    assert changed.split("valid").tolist() == [DOG, DOG, EOS]
    smaller = prepare_data(data_cfg(tmp_path), {"name": "word", "vocab_size": 4})
    assert len(train_calls) == 3 and smaller.cache_dir not in (first.cache_dir, changed.cache_dir)


def test_incomplete_or_damaged_cache_entry_is_rebuilt(tmp_path, corpus, train_calls, monkeypatch):
    entry = prepare_data(data_cfg(tmp_path), WORD).cache_dir
    (entry / "meta.json").unlink()  # a build killed before its last write
    prepare_data(data_cfg(tmp_path), WORD)
    assert len(train_calls) == 2
    with open(entry / "train.bin", "r+b") as f:
        f.truncate(4)
    assert prepare_data(data_cfg(tmp_path), WORD).split("train").tolist()[:3] == [THE, CAT, THE]
    assert len(train_calls) == 3

    # A build that fails half-way leaves no meta.json and no temp files, and the next call builds it whole.
    original = data_module.write_tokens

    def fail_on_test(path, chunks, dtype):
        if path.name == "test.bin":
            raise KeyboardInterrupt
        return original(path, chunks, dtype)

    monkeypatch.setattr(data_module, "write_tokens", fail_on_test)
    (corpus / "wiki.test.tokens").write_text("end\n")
    with pytest.raises(KeyboardInterrupt):
        prepare_data(data_cfg(tmp_path), WORD)
    broken = [p for p in (tmp_path / "cache").iterdir() if not (p / "meta.json").exists()]
    assert len(broken) == 1 and not list(broken[0].glob(".*"))
    monkeypatch.setattr(data_module, "write_tokens", original)
    assert prepare_data(data_cfg(tmp_path), WORD).split("test").tolist() == [END, EOS]


def test_token_dtype_is_uint32_only_past_65535_types(tmp_path):
    words = [f"w{i}" for i in range(70_000)]
    write_corpus(tmp_path / "corpora", train=[" ".join(words[i : i + 1000]) for i in range(0, 70_000, 1000)])
    data = prepare_data(data_cfg(tmp_path), WORD)
    assert data.vocab_size == 70_002 and data.split("train").dtype == np.uint32
    assert data.split("train").max() == 70_000  # <unk> (never seen) is last
    assert json.loads((data.cache_dir / "meta.json").read_text())["dtype"] == "uint32"


def test_a_word_vocabulary_too_large_for_the_token_dtype_is_refused_before_tokens_are_written(tmp_path):
    words = [f"w{i}" for i in range(70_000)]  # its size is known only once the tokenizer is trained
    write_corpus(tmp_path / "corpora", train=[" ".join(words[i : i + 1000]) for i in range(0, 70_000, 1000)])
    message = error_of(lambda: prepare_data(data_cfg(tmp_path), {**WORD, "token_dtype": "uint16"}))
    assert "70,002 types does not fit tokenizer.token_dtype=uint16" in message
    assert not list((tmp_path / "cache").rglob("*.bin"))


def test_plain_dict_without_root_uses_env_relative_to_cwd(tmp_path, monkeypatch):
    write_corpus(tmp_path / "corpora")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ALIBI_LM_DATA", "corpora")
    cfg = {k: v for k, v in data_cfg(tmp_path).items() if k != "root"}
    assert prepare_data(cfg, WORD).split("test").tolist() == [DOG, EOS]


def test_project_configs_load_a_local_copy(tmp_path, monkeypatch):
    write_corpus(tmp_path / "corpora", folder="wikitext-2")
    monkeypatch.setenv("ALIBI_LM_DATA", str(tmp_path / "corpora"))
    job = compose_job("train", "data=wikitext2", f"paths.cache={tmp_path / 'cache'}")
    data = prepare_data(job.data, job.tokenizer)
    assert data.cache_dir.parent == tmp_path / "cache" and data.split("test").tolist() == [DOG, EOS]
    data.save_tokenizer(tmp_path / "tokenizer.json")
    assert load_tokenizer(tmp_path / "tokenizer.json").get_vocab() == data.tokenizer.get_vocab()
    assert "nope.json" in error_of(lambda: load_tokenizer(tmp_path / "nope.json"))


def test_missing_split_file_is_named_with_a_hint(tmp_path):
    folder = write_corpus(tmp_path / "corpora", ext=".raw")
    message = error_of(lambda: prepare_data(data_cfg(tmp_path), WORD))
    assert str(folder / "wiki.train.tokens") in message and "data.raw=true" in message
    (folder / "wiki.test.raw").unlink()
    message = error_of(lambda: prepare_data(data_cfg(tmp_path, raw=True), WORD))
    assert str(folder / "wiki.test.raw") in message


@pytest.mark.parametrize("content", [b"", b" \n \n", b"the cat\x00\x00\n", b"the \xff\xfe cat\n"],
                         ids=["empty", "blank", "nul-bytes", "not-utf8"])
def test_empty_or_binary_split_file_is_named(tmp_path, corpus, content):
    (corpus / "wiki.valid.tokens").write_bytes(content)
    assert str(corpus / "wiki.valid.tokens") in error_of(lambda: prepare_data(data_cfg(tmp_path), WORD))


def test_bad_tokenizer_settings(tmp_path, corpus):
    assert "tokenizer.name" in error_of(lambda: prepare_data(data_cfg(tmp_path), {"name": "sp", "vocab_size": 9}))
    assert "tokenizer.vocab_size" in error_of(lambda: prepare_data(data_cfg(tmp_path), {"name": "bpe"}))


@pytest.mark.parametrize("folder, hub_config, raw, expected", [
    ("wikitext-103", "wikitext-103-v1", False, "wikitext-103-v1"),
    ("wikitext-103", "wikitext-103-v1", True, "wikitext-103-raw-v1"),
    ("wikitext-2", "wikitext-2-v1", False, "wikitext-2-v1"),
    ("wikitext-2", "wikitext-2-raw-v1", False, "wikitext-2-v1"),
    ("wikitext-2", None, True, "wikitext-2-raw-v1"),
])
def test_hub_is_asked_for_the_right_config(tmp_path, monkeypatch, online, folder, hub_config, raw, expected):
    assert DataConfig("toy", folder, hub_config=hub_config, raw=raw).hub_config_name == expected
    calls = []

    def fake_load_dataset(path, name):
        calls.append((path, name))
        rows = {"train": TRAIN, "validation": VALID, "test": TEST}  # rows keep their "\n", blank ones are ""
        return {split: datasets.Dataset.from_dict({"text": [ln + "\n" if ln else "" for ln in lines]})
                for split, lines in rows.items()}

    monkeypatch.setattr(data_module, "_hub_reachable", lambda url, timeout: True)
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    data = prepare_data(data_cfg(tmp_path, folder=folder, hub_config=hub_config, raw=raw), WORD)
    assert calls == [("Salesforce/wikitext", expected)]
    assert data.split("train").tolist() == [THE, CAT, THE, DOG, THE, EOS, EOS, CAT, THE, CAT, EOS, THE, END, EOS]
    assert data.split("valid").tolist() == [THE, UNK, EOS, CAT, EOS]
    prepare_data(data_cfg(tmp_path, folder=folder, hub_config=hub_config, raw=raw), WORD)
    assert len(list((tmp_path / "cache").iterdir())) == 1  # same hub text: the cache entry is reused


def test_no_local_copy_and_no_hub_fails_fast(tmp_path, monkeypatch, online):
    probes = []
    monkeypatch.setattr(data_module, "_hub_reachable", lambda url, timeout: probes.append((url, timeout)) and False)
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("the hub was not reachable"))
    start = time.monotonic()
    message = error_of(lambda: prepare_data(data_cfg(tmp_path), WORD))
    assert time.monotonic() - start < 2
    assert str(tmp_path / "corpora" / "toy") in message and "unreachable" in message
    assert "data.root=" in message and "ALIBI_LM_DATA=" in message
    assert probes == [("https://huggingface.co", 2.0)]
    monkeypatch.setenv("ALIBI_LM_HUB_TIMEOUT", "0.5")
    error_of(lambda: prepare_data(data_cfg(tmp_path), WORD))
    assert probes[-1] == ("https://huggingface.co", 0.5)


def test_hub_probe_gives_up_quickly(monkeypatch):
    with socket.socket() as closed:  # bound but not listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        start = time.monotonic()
        assert not data_module._hub_reachable(f"http://127.0.0.1:{port}", timeout=5.0)
        assert time.monotonic() - start < 1  # a refusal ends the wait at once
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert data_module._hub_reachable(f"https://127.0.0.1:{server.getsockname()[1]}", timeout=1.0)
    # A DNS lookup that hangs (socket timeouts do not cover it) still ends the probe after `timeout`.
    def hanging_lookup(*args, **kwargs):
        time.sleep(30)
        raise OSError("name resolution timed out")  # what a hung lookup ends in (not a None to .close())

    monkeypatch.setattr(socket, "create_connection", hanging_lookup)
    start = time.monotonic()
    assert not data_module._hub_reachable("https://huggingface.co", timeout=0.2)
    assert time.monotonic() - start < 1


def test_offline_mode_uses_the_datasets_cache_without_probing(tmp_path, monkeypatch, online):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(data_module, "_hub_reachable", lambda url, timeout: pytest.fail("probed while offline"))

    def not_cached(path, name):
        raise ConnectionError(f"Couldn't reach '{path}' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", not_cached)
    message = error_of(lambda: prepare_data(data_cfg(tmp_path), WORD))
    assert "OfflineModeIsEnabled" in message and str(tmp_path / "corpora" / "toy") in message


def test_sampler_covers_every_window_once_per_epoch():
    num_tokens, seq_len = 1001, 10  # 100 windows of 11 tokens: starts 0, 10, ..., 990
    sampler = WindowSampler(num_tokens, seq_len, batch_size=7, seed=3)
    starts = np.concatenate([sampler.next_batch() for _ in range(30)])  # 210 windows: crosses two epochs
    epoch0, epoch1 = starts[:100], starts[100:200]
    assert sorted(epoch0) == sorted(epoch1) == list(range(0, 1000, 10))
    assert not np.array_equal(epoch0, epoch1)
    assert (sampler.epoch, sampler.cursor) == (2, 10)
    assert WindowSampler(1000, 10, 1, 0).num_windows == 99  # the last window needs its 11th token


def test_sampler_ranks_read_disjoint_windows():
    ranks = [WindowSampler(1011, 10, batch_size=5, seed=0, rank=r, world_size=2) for r in range(2)]  # 101 windows
    seen = [np.concatenate([s.next_batch() for _ in range(10)]) for s in ranks]  # 50 each: one epoch
    assert len(set(seen[0])) == len(set(seen[1])) == 50 and not set(seen[0]) & set(seen[1])
    assert all((s.epoch, s.cursor) == (0, 50) for s in ranks)


@pytest.mark.parametrize("stop_after", [3, 14, 15])  # mid-epoch, inside a batch that crosses epochs, at an epoch end
def test_sampler_resumes_exactly(stop_after):
    reference = WindowSampler(1001, 10, batch_size=7, seed=5)
    expected = [reference.next_batch() for _ in range(40)]
    interrupted = WindowSampler(1001, 10, batch_size=7, seed=5)
    for _ in range(stop_after):
        interrupted.next_batch()
    state = json.loads(json.dumps(interrupted.state_dict()))
    resumed = WindowSampler(1001, 10, batch_size=7, seed=5)
    resumed.load_state_dict(state)
    assert all(np.array_equal(resumed.next_batch(), want) for want in expected[stop_after:])


def test_sampler_refuses_a_state_from_another_setup():
    state = WindowSampler(1001, 10, batch_size=7, seed=5).state_dict()
    assert "seq_len" in error_of(lambda: WindowSampler(1001, 20, batch_size=7, seed=5).load_state_dict(state))
    assert "world_size" in error_of(lambda: WindowSampler(1001, 10, 7, 5, rank=0, world_size=2).load_state_dict(state))
    assert "train.seq_len" in error_of(lambda: WindowSampler(100, 128, batch_size=1, seed=0))


def test_get_batch_shifts_targets_by_one(tmp_path):
    write_tokens(tmp_path / "t.bin", [np.arange(100)], np.uint16)
    tokens = np.memmap(tmp_path / "t.bin", dtype=np.uint16, mode="r")
    x, y = get_batch(tokens, np.array([0, 30, 89]), 10, "cpu")
    assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (3, 10)
    assert x.tolist() == [list(range(s, s + 10)) for s in (0, 30, 89)]
    assert torch.equal(y, x + 1) and x.is_contiguous() and y.is_contiguous()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_get_batch_on_cuda():
    x, y = get_batch(np.arange(50, dtype=np.uint16), np.array([5]), 4, torch.device("cuda"))
    assert x.device.type == "cuda" and y.cpu().tolist() == [[6, 7, 8, 9]]


def wikitext2_folder() -> Path | None:
    for root in (os.environ.get("ALIBI_LM_DATA"), REPO.parent / "shared" / "data", "/work/shared/data"):
        if root and (Path(root) / "wikitext-2" / "wiki.train.tokens").is_file():
            return Path(root)
    return None


@pytest.mark.skipif(wikitext2_folder() is None, reason="real WikiText-2 not found ($ALIBI_LM_DATA/wikitext-2)")
def test_real_wikitext2_counts(tmp_path):
    cfg = {"name": "wikitext2", "folder": "wikitext-2", "raw": False, "root": str(wikitext2_folder()),
           "cache_dir": str(tmp_path / "cache")}
    data = prepare_data(cfg, WORD)
    assert isinstance(data, TokenData) and data.vocab_size == 33_278
    assert {s: len(data.split(s)) for s in ("train", "valid", "test")} == {
        "train": 2_088_628, "valid": 217_646, "test": 245_569}
    counts = np.bincount(data.split("train"), minlength=data.vocab_size)
    assert (np.diff(counts) <= 0).all() and counts[data.eos_id] == 36_718  # frequency order; one <eos> a line


def test_local_checksums_are_the_split_files_sha256(tmp_path):
    import hashlib

    from alibi_lm.config import DataConfig
    from alibi_lm.data import local_checksums

    folder = tmp_path / "wikitext-2"
    folder.mkdir()
    for split in ("train", "valid", "test"):
        (folder / f"wiki.{split}.tokens").write_text(f" = {split} = \n words of the {split} split \n")
    cfg = DataConfig("wikitext2", "wikitext-2", root=str(tmp_path))
    expected = {s: hashlib.sha256((folder / f"wiki.{s}.tokens").read_bytes()).hexdigest() for s in ("train", "valid", "test")}
    assert local_checksums(cfg) == expected
    assert local_checksums(DataConfig("wikitext2", "nowhere", root=str(tmp_path))) is None  # no local copy


def test_a_missing_data_set_names_the_one_data_root_holds(tmp_path):
    """make train (WikiText-103) on a machine with only WikiText-2 under ALIBI_LM_DATA: the line names data=wikitext2."""
    (tmp_path / "wikitext-2").mkdir()
    cfg = DataConfig("wikitext103", "wikitext-103", hub_path=None, root=str(tmp_path))
    with pytest.raises(UserError, match=rf"no local copy of wikitext103 .* or use the data set {tmp_path} holds: "
                                        r"data=wikitext2$"):
        prepare_data(cfg, {"name": "word", "vocab_size": None})
    # a config without a root (an imported fairseq run's): the root the data would be read from, $ALIBI_LM_DATA
    with pytest.MonkeyPatch.context() as env:
        env.setenv("ALIBI_LM_DATA", str(tmp_path))
        with pytest.raises(UserError, match=rf"or use the data set {tmp_path} holds: data=wikitext2$"):
            prepare_data(DataConfig("wikitext103", "wikitext-103", hub_path=None, root=None),
                         {"name": "word", "vocab_size": None})
    (tmp_path / "wikitext-2").rmdir()
    with pytest.raises(UserError) as refused:
        prepare_data(cfg, {"name": "word", "vocab_size": None})
    assert "data=" not in str(refused.value)
