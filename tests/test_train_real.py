"""A short training run on real WikiText-2 through the real command line, then its evaluation.

Runs where $ALIBI_LM_DATA/wikitext-2 exists (CI sets ALIBI_LM_DATA=../shared/data); skipped elsewhere.
"""

import json
import math
import os
from pathlib import Path

import pandas as pd
import pytest
from forked_app import run_python

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("ALIBI_LM_DATA", ROOT / "../shared/data")).resolve()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (DATA / "wikitext-2" / "wiki.train.tokens").is_file(),
                       reason=f"real WikiText-2 not found under {DATA} (set ALIBI_LM_DATA)"),
]


def run(module, *overrides, cwd):
    env = dict(os.environ, ALIBI_LM_DATA=str(DATA), PYTHONPATH=str(ROOT), WANDB_MODE="disabled")
    return run_python(["-m", module, *overrides], env, cwd, timeout=600)


def test_train_then_evaluate_on_wikitext2(tmp_path):
    common = [f"paths.runs={tmp_path}/runs", f"paths.results={tmp_path}/results", f"paths.cache={tmp_path}/cache"]
    train = run("alibi_lm.train", "experiment=quick", "name=quick", "data=wikitext2", "position=alibi", "train.max_tokens=null",
                "train.max_steps=30", "train.eval_every=15", "train.checkpoint_every=15", "train.eval_tokens=4096",
                "train.progress=false", "logger.wandb.mode=disabled", *common, cwd=tmp_path)
    assert train.returncode == 0, train.stderr[-2000:]
    run_dir = tmp_path / "runs/quick/alibi-L64-seed0"
    status = json.loads((run_dir / "status.json").read_text())
    assert status["status"] == "completed" and status["step"] == 30
    log = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(1, 31))
    assert log[-1]["loss"] < log[0]["loss"]  # it learns something in 30 steps
    assert math.isfinite(log[-1]["val_ppl"]) and log[-1]["val_ppl"] < 33278  # better than uniform

    ev = run("alibi_lm.eval", f"run={run_dir}", "eval.multipliers=[1,2]", "eval.max_tokens=8192",
             f"paths.results={tmp_path}/results", cwd=tmp_path)
    assert ev.returncode == 0, ev.stderr[-2000:]
    df = pd.read_csv(tmp_path / "results/quick/extrapolation.csv")
    assert sorted(df.eval_len) == [64, 128]
    assert (df.tokens == 8192).all()  # the same tokens scored at every length
    import hashlib

    valid = (DATA / "wikitext-2" / "wiki.valid.tokens").read_bytes()
    assert set(df.data_sha) == {hashlib.sha256(valid).hexdigest()[:16]}  # which copy of the split was scored
    assert set(df.command) == {f"python -m alibi_lm.eval run={run_dir} 'eval.multipliers=[1,2]' "
                               f"eval.max_tokens=8192 paths.results={tmp_path}/results"}
    assert (tmp_path / "results/quick/extrapolation.md").is_file()
