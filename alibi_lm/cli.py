"""Launch a Hydra app so that bad input ends in one line on stderr and a non-zero exit.

Before Hydra creates a folder and before any data is read, every config the command line would run
(each cell of a -m sweep, as Hydra's sweeper expands the overrides) is composed and made typed, which
validates it, and the app's check(job, output_dir) looks at what the job will read and write. A problem
is one line, `error: ...`, with exit status 2; so is a UserError raised later by the app (with its own
status: 3 for a diverged run) and a failed write (disk full, no permission). HYDRA_FULL_ERROR=1,
ALIBI_LM_DEBUG=1 or --debug show the traceback instead (a UserError keeps its exit status).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import errno
import os
import re
import shutil
import sys
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError
from tqdm import tqdm

from .checkpoint import underlying_os_error
from .config import CONFIG_DIR, compose, config_name, register_schemas, to_job
from .errors import ConfigError, UserError, allowed_range, check_range, write_error
from .model import flush_denormals
from .positions import POSITION_SCHEMES
from .provenance import read_commit_at_start, set_job_command
from .stopping import Interrupted, raise_on_stop

# Write failures that are the environment's, not a bug: reported in one line like a UserError.
WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR}
# what continues an app's work after a stop signal, by app: what it kept, and the setting that skips it
RESUME_AFTER_STOP = {"train": "every finished checkpoint and results row is kept, and the same command with "
                              "train.resume=auto continues",
                     "eval": "every finished results row is kept, and the same command with eval.skip_done=true "
                             "scores only the rest",
                     "probes": "every finished results row is kept, and the same command probes only the rest "
                               "(skip_done=true, its default)"}
NO_PREFLIGHT = ("-h", "--help", "--hydra-help", "--info", "-i", "--cfg", "-c", "--resolve", "--shell-completion")
NO_RENAME = ("-h", "--help", "--hydra-help", "--info", "-i", "--shell-completion")  # --cfg job shows the name it would run
CONFIG_NAME_FLAGS = ("--config-name", "-cn")  # Hydra's flags that name the config to run instead of the app's
CONFIG_DIR_FLAGS = ("--config-dir", "-cd")  # Hydra's flags that add a folder of the user's configs
# The groups a trained run fixes: the apps that read a run (eval, probes) take them from its folder, not the command
RUN_GROUPS = ("position", "task", "model", "tokenizer", "experiment")
# Hydra's words for a group the app's defaults do not have: `group=x`, and `+group=x` (its schema has no such key)
NO_SUCH_GROUP = (re.compile(r"Could not override '([\w.]+)'\. No match in the defaults list"),
                 re.compile(r"In '(?:schema/)?([\w.]+)/[^']*': ConfigKeyError raised while composing config:\s*"
                            r"Key '\1' not in"))


def number(cast=int, low=1, low_open: bool = False):
    """An argparse type= for a numeric option: `cast` of the text, finite and within errors.check_range's range. A
    bad value is argparse's one-line error (usage, exit 2) at parsing, not a traceback or a silent default later."""
    def parse(text: str):
        try:
            value = cast(text)
            check_range("value", value, low, low_open=low_open)  # NaN and the infinities are outside every range
        except ValueError:  # not a number, or outside the range (a ConfigError is a ValueError)
            kind = "an integer" if cast is int else "a number"
            raise argparse.ArgumentTypeError(f"must be {kind} {allowed_range(low, low_open=low_open)}, "
                                             f"got {text!r}") from None
        return value
    return parse


def number_list(cast=int, low=1, low_open: bool = False):
    """An argparse type= for a comma list of such numbers (empty entries dropped, as the plans' names() drops them).
    It returns the text as given: the plans put its entries into overrides as they are (seed=01 names the run as written)."""
    one = number(cast, low, low_open)

    def parse(text: str) -> str:
        for entry in (x.strip() for x in text.split(",") if x.strip()):
            try:
                one(entry)
            except argparse.ArgumentTypeError as e:
                raise argparse.ArgumentTypeError(f"takes a comma list whose every entry {e} (in {text!r})") from None
        return text
    return parse


def config_groups(*groups: str) -> str:
    """`group: option, ...` lines of the config groups a user chooses, as configs/<group>/ holds them now: the
    ${config_groups:...} of the apps' --help (Hydra's $APP_CONFIG_GROUPS would list the internal schema/ ones)."""
    return "\n".join(f"{group}: {', '.join(sorted(p.stem for p in Path(CONFIG_DIR, group).glob('*.yaml')))}"
                     for group in groups)


OmegaConf.register_new_resolver("config_groups", config_groups, replace=True)


def _debug() -> bool:
    return os.environ.get("ALIBI_LM_DEBUG") == "1" or (os.environ.get("HYDRA_FULL_ERROR") == "1" and not _reraise_set)


_reraise_set = False  # main() sets HYDRA_FULL_ERROR itself: then it is not the user's debug switch


def fail(message: str, status: int = 2):
    tqdm.write(f"error: {message}", file=sys.stderr)  # on a line of its own below a progress bar
    sys.exit(status)


def did_you_mean(word: str, choices) -> str:
    """ "did you mean X? " for the choice closest to a misspelled word (difflib's ratio >= 0.75), else ""."""
    close = difflib.get_close_matches(word, [str(c) for c in choices], n=1, cutoff=0.75)  # not foo -> fox
    return f"did you mean {close[0]}? " if close else ""


def sibling_keys(cause: OmegaConfBaseException) -> list[str]:
    """The full keys beside an unknown one: its parent node's keys, with the parent's path."""
    parent, key = cause.parent_node, str(cause.full_key)
    prefix = key[: len(key) - len(str(cause.key))]  # "train." of "train.seqlen"; "" at the top
    try:
        return [f"{prefix}{k}" for k in parent.keys()] if parent is not None else []
    except OmegaConfBaseException:
        return []


def not_a_group(group: str, app: str | None) -> str:
    """The line for `group=...` given to an app whose config has no such group (eval task=mqar)."""
    where = f"alibi_lm.{app}" if app else "this command"
    text = f"{where} has no config group {group!r}: `python -m {where} --help` lists the groups it takes"
    if app in ("eval", "probes") and group in RUN_GROUPS:
        text += (f"; a trained run's {group} comes from its folder: choose the run with run=<run folder> "
                 f"(runs/<experiment>/<run>), or train one with {group}=...")
    return text


def parse_hint(override: str) -> str:
    """How to write an override that Hydra's grammar cannot read: close a list, or quote a value with braces."""
    value = override.partition("=")[2]
    if value.lstrip().startswith("[") and value.count("[") != value.count("]"):
        return "close its list: key=[a,b]"
    return "a value with braces, brackets, spaces or quotes goes in quotes within the argument: 'key=\"a {b} c\"'"


def describe(e: Exception, app: str | None = None) -> str:
    """One line for an error that composing a config raised (Hydra's, or OmegaConf's under it); `app` (train, eval,
    probes) names the command in the line where it helps."""
    for pattern in NO_SUCH_GROUP:
        if match := pattern.match(str(e).strip()):
            return not_a_group(match[1], app)
    if isinstance(e, MissingConfigException) and e.options is not None and e.missing_cfg_file:
        group, _, option = e.missing_cfg_file.rpartition("/")
        if group == "position" and option in POSITION_SCHEMES:  # a new scheme's module without its YAML file
            return (f"position {option!r} is registered ({POSITION_SCHEMES[option].__module__}) but has no "
                    f"configs/position/{option}.yaml: add one (docs/position-schemes.md, Adding a scheme, step 2)")
        return f"unknown {group} {option!r}; {did_you_mean(option, e.options)}choose one of {', '.join(sorted(e.options))}"
    if isinstance(e, MissingConfigException) and str(e).startswith("Cannot find primary config"):  # --config-name x
        apps = sorted(p.stem for p in Path(CONFIG_DIR).glob("*.yaml"))
        return (f"unknown config {e.missing_cfg_file!r} (--config-name); {did_you_mean(e.missing_cfg_file, apps)}choose "
                f"one of {', '.join(apps)}, or leave the flag out to run the app's own")
    if isinstance(e, OverrideParseException) and e.override:  # Hydra's grammar: braces, brackets, spaces, quotes
        reason = " ".join(e.message.strip().splitlines()[0].split())
        return f"cannot read the override {e.override!r} ({reason}); {parse_hint(e.override)}"
    if merge := re.search(r"Merge error: (\w+) is not a subclass of (\w+)", str(e)):  # group=[alibi,rope]
        return (f"a config group given a list merges its choices, and {merge[1]} does not merge into {merge[2]}: a run "
                f"takes one scheme (or task); to sweep them, write -m <group>=a,b, without brackets")
    ours = e
    while ours is not None and not isinstance(ours, (ConfigError, UserError)):  # ours under Hydra's or OmegaConf's
        ours = ours.__cause__ or ours.__context__
    if ours is not None and ours is not e:  # a resolver's check (a scheme's options): its own line, no wrapping
        return str(ours).strip().splitlines()[0]
    cause = e
    while cause is not None and not isinstance(cause, OmegaConfBaseException):
        cause = cause.__cause__
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and cause.full_key:
        key = cause.full_key
        if key.startswith("hydra.launcher."):  # the chosen launcher's options, not the job's
            options = [k for k in sibling_keys(cause) if not k.rpartition(".")[2].startswith("_")]  # not _target_
            return (f"unknown config key {key!r}: the launcher chosen has no such option; {did_you_mean(key, options)}"
                    f"choose the launcher that has it first (hydra/launcher=submitit_slurm or submitit_local); "
                    f"`--cfg hydra` prints the chosen one's options")
        if key.startswith("hydra."):
            return (f"unknown config key {key!r} (misspelled?); {did_you_mean(key, sibling_keys(cause))}`--cfg hydra` "
                    f"prints Hydra's keys")
        # no `+key` advice: a key the typed config lacks would be dropped (compose.check_typed_keys refuses it)
        return (f"unknown config key {key!r} (misspelled?); {did_you_mean(key, sibling_keys(cause))}`--cfg job` prints "
                f"the valid keys")
    if isinstance(cause, ValidationError) and cause.full_key:  # msg's later lines repeat the key and name classes
        example = f" (a list: {cause.full_key}=[...])" if "ListConfig" in cause.msg else ""
        return (f"{cause.full_key}: {cause.msg.strip().splitlines()[0]}; give {cause.full_key} a value of that "
                f"type{example}")
    lines = str(e).strip().splitlines()
    source, key = re.match(r"In '([^']+)': ConfigKeyError", lines[0]), re.search(r"full_key: (\S+)", str(e))
    if source and key:  # a config file (an experiment of the user's) sets a key the schema does not have
        return f"unknown config key {key[1]!r} in {source[1]}.yaml (misspelled?); `--cfg job` prints the valid keys"
    if lines[0].endswith(":") and len(lines) > 1:  # Hydra's heading of the message under it
        return f"{lines[0]} {lines[1].strip()}"
    return lines[0]


@contextlib.contextmanager
def one_line_errors(app: str | None = None):
    """A UserError, a failed write or a bad config becomes `error: <one line>` and an exit; `app` names the command
    in a bad config's line (describe)."""
    try:
        yield
    except Exception as e:
        if _debug():
            if isinstance(e, UserError):  # the traceback asked for, and the exit status a driver reads (75: resume)
                traceback.print_exc()
                sys.exit(e.exit_status)
            raise
        if isinstance(e, UserError):
            fail(str(e), e.exit_status)
        if isinstance(e, OSError) and e.errno in WRITE_ERRNOS:
            fail(str(write_error(e.filename or "a file", e)))
        if (os_error := underlying_os_error(e)) is not None and os_error.errno in WRITE_ERRNOS:
            fail(str(write_error(os_error.filename or "a file", os_error)))
        if isinstance(e, (HydraException, OmegaConfBaseException)):
            fail(describe(e, app))
        if isinstance(e, ValueError) and str(e).startswith("Config group override must be"):  # null in a sweep
            fail("a config group's choice cannot be null in a sweep (extension=streaming,null); run the cell without "
                 "the group apart, or drop null")
        raise


def sweep_cells(overrides: list[str]) -> list[list[str]]:
    """The overrides of every job of `-m *overrides`, expanded as Hydra's basic sweeper does."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    batches = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(overrides), None)
    return [list(cell) for batch in batches for cell in batch]


def output_dir(cfg, multirun: bool) -> Path | None:
    """The folder Hydra would create for this job (hydra.run.dir, or sweep.dir/sweep.subdir)."""
    try:
        if multirun:
            return Path(OmegaConf.select(cfg, "hydra.sweep.dir"), OmegaConf.select(cfg, "hydra.sweep.subdir"))
        return Path(OmegaConf.select(cfg, "hydra.run.dir"))
    except OmegaConfBaseException:  # e.g. ${hydra.job.num}: known only once Hydra runs the job
        return None


def command_overrides(args: list[str]) -> list[str]:
    """The overrides of a command line: its arguments without Hydra's flags and their values (`--cfg job`, `-i
    config`, `-cd <folder>`), as Hydra's parser reads them. Overrides that follow a flag after other overrides
    (`a=1 -m b=2`) are kept too: Hydra refuses that command, but a setting in them that cannot work is named first."""
    from hydra._internal.utils import get_args_parser

    known, rest = get_args_parser().parse_known_args(args)
    return [*known.overrides, *(a for a in rest if not a.startswith("-"))]


def preflight(app: str, args: list[str], check) -> None:
    """Compose and type every job of the command line, and check(job, output_dir) each."""
    overrides = command_overrides(args)
    multirun = any(a in ("-m", "--multirun") for a in args)
    cells = sweep_cells(overrides) if multirun else [overrides]
    for cell in cells:
        with cell_named(app, overrides, cell, len(cells)):
            cfg = compose(app, cell)
            check_booleans(cfg, cell)
            if multirun:
                check_launcher(cfg)
            check(to_job(cfg), output_dir(cfg, multirun))


@contextlib.contextmanager
def cell_named(app: str, overrides: list[str], cell: list[str], cells: int):
    """A bad setting found in one cell of a sweep (of `cells`) names the cell: a key that only some of the swept
    choices have (position.power with position=alibi,powdist) fails in the others."""
    try:
        yield
    except Interrupted:  # a stop signal, not the cell's fault: its own line and exit status (130, 75)
        raise
    except (HydraException, OmegaConfBaseException, UserError, ConfigError) as e:  # Hydra's other errors as before
        if cells == 1:
            raise
        raise UserError(f"sweep cell {' '.join(swept_values(overrides, cell))}: {describe(e, app)}") from e


def swept_values(overrides: list[str], cell: list[str]) -> list[str]:
    """The overrides of a sweep's cell that the sweep varies (position=alibi of -m position=alibi,rope)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    swept = {o.key_or_group for o in OverridesParser.create().parse_overrides(overrides) if o.is_sweep_override()}
    return [c for c in cell if c.lstrip("+~").split("=", 1)[0] in swept] or cell


def check_booleans(cfg, overrides: list[str]) -> None:
    """A yes/no setting not given as a number other than 0 or 1: OmegaConf takes any number for a bool
    (train.progress=2 became true), so a typo such as a count for a yes/no setting would pass silently. Words
    (true, no, y), quoted ones and interpolations are OmegaConf's to judge, as before."""
    for override in overrides:
        key, equals, text = override.lstrip("+").partition("=")
        text = text.strip().strip("'\"")
        if not equals or key.startswith(("~", "hydra.")) or "${" in text:
            continue
        try:
            value = float(text)
        except ValueError:
            continue
        if value not in (0, 1) and isinstance(OmegaConf.select(cfg, key, default=None), bool):
            raise UserError(f"{key} is a yes/no setting: set it to true or false, got {text}")


def check_launcher(cfg) -> None:
    """A sweep's launcher can start here: a SLURM launcher needs SLURM's commands (submitit calls sbatch and
    srun), which Hydra would find missing only after writing the sweep folder."""
    target = str(OmegaConf.select(cfg, "hydra.launcher._target_", default=""))
    if target.endswith("SlurmLauncher") and shutil.which("sbatch") is None:
        raise UserError("hydra/launcher=slurm submits to SLURM, but this machine has no sbatch on PATH; run the "
                        "sweep on a SLURM login node, or try it here with hydra/launcher=submitit_local")


def skip_group_listings(template: str) -> None:
    """Hydra's --help lists every config group twice ($APP_CONFIG_GROUPS, $HYDRA_CONFIG_GROUPS), copying the whole
    config repository once per group: about half of --help's time. The apps' template (configs/hydra/help/
    alibi_lm.yaml) uses neither (its ${config_groups:...} lists the groups a user chooses), so Hydra lists none."""
    if "CONFIG_GROUPS" not in template.replace("${config_groups:", ""):
        from hydra._internal.hydra import Hydra

        Hydra.format_config_groups = lambda self, predicate, compact=True: ""


def resolve_config_names(args: list[str]) -> list[str]:
    """The command line with a config named by an older name (`--config-name evaluate`, `-cn=evaluate`) named by its
    name now (config.config_name), which Hydra finds in configs/."""
    resolved = []
    for i, arg in enumerate(args):
        flag, equals, value = arg.partition("=")
        if equals and flag in CONFIG_NAME_FLAGS:
            arg = f"{flag}={config_name(value)}"
        elif i > 0 and args[i - 1] in CONFIG_NAME_FLAGS:
            arg = config_name(arg)
        resolved.append(arg)
    return resolved


def config_dirs_as_searchpath(args: list[str]) -> list[str]:
    """The command line with Hydra's `--config-dir X` (`-cd X`, `--config-dir=X`) given as the override
    `hydra.searchpath=[file:///abs/X]`, which Hydra reads the same way (a folder of the user's configs beside the
    packaged ones): the preflight and the experiment naming compose configs themselves and read overrides only. A
    command that also sets hydra.searchpath gets the folders joined into that one list."""
    dirs, rest, i = [], [], 0
    while i < len(args):
        flag, equals, value = args[i].partition("=")
        if flag in CONFIG_DIR_FLAGS and (equals or i + 1 < len(args)):
            dirs.append(value if equals else args[i + 1])
            i += 1 if equals else 2
            continue
        rest.append(args[i])
        i += 1
    if not dirs:
        return args
    if missing := [d for d in dirs if not Path(d).expanduser().is_dir()]:  # Hydra would refuse it; the searchpath not
        raise UserError(f"--config-dir {missing[0]} is no folder; give the folder that holds your config groups "
                        f"(experiment/, position/, ...)")
    folders = [f"file://{Path(d).expanduser().resolve()}" for d in dirs]
    given = [a for a in rest if a.lstrip("+").startswith("hydra.searchpath=")]
    if given:  # [a,b] or a one-item value: Hydra's grammar for a list of plain paths
        listed = given[-1].split("=", 1)[1].strip().removeprefix("[").removesuffix("]")
        folders = [f.strip().strip("'\"") for f in listed.split(",") if f.strip()] + folders
    rest = [a for a in rest if a not in given]
    overrides = command_overrides(rest)
    # beside the other overrides: argparse takes them as one run of arguments (after `--cfg job` it would refuse it)
    at = max((i + 1 for i, a in enumerate(rest) if a in overrides), default=0)
    return [*rest[:at], f"hydra.searchpath=[{','.join(folders)}]", *rest[at:]]


def options_of(group: str) -> list[str]:
    """The choices of a config group (configs/<group>/*.yaml)."""
    return sorted(p.stem for p in Path(CONFIG_DIR, group).glob("*.yaml"))


def null_group_choices(app: str, args: list[str]) -> list[str]:
    """The command line with `group=null` for a group the app may go without (its default is null: eval's
    extension=null, no method) given as Hydra's `~group`, which means the same; Hydra refuses a null choice with a
    traceback. For a group the app needs (train model=null), one line; so for an option of a group the app goes
    without and the command does not choose (eval extension.window=3, data.root=x: Hydra's AssertionError)."""
    defaults = OmegaConf.load(Path(CONFIG_DIR, f"{app}.yaml")).get("defaults") or []
    optional = {str(k) for entry in defaults if isinstance(entry, DictConfig) for k, v in entry.items() if v is None}
    needed = {str(k) for entry in defaults if isinstance(entry, DictConfig) for k, v in entry.items() if v is not None}
    groups = {p.name for p in Path(CONFIG_DIR).iterdir() if p.is_dir() and p.name != "hydra"}
    chosen = {a.lstrip("+").partition("=")[0] for a in args if "=" in a}
    resolved = []
    for arg in args:
        group, equals, value = arg.partition("=")
        head = group.lstrip("+").split(".")[0]
        if equals and "." in group and head in optional and head not in chosen:  # eval extension.window=3
            raise UserError(f"{group.lstrip('+')} sets an option of the chosen {head}, and none is chosen: choose one "
                            f"first, {head}=<one of {', '.join(options_of(head))}>")
        if equals and value == "null" and group in optional:
            arg = f"~{group}"
        elif equals and value == "null" and group in groups and group not in needed:
            raise UserError(not_a_group(group, app))
        elif equals and value == "null" and group in groups:
            raise UserError(f"{group}=null: alibi_lm.{app} needs a {group}; choose one of {', '.join(options_of(group))}")
        resolved.append(arg)
    return resolved


def main(app: str, task, check, rename=None) -> None:
    """`python -m alibi_lm.<app>`: preflight, then hydra.main running task(job, output_dir). rename(args) -> args
    may add overrides first (the train app: name= of a run that is not its experiment's, alibi_lm.naming)."""
    read_commit_at_start()  # first: the commit every row of this process names, however long it runs
    app = config_name(app)
    args = resolve_config_names(sys.argv[1:])
    sys.argv = [sys.argv[0], *args]  # as Hydra reads it
    if "--debug" in args:  # ours, not Hydra's: full tracebacks
        args.remove("--debug")
        os.environ["ALIBI_LM_DEBUG"] = "1"
        sys.argv = [sys.argv[0], *args]
    flush_denormals()  # the speed of ALiBi's long evaluations on CPU (alibi_lm.model.flush_denormals)
    # Ctrl-C (or a scheduler's signal) while the command line is checked: one line, nothing has been written yet
    with one_line_errors(app), raise_on_stop(app, "nothing was written yet; run the same command again"):
        args = null_group_choices(app, config_dirs_as_searchpath(args))
        sys.argv = [sys.argv[0], *args]
        if rename is not None and not any(a.split("=")[0] in NO_RENAME for a in args):
            args = rename(args)
            sys.argv = [sys.argv[0], *args]
        if not any(a.split("=")[0] in NO_PREFLIGHT for a in args):
            preflight(app, args, check)
    if "--help" in args or "-h" in args:
        skip_group_listings(Path(CONFIG_DIR, "hydra", "help", "alibi_lm.yaml").read_text())

    def job(cfg):
        hydra_cfg = HydraConfig.get()
        # rows name the cell's command, not the sweep's or a launcher's; with the user's config folders (--config-dir,
        # which Hydra files under its own overrides), so that it runs as written
        searchpath = [o for o in hydra_cfg.overrides.hydra if o.lstrip("+").startswith("hydra.searchpath=")]
        set_job_command(["python", "-m", f"alibi_lm.{app}", *searchpath, *hydra_cfg.overrides.task]
                        if hydra_cfg.mode == RunMode.MULTIRUN else [])
        with one_line_errors(app), raise_on_stop(app, RESUME_AFTER_STOP.get(app, RESUME_AFTER_STOP["eval"])):
            return task(to_job(cfg), Path(hydra_cfg.runtime.output_dir))

    register_schemas()  # schemes registered after alibi_lm.config was imported (a test's) too
    # What fails in Hydra outside the task (its own writes into the job folder: .hydra/, a full disk) is
    # printed by Hydra as a traceback and exit 1 unless HYDRA_FULL_ERROR makes it re-raise: then it gets one line
    global _reraise_set
    if _debug():
        os.environ["ALIBI_LM_DEBUG"] = "1"
    os.environ["HYDRA_FULL_ERROR"], _reraise_set = "1", True
    try:
        with one_line_errors(app):
            hydra.main(config_path=CONFIG_DIR, config_name=app, version_base="1.3")(job)()
    except BrokenPipeError:  # `--help | head`: the reader stopped reading; no traceback, and none at exit either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0 if any(a in NO_PREFLIGHT for a in args) else 1)  # a printout asked for, or a job cut short
