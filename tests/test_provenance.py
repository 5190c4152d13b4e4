"""Result rows carry the commit of the code the process runs: HEAD when it started, not when it writes."""

import subprocess

from alibi_lm import provenance


def test_the_commit_is_the_one_at_start_not_the_one_at_write(monkeypatch):
    at_start = provenance.git_commit(mark_dirty=False)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=provenance.REPO, capture_output=True,
                          text=True).stdout.strip()
    assert at_start == (head or "unknown")
    # a commit made while a sweep runs (HEAD moves, the tree is clean again) must not relabel later rows
    monkeypatch.setattr(provenance, "_read_commit", lambda: ("fffffff", False))
    assert provenance.git_commit(mark_dirty=False) == at_start


def test_uncommitted_changes_at_start_are_flagged(monkeypatch):
    monkeypatch.setattr(provenance, "_COMMIT_AT_START", ("abc1234", True))
    assert provenance.git_commit() == "abc1234 (with uncommitted changes)"
    assert provenance.git_commit(mark_dirty=False) == "abc1234"
    monkeypatch.setattr(provenance, "_COMMIT_AT_START", ("abc1234", False))
    assert provenance.git_commit() == "abc1234"
