"""Every kind of trial a new user runs, on a fresh copy of the repository, leaves `git status` clean: its results go
beside its runs under runs/ (git-ignored), never next to the committed experiments in results/."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, git, repository_copy

pytestmark = pytest.mark.slow

FAIRSEQ = REPO.parent / "shared" / "fixtures" / "fairseq-alibi"
TINY = ["data=wikitext2", "train.max_tokens=null", "train.max_steps=2", "train.batch_size=2", "train.eval_every=2",
        "train.checkpoint_every=2", "train.eval_tokens=256", "train.evaluate_after=true", "eval.max_tokens=512",
        "eval.multipliers=[1,2]", "logger.wandb.mode=disabled", "train.progress=false"]
PYTHON_API = """
import os
from pathlib import Path

from alibi_lm.config import DataConfig, EvalConfig, LoggerConfig, PathsConfig, TrainConfig, TrainJob, WandbConfig
from alibi_lm.eval.evaluation import evaluate_run
from alibi_lm.model import LMConfig
from alibi_lm.training.trainer import Trainer

job = TrainJob(
    data=DataConfig(name="wikitext2", folder="wikitext-2", root=os.environ["ALIBI_LM_DATA"], cache_dir=os.environ["CACHE"]),
    model=LMConfig(position="alibi", n_layer=2, n_head=4, d_model=64),
    train=TrainConfig(seq_len=32, batch_size=4, max_steps=2, eval_every=2, checkpoint_every=2, eval_tokens=256,
                      progress=False),
    logger=LoggerConfig(wandb=WandbConfig(mode="disabled")),
)
run_dir = Path(job.paths.runs, job.name, "alibi-L32-seed0")
Trainer(job, run_dir).run()
evaluate_run(run_dir, EvalConfig(multipliers=[1, 2], max_tokens=512), results_root=job.paths.results, progress=False)
"""


def wikitext2_root() -> Path | None:
    for root in (os.environ.get("ALIBI_LM_DATA"), REPO.parent / "shared" / "data"):
        if root and (Path(root) / "wikitext-2" / "wiki.train.tokens").is_file():
            return Path(root)
    return None


needs_wikitext2 = pytest.mark.skipif(wikitext2_root() is None, reason="real WikiText-2 not found ($ALIBI_LM_DATA)")



@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """The working tree's files (tracked, and new ones git does not ignore) committed in a new repository."""
    return repository_copy(tmp_path_factory.mktemp("fresh") / "repo", untracked=True)


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict:
    cache = tmp_path_factory.mktemp("cache")  # WikiText-2 tokenized once for every trial
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("ALIBI_LM_", "WANDB_"))}
    return dict(keep, ALIBI_LM_DATA=str(wikitext2_root()), CACHE=str(cache), OMP_NUM_THREADS="1")


def run(clone: Path, env: dict, *args: str) -> str:
    done = subprocess.run([sys.executable, *args], cwd=clone, env=dict(env, PYTHONPATH=str(clone)),
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


def tiny_gpt2(folder: Path) -> Path:
    """A 2-layer GPT-2 with a byte-level BPE tokenizer, saved as a Hugging Face model folder."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    text = (wikitext2_root() / "wikitext-2" / "wiki.train.tokens").read_text().splitlines()[:2000]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=tok.get_vocab_size(), n_embd=32, n_layer=2, n_head=4, n_positions=64)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(folder)
    return folder


TRIALS = {  # name -> (arguments after python, the folder under the clone its results land in)
    "custom quick settings": (["-m", "alibi_lm.train", "experiment=quick", *TINY], "runs/quick-custom-*/results/*"),
    "a Hydra multirun": (["-m", "alibi_lm.train", "-m", "position=alibi,nope", *TINY], "runs/default/results/default"),
    "a task trial": (["-m", "alibi_lm.train", "experiment=tasks", "task=copy", "position=alibi", "train.max_steps=2",
                      "train.eval_every=2", "train.checkpoint_every=2", "eval.examples=8", "eval.multipliers=[1,2]",
                      "train.progress=false"], "runs/tasks-custom-*/results/*"),
    "the Python API": (["-c", PYTHON_API], "runs/default/results/default"),
}


@needs_wikitext2
@pytest.mark.parametrize("trial", TRIALS)
def test_a_trial_leaves_git_status_clean(clone, env, trial):
    args, results = TRIALS[trial]
    cache = [] if args[0] == "-c" else [f"paths.cache={env['CACHE']}"]
    run(clone, env, *args, *cache)
    assert list(clone.glob(f"{results}/*.csv")), f"{trial}: no results under {results}"
    assert git("status", "--porcelain", cwd=clone) == ""


@needs_wikitext2
@pytest.mark.skipif(not FAIRSEQ.is_dir(), reason=f"the fairseq fixtures are not at {FAIRSEQ}")
def test_a_fairseq_import_and_its_evaluation_leave_git_status_clean(clone, env):
    run(clone, env, "-m", "alibi_lm.fairseq_import", str(FAIRSEQ / "alibi-h4" / "checkpoint.pt"), "--dict",
        str(FAIRSEQ / "dict.txt"), "--data", "wikitext2", "--cache", env["CACHE"], "--force")
    run(clone, env, "-m", "alibi_lm.eval", "run=runs/fairseq/alibi-L32-seed1", "eval.max_tokens=512",
        "eval.multipliers=[1,2]", f"paths.cache={env['CACHE']}")
    assert (clone / "runs" / "fairseq" / "results" / "fairseq" / "extrapolation.csv").is_file()
    assert git("status", "--porcelain", cwd=clone) == ""


@needs_wikitext2
def test_a_hugging_face_evaluation_leaves_git_status_clean(clone, env, tmp_path):
    pytest.importorskip("transformers")
    model = tiny_gpt2(tmp_path / "gpt2")
    out = run(clone, env, "-m", "alibi_lm.eval", f"run=hf:{model}", "data=wikitext2", "eval.lengths=[16,32]",
              "eval.multipliers=[]", "eval.max_tokens=512", f"paths.cache={env['CACHE']}")
    assert (clone / "runs" / "hf" / "results" / "hf" / "extrapolation.csv").is_file()
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["eval_len"])
    column = lines[header].split().index("tokens")
    assert all("." not in line.split()[column] for line in lines[header + 1 : header + 3])  # counts as integers
    assert git("status", "--porcelain", cwd=clone) == ""
