"""README.md and docs/*.md run as written: every ```python block executes in a fresh process (on a small synthetic
corpus, so no real data is needed); every command names the project's own interpreter (`.venv/bin/python`, as
`make setup` leaves it) or a `make` target that exists, a module that exists and a script that exists; every
command of the three apps composes into a valid typed config; every relative link resolves, its #anchor included;
the README indexes every page and stays about one screen."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
from pathlib import Path

import pytest
from conftest import write_corpus
from forked_app import run_python
from hydra.errors import ConfigCompositionException

import alibi_lm.probes  # noqa: F401 - registers probes_schema, which configs/probes.yaml extends
from alibi_lm.config import compose, to_job

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
APPS = {"train": "train", "eval": "eval", "probes": "probes"}  # python -m alibi_lm.<module> -> configs/<app>.yaml
README_MAX_LINES = 250
# the contributor page names each app by its module (`python -m alibi_lm.eval`) and shows templates, not commands
CONTRIBUTOR_PAGES = {"docs/architecture.md"}


def text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def python_blocks() -> list[tuple[str, int, str]]:
    """(page, index within the page, code) of every ```python block of the user pages (the contributor page's are
    templates to fill in)."""
    found = []
    for page in (p for p in PAGES if name(p) not in CONTRIBUTOR_PAGES):
        blocks = [body for lang, body in FENCE.findall(text(page)) if lang == "python"]
        found += [(name(page), i, body) for i, body in enumerate(blocks)]
    return found


def code_snippets(page_text: str) -> list[str]:
    """What a page shows as code: the lines of its fenced blocks and its inline `code` spans (prose never counts)."""
    lines = [line for _, body in FENCE.findall(page_text) for line in body.splitlines()]
    inline = re.findall(r"`([^`\n]+)`", FENCE.sub("", page_text))
    return lines + inline


def all_snippets() -> list[tuple[str, str]]:
    return [(name(page), snippet) for page in PAGES for snippet in code_snippets(text(page))]


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z0-9_-]+):(?!=)", (ROOT / "Makefile").read_text(encoding="utf-8"), re.M))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (word characters, spaces and hyphens stay),
    spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    headings = re.findall(r"^#{1,6} (.+)$", FENCE.sub("", text(page)), re.M)  # a block's "# comment" is no heading
    return {slug(h) for h in headings}


def transcripts() -> list[tuple[str, str, str]]:
    """(page, command, the error line it prints) of every documented failure: a `$ command` line of a fenced block
    followed by an `error: ...` line."""
    found = []
    for page in PAGES:
        for _, body in FENCE.findall(text(page)):
            lines = body.splitlines()
            found += [(name(page), line[2:], nxt) for line, nxt in zip(lines, lines[1:])
                      if line.startswith("$ ") and nxt.startswith("error: ")]
    return found


def app_commands() -> list[tuple[str, str, list[str]]]:
    """(page, app, overrides) of every documented command of the train, eval and probes apps that a reader can run
    as written (no <placeholder>, no shell substitution); documented failures are checked by their own test."""
    found = []
    pattern = re.compile(r"\.venv/bin/(?:python|torchrun(?: --\S+)*) -m alibi_lm\.(train|eval|probes)(?= |$)(.*)")
    failing = {command for _, command, _ in transcripts()}
    for page, snippet in all_snippets():
        if snippet.removeprefix("$ ") in failing:
            continue
        match = pattern.search(snippet)
        if not match or re.search(r"<|\$\(|\.\.\.|…", match.group(2)):
            continue
        args = shlex.split(match.group(2), comments=True)
        if "--help" in args or "-h" in args:
            continue
        overrides = [a for a in args if a not in ("-m", "--multirun", "--cfg", "job", "--debug")]
        # a sweep's cells compose alike: its first value of each comma-separated choice stands for all
        overrides = [re.sub(r"^([^=\[]+=)([^\[,]+),.*$", r"\1\2", o) for o in overrides]
        found.append((page, APPS[match.group(1)], overrides))
    return found


def test_the_docs_have_python_blocks_and_commands():
    assert python_blocks(), "no ```python block in README.md or docs/"
    assert len(app_commands()) >= 20, "the commands of the three apps are found"


@pytest.mark.slow  # subprocesses; one block trains a small model
@pytest.mark.parametrize("page, index, block", python_blocks(), ids=lambda v: str(v)[:40] if isinstance(v, str) else v)
def test_python_block_runs(page, index, block, tmp_path):
    data = write_corpus(tmp_path / "data")
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ALIBI_LM_DATA": str(data), "WANDB_MODE": "disabled",
           "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    result = run_python(["-c", block], env, work, timeout=300)
    assert result.returncode == 0, f"{page}: python block {index + 1} failed:\n{block}\n{result.stderr[-3000:]}"


def test_no_command_relies_on_an_activated_environment():
    """A fresh shell after `make setup` has no `python` with the project on it: commands say `.venv/bin/python`."""
    bare = re.compile(r"(?:^|[\s;&|(]|^\$ )(python3?|torchrun|pytest) ")
    found = [(page, s) for page, s in all_snippets() if bare.search(s.replace("python3 -m venv", "")) and
             not s.lstrip().startswith("#") and page not in CONTRIBUTOR_PAGES]  # a venv is made by the system's
    assert not found, f"commands that need an activated environment: {found}"


def test_every_make_target_mentioned_exists():
    mentioned = {(page, t) for page, s in all_snippets() for t in re.findall(r"(?:^|[\s;&|(])make ([a-z][\w-]*)", s)}
    assert {"train", "test", "smoke"} <= {t for page, t in mentioned if page == "README.md"}
    missing = sorted((page, t) for page, t in mentioned if t not in makefile_targets())
    assert not missing, f"make targets the Makefile lacks: {missing}"


def test_every_python_module_and_script_mentioned_exists():
    snippets = all_snippets()
    modules = {(page, m) for page, s in snippets for m in re.findall(r"python -m ((?:alibi_lm|scripts)(?:\.\w+)*)", s)}
    assert ("README.md", "alibi_lm.train") in modules or any(m == "alibi_lm.train" for _, m in modules)
    missing = sorted((page, m) for page, m in modules if importlib.util.find_spec(m) is None)
    assert not missing, f"modules that do not exist: {missing}"
    scripts = {(page, s) for page, snippet in snippets for s in re.findall(r"\bscripts/[\w/]+\.py", snippet)}
    absent = sorted((page, s) for page, s in scripts if not (ROOT / s).is_file())
    assert not absent, f"scripts that do not exist: {absent}"


def resolves(dotted: str) -> bool:
    """Whether alibi_lm.x.y names a module, or an attribute of the longest module prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        try:
            if importlib.util.find_spec(module) is None:
                continue
        except ModuleNotFoundError:  # a name below a module that is not a package: an attribute, tried shorter
            continue
        obj = importlib.import_module(module)
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_project_path_and_name_mentioned_exists():
    """alibi_lm/... files and folders, configs/... files and alibi_lm.x.y names in code are there (a module moved,
    renamed or deleted must take its docs along)."""
    snippets = all_snippets()
    paths = {(page, p.rstrip("/")) for page, s in snippets
             for p in re.findall(r"(?<![\w./])((?:alibi_lm|configs|tests)/[\w/.-]*\w/?)", s) if "<" not in s}
    # the files a reader is shown how to add, an experiment called X, and configs/ as a wheel installs it
    examples = re.compile(r"myscheme|/X\.|^alibi_lm/configs$")
    absent = sorted((page, p) for page, p in paths if not (ROOT / p).exists() and not examples.search(p))
    assert not absent, f"paths that do not exist: {absent}"
    names = {(page, n) for page, s in snippets for n in re.findall(r"(?<![\w/])alibi_lm(?:\.\w+)+", s)}
    unresolved = sorted((page, n) for page, n in names if not resolves(n))
    assert not unresolved, f"names that do not resolve: {unresolved}"


def test_every_app_command_composes_into_a_valid_config():
    """Each documented override names a real key or group option with a value of the right type and range."""
    failures = []
    for page, app, overrides in app_commands():
        try:
            to_job(compose(app, overrides))
        except Exception as error:  # noqa: BLE001 - every failure is reported with its command
            failures.append(f"{page}: {app} {' '.join(overrides)}: {type(error).__name__}: {str(error)[:200]}")
    assert not failures, "\n".join(failures)


@pytest.mark.slow  # one subprocess per documented failure
@pytest.mark.parametrize("page, command, error", transcripts(), ids=lambda v: str(v)[:60])
def test_a_documented_failure_prints_its_line(page, command, error, tmp_path):
    """Run in a fresh folder on a small corpus: exit status 2, the documented line on stderr, nothing written."""
    args = shlex.split(command)
    run = next((a.split("=", 1)[1] for a in args if a.startswith("run=")), None)
    if run and not (tmp_path / run).exists():
        pytest.skip(f"needs a prepared run folder ({run})")
    data = write_corpus(tmp_path / "data")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ALIBI_LM_DATA": str(data), "WANDB_MODE": "disabled",
           "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    assert args[0] in (".venv/bin/python", "python"), f"{page}: {command}: not a python command line"
    result = run_python(args[1:], env, tmp_path, timeout=120)
    assert result.returncode == 2, f"{page}: {command}: exit {result.returncode}\n{result.stderr[-2000:]}"
    assert result.stderr.strip().splitlines()[-1] == error, f"{page}: {command}"
    assert not (tmp_path / "runs").exists() and not (tmp_path / "results").exists()


def flag_commands() -> dict[str, set[tuple[str, str]]]:
    """program -> {(page, --flag)} of every documented command of an argparse program (scripts, the results, report,
    bench and importer modules; make targets' ARGS="--..." name the script behind them)."""
    found: dict[str, set[tuple[str, str]]] = {}
    program = re.compile(r"(scripts/\w+\.py|(?<=\.venv/bin/python )-m alibi_lm\.(?:results|probes\.report|bench|fairseq_import))"
                         r"((?: [^#`]*)?)")
    targets = {"reproduce": "scripts/reproduce.py", "tasks": "scripts/tasks.py", "budget-probes": "scripts/budget_probes.py",
               "bench": "-m alibi_lm.bench", "import-fairseq": "-m alibi_lm.fairseq_import"}
    for page, snippet in all_snippets():
        for prog, args in program.findall(snippet):
            found.setdefault(prog, set()).update((page, f) for f in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", args))
        for target, args in re.findall(r"make ([a-z][\w-]*) ARGS=\"([^\"]*)\"", snippet):
            if target in targets:
                found.setdefault(targets[target], set()).update((page, f) for f in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", args))
    return found


@pytest.mark.slow  # one --help per program
def test_every_documented_flag_is_one_its_program_takes():
    unknown = []
    for prog, flags in sorted(flag_commands().items()):
        result = run_python([*prog.split(), "--help"], {**os.environ, "PYTHONPATH": str(ROOT)}, ROOT, timeout=120)
        assert result.returncode == 0, f"{prog} --help: {result.stderr[-1000:]}"
        taken = set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", result.stdout))
        unknown += [f"{page}: {prog} {flag}" for page, flag in sorted(flags) if flag not in taken]
    assert not unknown, "flags their programs do not take:\n" + "\n".join(unknown)


def test_a_bad_override_is_caught_by_the_composition_check():
    """The check above can fail: a misspelled key does not compose."""
    with pytest.raises(ConfigCompositionException, match="train.seqlen"):
        to_job(compose("train", ["train.seqlen=128"]))


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_every_relative_link_resolves(page):
    broken = []
    for target in LINK.findall(text(page)):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, f"{name(page)}: {broken}"


def test_slug_follows_github():
    assert slug("A scheduler's signal") == "a-schedulers-signal"
    assert slug("Synthetic tasks: does a scheme let a model use positions beyond L?") == \
        "synthetic-tasks-does-a-scheme-let-a-model-use-positions-beyond-l"
    assert slug("`make sweep` and rope_scaling") == "make-sweep-and-rope_scaling"


def test_the_readme_is_one_screen_and_indexes_every_page():
    readme = text(ROOT / "README.md")
    assert len(readme.splitlines()) <= README_MAX_LINES
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in LINK.findall(readme)}
    unlisted = sorted(name(page) for page in PAGES[1:] if page.resolve() not in linked)
    assert not unlisted, f"docs pages the README does not link: {unlisted}"
