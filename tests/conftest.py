"""Shared test helpers: small models and token batches, composed configs, a WikiText-style corpus, and the
test position scheme (example_scheme.py), registered here so that every generic test runs it too."""

from __future__ import annotations

import io
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import example_scheme  # noqa: F401 - registers position=example before the test modules are collected
import numpy as np
import pytest
import torch

from alibi_lm.attention import FLEX_CPU_MIN_HEAD_DIM
from alibi_lm.config import compose, to_job
from alibi_lm.model import LMConfig, TransformerLM
from alibi_lm.results.__main__ import main as results_main
from alibi_lm.subjects import Subject

# One torch thread per test process, fixed: two pytest-xdist workers share the 2 cores, and Trainers left to
# choose by the free cores of the moment (config.default_threads) would train a run with 1 thread and its twin
# with 2, whose sums, and so whose weights' last bits, differ. Tests of that choice unset it (monkeypatch.delenv).
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

REPO = Path(__file__).resolve().parents[1]
TEST_CONFIGS = Path(__file__).resolve().parent / "configs"  # configs/position/example.yaml
SEARCHPATH = f"hydra.searchpath=[file://{TEST_CONFIGS}]"
V = 97  # vocabulary of the small test models
ATOL = 1e-5
# torch.compile on CPU (inductor) calls a C++ compiler: $CXX, else g++ (clang++ on macOS). Without one the
# compiled tests are skipped; with one, any failure of theirs is a failure.
needs_cxx = pytest.mark.skipif(shutil.which(os.environ.get("CXX", "clang++" if sys.platform == "darwin" else "g++")) is None,
                               reason="torch.compile on CPU needs the C++ compiler inductor calls ($CXX, else g++ or clang++)")


# The files whose tests take longest, longest first; the rest follow in their usual order. `make test` runs
# pytest-xdist with --dist loadfile --no-loadscope-reorder, which hands out whole files in collection order: a
# long file handed out last would run alone at the end while the other worker idles.
LONG_FILES = ("test_bench.py", "test_committed_results.py", "test_committed_task_results.py", "test_reliability.py",
              "test_integrity.py", "test_fairseq_import.py", "test_faults.py", "test_hf.py", "test_faults_cluster.py",
              "test_first_hour_trials.py", "test_train_real.py", "test_probes.py", "test_tasks.py")


def pytest_collection_modifyitems(items):
    missing = [name for name in LONG_FILES if not (REPO / "tests" / name).is_file()]
    assert not missing, f"conftest.LONG_FILES names files that are gone: {missing}"
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FILES)))  # stable: in-file order is kept


# learned: a table long enough for every test; fire: L_thr below the tests' lengths, so that its
# normaliser psi(max(i, L_thr)) depends on i here (below L_thr FIRE is a relative bias)
TEST_OPTIONS = {"learned": {"max_len": 2048}, "fire": {"init_threshold": 8.0}}


def spread_fox_gates(fox) -> None:
    """Heads from forgetful (f ~ 1/2, the authors' init) to retentive (f ~ 0.98, near x-transformers' init): with
    N(0, 1) weights w . x would spread by ~6 over d = 32 and a token 10 back weigh e^-23, too little for any test."""
    fox.gate_weight.normal_(0.0, 0.1)
    fox.gate_bias.uniform_(0.0, 4.0)


# make()'s initialisation of a scheme's parameters where N(0, 1) does not suit the tests
TEST_INIT = {"fox": spread_fox_gates}


@dataclass
class HandMadeSubject(Subject):
    """A Subject around a hand-made scorer (a perfect copier, a context-blind guesser) and a token stream: what
    the evaluation and the probes read of a model, without a run folder or a Hugging Face model."""

    scorer: object
    stream: np.ndarray | None = None  # (N,) every split's ids
    identity: dict = field(default_factory=lambda: dict(position="toy", train_len=64, seed=0))
    provenance: dict = field(default_factory=dict)
    out_dir: Path = Path(".")
    device: torch.device = torch.device("cpu")
    dtype: torch.dtype | None = None  # float32, as a CPU subject computes
    completed: bool = True
    encoder: Callable[[str], list[int]] | None = None
    digits: list[int] = field(default_factory=lambda: list(range(10)))
    words: int | None = None  # word_count of every split

    def encode(self, text: str) -> list[int]:
        return self.encoder(text)

    def tokens(self, split: str) -> np.ndarray:
        return np.asarray(self.stream)

    def split_sha(self, split: str) -> str:
        return "0123456789abcdef"

    def digit_ids(self) -> list[int]:
        return list(self.digits)

    def word_count(self, split: str) -> int | None:
        return self.words


# make()'s 4 heads FLEX_CPU_MIN_HEAD_DIM wide (d_model 128, not 32): model.attention=flex on the CPU refuses narrower
# heads, which torch's compiled CPU kernel computes wrong on some CPUs. Every test that runs FlexAttention on the CPU
# passes it (to both sides of a comparison), so that its assertions test the project's flex path, not that kernel.
FLEX_CPU_HEADS = dict(d_model=4 * FLEX_CPU_MIN_HEAD_DIM)


def make(position: str, seed: int = 0, **overrides) -> TransformerLM:
    """A 2-layer, 4-head, d=32 model in eval mode; a learned table of 2048 rows; T5's and the example's
    learned biases (and every scheme's parameters) spread so that a wrong bucket or distance shows in the logits."""
    options = overrides.pop("position_options", TEST_OPTIONS.get(position, {}))
    cfg = dict(n_layer=2, n_head=4, d_model=32, vocab_size=V, position=position, position_options=options)
    cfg.update(overrides)
    torch.manual_seed(seed)
    model = TransformerLM(LMConfig(**cfg)).eval()
    with torch.no_grad():
        for p in model.position.parameters() if position not in ("learned", *TEST_INIT) else ():
            p.normal_(0.0, 1.0)
        if position in TEST_INIT:
            TEST_INIT[position](model.position)
    return model


def tokens(B: int, T: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


def shift_invariant(name: str) -> bool:
    """Whether a scheme declares that it sees relative positions only (test_model checks the declaration)."""
    from alibi_lm.positions import POSITION_SCHEMES

    return POSITION_SCHEMES[name].shift_invariant


def compose_config(app: str = "train", *overrides: str):
    """The composed config (with its hydra node) of `python -m alibi_lm.<app> *overrides`, the test
    configs on the search path."""
    return compose(app, [*overrides, SEARCHPATH])


def compose_job(app: str = "train", *overrides: str):
    """The typed job of `python -m alibi_lm.<app> *overrides`."""
    return to_job(compose_config(app, *overrides))


def write_corpus(root: Path, n_train=400, n_eval=60, seed=0) -> Path:
    """<root>/wikitext-2/wiki.{train,valid,test}.tokens: a few hundred lines of words from a small vocabulary."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(300)]
    weights = [1 / (i + 1) for i in range(len(words))]  # Zipf-like, as text is

    def lines(n):
        return "".join(" ".join(rng.choices(words, weights, k=rng.randint(3, 20))) + " \n" if i % 9 else " \n"
                       for i in range(n))

    folder = root / "wikitext-2"
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("valid", n_eval), ("test", n_eval)):
        (folder / f"wiki.{split}.tokens").write_text(lines(n), encoding="utf-8")
    return root


def write_run(tmp_path: Path, model: TransformerLM, L: int = 16, seed: int = 0, name: str = "exp", **options) -> Path:
    """A run folder of `model` as train.py writes it: config.yaml (resolved) and checkpoint.pt."""
    from dataclasses import asdict

    from omegaconf import OmegaConf

    position = model.cfg.position
    run = tmp_path / "runs" / name / f"{position}-L{L}-seed{seed}"
    run.mkdir(parents=True)
    cfg = {"name": name, "seed": seed, "train": {"seq_len": L}, "position": {"name": position, **options},
           "data": {"name": "fake"}, "tokenizer": {"name": "word"}}
    (run / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(cfg)))
    torch.save({"model": model.state_dict(), "model_config": asdict(model.cfg), "config": cfg, "step": 7},
               run / "checkpoint.pt")
    return run


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    """A workspace per test module: a WikiText-style corpus under data/, and room for runs/, results/, cache/."""
    root = tmp_path_factory.mktemp("ws")
    write_corpus(root / "data")
    return root


def git(*args, cwd) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def repository_copy(root: Path, untracked: bool = False) -> Path:
    """This checkout's files committed in a new repository at root: the tracked ones, and with `untracked` the new
    ones git does not ignore too (a fresh clone of the working tree)."""
    listing = ["ls-files", "-z", *(["-co", "--exclude-standard"] if untracked else [])]
    for name in git(*listing, cwd=REPO).split("\0"):
        if name and (REPO / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, root / name)
    git("init", "-q", cwd=root)
    git("add", "-A", cwd=root)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "copy", cwd=root)
    return root


@pytest.fixture(scope="module")
def fresh_copy(tmp_path_factory) -> Path:
    """The repository's tracked files as they are in this checkout, committed in a new repository."""
    return repository_copy(tmp_path_factory.mktemp("fresh") / "repo", untracked=False)


def assert_command_changes_no_committed_file(copy: Path, args: list[str], status: int):
    """`python <args>` run in `copy` (a repository_copy, without ALIBI_LM_* settings) exits with `status` and leaves
    git status clean: the committed tables and plots are what the documented command makes of them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALIBI_LM_")}
    out = subprocess.run([sys.executable, *args], cwd=copy, env=dict(env, PYTHONPATH=str(copy)),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == status, out.stderr[-3000:]
    assert git("status", "--porcelain", cwd=copy) == "", git("status", "--porcelain", cwd=copy)


def run_results_app(*args, stdin: str = "") -> subprocess.CompletedProcess:
    """`python -m alibi_lm.results *args` run in this process (its main(argv)), on its own stdin, stdout and stderr,
    without the settings that turn one-line errors into tracebacks: the exit status and output of the command line,
    without a fresh interpreter's imports (3 s a call; the app is argparse and tables: no Hydra, no signal handlers).
    test_hand_edited_tables runs the real command line as well, for what only a process shows."""
    out, err = io.StringIO(), io.StringIO()
    quiet = {k: v for k, v in os.environ.items() if k not in ("ALIBI_LM_DEBUG", "HYDRA_FULL_ERROR")}
    with mock.patch.dict(os.environ, quiet, clear=True), mock.patch.object(sys, "stdin", io.StringIO(stdin)), \
            redirect_stdout(out), redirect_stderr(err):
        try:
            results_main([str(a) for a in args])
            status = 0
        except SystemExit as e:  # argparse's and one_line_errors' exits, and --check's status
            status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return subprocess.CompletedProcess(["alibi_lm.results", *map(str, args)], status, out.getvalue(), err.getvalue())


def fake_run_data(monkeypatch, vocab: int, n_tokens: int, seed: int = 5):
    """A run's data replaced by n_tokens random ids below vocab (every split), with a cache entry's checksums: the
    subjects' prepare_data returns it, so runs written by write_run evaluate without a corpus."""
    from alibi_lm.subjects import native  # the module whose prepare_data a run folder's subject calls

    tokens = np.random.default_rng(seed).integers(0, vocab, n_tokens)
    data = SimpleNamespace(split=lambda name: tokens, vocab_size=vocab, tokenizer=None,
                           meta={"data": {"valid": "0123456789abcdef" * 4}})
    monkeypatch.setattr(native, "prepare_data", lambda data_cfg, tokenizer_cfg: data)
    return data
