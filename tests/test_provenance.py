"""Result rows carry the commit of the code the process runs: HEAD when it started, not when it writes."""

import os
import shutil
import subprocess
import sys

from alibi_lm import provenance

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
READER = "import sys, alibi_lm.provenance as p; print(p.git_commit(), flush=True); sys.stdin.readline(); print(p.git_commit())"


def commit_all(repo, message):
    subprocess.run([*GIT, "add", "-A"], cwd=repo, check=True, capture_output=True)
    subprocess.run([*GIT, "commit", "-qm", message], cwd=repo, check=True, capture_output=True)
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()


def test_a_commit_made_while_a_process_runs_does_not_relabel_it(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(provenance.REPO / "alibi_lm", repo / "alibi_lm", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    first = commit_all(repo, "first")
    env = {**os.environ, "PYTHONPATH": str(repo)}
    proc = subprocess.Popen([sys.executable, "-c", READER], cwd=tmp_path, env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == first
    (repo / "alibi_lm" / "new_module.py").write_text("X = 1\n")
    second = commit_all(repo, "second")  # HEAD moves while the process runs
    out, _ = proc.communicate("\n", timeout=60)
    assert second != first and out.strip() == first
    started_now = subprocess.run([sys.executable, "-c", "import alibi_lm.provenance as p; print(p.git_commit())"],
                                 cwd=tmp_path, env=env, capture_output=True, text=True).stdout.strip()
    assert started_now == second


def test_only_uncommitted_code_is_flagged(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    for folder in ("alibi_lm", "results"):
        (repo / folder).mkdir(parents=True)
        (repo / folder / "a.txt").write_text("1\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    sha = commit_all(repo, "first")
    monkeypatch.setattr(provenance, "REPO", repo)
    (repo / "results" / "a.txt").write_text("2\n")  # a results table rewritten: not code
    assert provenance.head_commit() == sha
    (repo / "alibi_lm" / "a.txt").write_text("2\n")
    assert provenance.head_commit() == f"{sha} (with uncommitted changes)"
    monkeypatch.setattr(provenance, "_COMMIT_AT_START", ("abc1234", True))
    assert provenance.git_commit() == "abc1234 (with uncommitted changes)"
    assert provenance.git_commit(mark_dirty=False) == "abc1234"


def test_hardware_names_the_cpu_memory_gpu_and_torch(monkeypatch):
    import torch

    monkeypatch.setattr(provenance, "cpu_description", lambda: "Test CPU, 2 cores")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    text = provenance.hardware()
    gib = int(open("/proc/meminfo").read().split("MemTotal:")[1].split()[0]) / 2**20
    assert text == f"Test CPU, 2 cores, {gib:.0f} GiB RAM, no GPU, torch {torch.__version__}"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gpu = type("Props", (), {"name": "Test GPU", "total_memory": 80 * 2**30})
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: asked.append(d) or gpu)
    assert provenance.hardware("cuda:1").endswith(", Test GPU (80 GiB), torch " + torch.__version__)
    assert provenance.hardware("cpu") and asked == [torch.device("cuda:1"), 0]  # the device's GPU, else the first


def test_paths_inside_the_repository_are_written_relative_to_it(tmp_path):
    assert provenance.repo_relative(provenance.REPO / "runs" / "x" / "alibi-L16-seed0") == "runs/x/alibi-L16-seed0"
    assert provenance.repo_relative(tmp_path / "a") == str((tmp_path / "a").resolve())  # elsewhere: absolute


def test_the_command_column_is_the_command_as_typed(monkeypatch):
    import types

    monkeypatch.setattr(sys, "argv", [str(provenance.REPO / "alibi_lm" / "train.py"), "-m", "position=alibi,t5",
                                      f"run={provenance.REPO}/runs/exp/alibi-L16-seed0", "eval.lengths=[1, 2]"])
    monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace(__spec__=types.SimpleNamespace(name="alibi_lm.train")))
    assert provenance.command_line() == ("python -m alibi_lm.train -m position=alibi,t5 run=runs/exp/alibi-L16-seed0 "
                                         "'eval.lengths=[1, 2]'")
    package = types.SimpleNamespace(__spec__=types.SimpleNamespace(name="alibi_lm.probes.__main__"))
    monkeypatch.setitem(sys.modules, "__main__", package)  # python -m alibi_lm.probes runs the package's __main__
    assert provenance.command_line().startswith("python -m alibi_lm.probes -m position=alibi,t5 ")
    monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace(__spec__=None))
    monkeypatch.setattr(sys, "argv", [str(provenance.REPO / "scripts" / "reproduce.py"), "--dry-run"])
    assert provenance.command_line() == "python scripts/reproduce.py --dry-run"


def test_a_copy_without_git_takes_its_commit_from_the_environment_and_only_there(tmp_path):
    """The working tree sent to a GPU machine has no .git: its rows name the commit scripts/gpu_check.sh pack
    recorded ($ALIBI_LM_COMMIT), flagged when it was dirty; without it, "unknown". So does a copy inside another
    repository's folder (not the top of that work tree). A checkout ignores the variable."""
    copy, nested = tmp_path / "copy", tmp_path / "outer" / "copy"
    for folder in (copy, nested):
        shutil.copytree(provenance.REPO / "alibi_lm", folder / "alibi_lm", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["git", "init", "-q"], cwd=tmp_path / "outer", check=True)
    commit_all(tmp_path / "outer", "an unrelated repository around the copy")
    read = "import alibi_lm.provenance as p; print(p.git_commit())"

    def commit_seen(repo, value):
        env = {k: v for k, v in os.environ.items() if k != provenance.COPY_COMMIT_ENV}
        env.update({"PYTHONPATH": str(repo), **({provenance.COPY_COMMIT_ENV: value} if value is not None else {})})
        return subprocess.run([sys.executable, "-c", read], cwd=tmp_path, env=env, capture_output=True,
                              text=True).stdout.strip()

    assert commit_seen(copy, None) == "unknown"
    assert commit_seen(copy, "abc1234") == "abc1234"
    assert commit_seen(copy, "abc1234 (with uncommitted changes)") == "abc1234 (with uncommitted changes)"
    assert commit_seen(nested, "abc1234") == "abc1234" and commit_seen(nested, None) == "unknown"
    assert commit_seen(provenance.REPO, "abc1234") not in ("abc1234", "unknown")  # git's answer, not the variable's
