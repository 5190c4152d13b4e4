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
import shutil
import sys
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException, MissingConfigException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError
from tqdm import tqdm

from .checkpoint import underlying_os_error
from .config import CONFIG_DIR, compose, config_name, register_schemas, to_job
from .errors import UserError, allowed_range, check_range, write_error
from .model import flush_denormals
from .provenance import read_commit_at_start
from .stopping import raise_on_stop

# Write failures that are the environment's, not a bug: reported in one line like a UserError.
WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR}
RESUME_AFTER_STOP = ("every finished checkpoint and results row is kept, and the same command continues "
                     "(train.resume=auto, eval.skip_done=true)")
NO_PREFLIGHT = ("-h", "--help", "--hydra-help", "--info", "-i", "--cfg", "-c", "--resolve", "--shell-completion")
NO_RENAME = ("-h", "--help", "--hydra-help", "--info", "-i", "--shell-completion")  # --cfg job shows the name it would run
CONFIG_NAME_FLAGS = ("--config-name", "-cn")  # Hydra's flags that name the config to run instead of the app's


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


def describe(e: Exception) -> str:
    """One line for an error that composing a config raised (Hydra's, or OmegaConf's under it)."""
    if isinstance(e, MissingConfigException) and e.options is not None and e.missing_cfg_file:
        group, _, option = e.missing_cfg_file.rpartition("/")
        return f"unknown {group} {option!r}; {did_you_mean(option, e.options)}choose one of {', '.join(sorted(e.options))}"
    if isinstance(e, MissingConfigException) and str(e).startswith("Cannot find primary config"):  # --config-name x
        apps = sorted(p.stem for p in Path(CONFIG_DIR).glob("*.yaml"))
        return (f"unknown config {e.missing_cfg_file!r} (--config-name); {did_you_mean(e.missing_cfg_file, apps)}choose "
                f"one of {', '.join(apps)}, or leave the flag out to run the app's own")
    cause = e
    while cause is not None and not isinstance(cause, OmegaConfBaseException):
        cause = cause.__cause__
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and cause.full_key:
        key = cause.full_key
        return (f"unknown config key {key!r} (misspelled?); {did_you_mean(key, sibling_keys(cause))}`--cfg job` prints "
                f"the valid keys, `+{key}=...` adds a new one")
    if isinstance(cause, ValidationError) and cause.full_key:  # msg's later lines repeat the key and name classes
        return f"{cause.full_key}: {cause.msg.strip().splitlines()[0]}; give {cause.full_key} a value of that type"
    return str(e).strip().splitlines()[0]


@contextlib.contextmanager
def one_line_errors():
    """A UserError, a failed write or a bad config becomes `error: <one line>` and an exit."""
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
            fail(describe(e))
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
    for cell in sweep_cells(overrides) if multirun else [overrides]:
        cfg = compose(app, cell)
        check_booleans(cfg, cell)
        if multirun:
            check_launcher(cfg)
        check(to_job(cfg), output_dir(cfg, multirun))


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
    with one_line_errors(), raise_on_stop(app, "nothing was written yet; run the same command again"):
        if rename is not None and not any(a.split("=")[0] in NO_RENAME for a in args):
            args = rename(args)
            sys.argv = [sys.argv[0], *args]
        if not any(a.split("=")[0] in NO_PREFLIGHT for a in args):
            preflight(app, args, check)
    if "--help" in args or "-h" in args:
        skip_group_listings(Path(CONFIG_DIR, "hydra", "help", "alibi_lm.yaml").read_text())

    def job(cfg):
        with one_line_errors(), raise_on_stop(app, RESUME_AFTER_STOP):
            return task(to_job(cfg), Path(HydraConfig.get().runtime.output_dir))

    register_schemas()  # schemes registered after alibi_lm.config was imported (a test's) too
    # What fails in Hydra outside the task (its own writes into the job folder: .hydra/, a full disk) is
    # printed by Hydra as a traceback and exit 1 unless HYDRA_FULL_ERROR makes it re-raise: then it gets one line
    global _reraise_set
    if _debug():
        os.environ["ALIBI_LM_DEBUG"] = "1"
    os.environ["HYDRA_FULL_ERROR"], _reraise_set = "1", True
    with one_line_errors():
        hydra.main(config_path=CONFIG_DIR, config_name=app, version_base="1.3")(job)()
