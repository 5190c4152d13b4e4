"""python -m alibi_lm.bench refuses bad arguments in one line (exit 2), before any section runs or anything is
written: a bad length, multiplier, override or --out, and numbers that were silently taken (--tolerance -1,
--threads 0, --max-rounds 0: 0 read as "not given")."""

from __future__ import annotations

import pytest

from alibi_lm.bench import cli

BAD = [
    (["--lengths", "0"], "--lengths"),
    (["--lengths", "64,abc"], "--lengths"),
    (["--lengths", ","], "--lengths"),
    (["--mem-multipliers", "1,nan"], "--mem-multipliers"),
    (["--eval-length", "-5"], "--eval-length"),
    (["--override", "model.d_model=abc"], "model.d_model"),
    (["--override", "nokey"], "KEY=VALUE"),
    (["--override", "model.nosuch=3"], "model.nosuch"),
    (["--tolerance", "-1"], "--tolerance"),
    (["--tolerance", "nan"], "--tolerance"),
    (["--threads", "0"], "--threads"),
    (["--max-rounds", "0"], "--max-rounds"),
    (["--min-rounds", "0"], "--min-rounds"),
    (["--round-budget", "0"], "--round-budget"),
]


def refused(argv: list[str], monkeypatch, capsys) -> str:
    """Run the bench's main on argv, with the sections replaced by a failure: the one error line it printed."""
    def ran(*_):
        raise AssertionError(f"the bench ran with {argv}")

    monkeypatch.setattr(cli, "run", ran)
    with pytest.raises(SystemExit) as stop:
        cli.main(["--quick", "--device", "cpu", "--sections", "train", "--schemes", "alibi", "--no-peers", *argv])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert stop.value.code == 2 and "Traceback" not in err and len(errors) == 1, err
    return errors[0]


@pytest.mark.parametrize("argv, named", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_arguments_are_refused_in_one_line_before_any_work(argv, named, tmp_path, monkeypatch, capsys):
    out = tmp_path / "bench"
    line = refused([*argv, "--out", str(out)], monkeypatch, capsys)
    assert named in line
    assert not out.exists()


@pytest.mark.parametrize("below", ["", "sub"])
def test_an_out_that_is_a_file_is_refused_and_kept(below, tmp_path, monkeypatch, capsys):
    kept = tmp_path / "report.md"
    kept.write_text("an earlier report\n")
    line = refused(["--out", str(kept / below)], monkeypatch, capsys)
    assert "--out" in line and "not a folder" in line
    assert kept.read_text() == "an earlier report\n"
