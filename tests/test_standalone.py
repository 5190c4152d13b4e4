"""The model stands alone: importing alibi_lm.model and building a TransformerLM needs torch and the position
schemes only. No Hydra or OmegaConf (registered where configs are composed, alibi_lm.config) and no subprocess
(the git commit is read when an app starts, alibi_lm.cli.main)."""

import subprocess
import sys

from alibi_lm.provenance import REPO

CHECK = """
import subprocess, sys

def refuse(*args, **kwargs):
    raise AssertionError(f"importing the model spawned a subprocess: {args}")

subprocess.Popen = refuse  # subprocess.run and check_output go through it
import torch
from alibi_lm.model import LMConfig, TransformerLM

model = TransformerLM(LMConfig(vocab_size=50, n_layer=1, n_head=2, d_model=16, position="alibi"))
assert model(torch.zeros(1, 8, dtype=torch.long)).shape == (1, 8, 50)
assert "hydra" not in sys.modules and "omegaconf" not in sys.modules, [m for m in sys.modules if "hydra" in m or "omegaconf" in m]
print("standalone")
"""


def test_the_model_imports_and_runs_without_hydra_or_subprocesses():
    # cwd is this checkout, so `-c` imports its alibi_lm (sys.path[0] is the working folder)
    done = subprocess.run([sys.executable, "-c", CHECK], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "standalone"
