"""make reproduce's plan (scripts/reproduce.py --dry-run): every registered scheme, the RoPE extensions and the
context probes are steps of the committed reproduction."""

import subprocess
import sys
from pathlib import Path

from alibi_lm.positions.rope import ROPE_SCALINGS

ROOT = Path(__file__).resolve().parent.parent



def plan(*args: str) -> list[str]:
    out = subprocess.run([sys.executable, "scripts/reproduce.py", "--dry-run", *args], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    return out.splitlines()


def test_the_plan_covers_every_scheme_rope_extension_and_probe():
    steps = plan()
    registered = subprocess.run([sys.executable, "-m", "alibi_lm.positions"], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.strip()  # the package's registry (tests add a scheme to theirs)
    assert len(registered.split(",")) >= 11
    assert steps[0].startswith("all schemes at L:") and f"position={registered} " in steps[0]
    for seed in (0, 1, 2):
        for method in ROPE_SCALINGS:
            assert any(s.startswith(f"RoPE extension {method} rope-L128-seed{seed}:") and f"position.scaling={method}" in s
                       for s in steps)
    for scheme in registered.split(","):
        assert any(s.startswith(f"context probes {scheme}-L128-seed0:") for s in steps)
        assert any(s.startswith(f"sliding eval {scheme}-L128-seed0:") and "eval.mode=sliding" in s for s in steps)
    assert steps[-1].startswith("report:")
    # what the one-seed report needs comes first; the extra seeds (and their rope runs' extensions) last
    first = {name: min(i for i, s in enumerate(steps) if s.startswith(name))
             for name in ("training-length sweep", "sliding eval", "context probes", "more seeds")}
    assert first["training-length sweep"] < first["sliding eval"] < first["context probes"] < first["more seeds"]
    assert all(i > first["more seeds"] for i, s in enumerate(steps) if "seed1" in s or "seed2" in s)


def test_the_plan_leaves_out_what_is_switched_off():
    steps = plan("--rope-scalings=", "--no-context-probes", "--more-seeds=", "--other-lengths=")
    assert not any(s.startswith(("RoPE extension", "context probes", "more seeds", "training-length")) for s in steps)
    steps = plan("--more-seeds=")  # the rope run at L alone gets the extensions
    assert sum(s.startswith("RoPE extension") for s in steps) == 4 and not any("seed1" in s for s in steps)


def test_empty_entries_in_comma_lists_are_dropped():
    steps = plan("--seeds=0,", "--rope-scalings=linear,", "--schemes=alibi,rope,", "--more-seeds=,")
    assert not any("seed " in s or s.endswith("seed:") or "-seed:" in s for s in steps)
    assert [s.split(":")[0] for s in steps if s.startswith("RoPE")] == ["RoPE extension linear rope-L128-seed0"]
    assert all("position.scaling=" not in s or "position.scaling=linear" in s for s in steps)
    assert steps[0].startswith("all schemes at L:") and "position=alibi,rope seed=0 " in steps[0]


def test_a_plan_without_schemes_is_refused():
    out = subprocess.run([sys.executable, "scripts/reproduce.py", "--dry-run", "--schemes=,"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 2 and "--schemes, --seeds and --multipliers need at least one entry" in out.stderr
