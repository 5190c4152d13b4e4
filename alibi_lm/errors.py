"""User-facing errors: one line that names the bad key or file and how to fix it (alibi_lm.cli prints
it as `error: <message>` and exits with its exit_status)."""

import argparse
import errno
import math


class UserError(Exception):
    """Bad input from the user: a config, a path, a checkpoint. The message is one line."""

    exit_status = 2


class ConfigError(UserError, ValueError):
    """A config value that cannot work, raised where the value is defined (a config dataclass's
    __post_init__, a scheme's options): composing a config is the check."""


class TrainingDiverged(UserError):
    """The loss became NaN or inf: training stopped, the last good checkpoint is kept."""

    exit_status = 3


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser for the scripts and `python -m alibi_lm.<tool>` commands, with a bad flag or value reported
    as every other bad input is: one line and exit status 2 (argparse's own prints its usage block first)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}; `--help` lists the options\n")


def check_choice(key: str, value, allowed) -> None:
    if value not in allowed:
        choices = ", ".join(str(a).lower() if isinstance(a, bool) else str(a) for a in allowed)  # as YAML spells them
        raise ConfigError(f"{key} must be one of {choices}, got {value!r}")


def allowed_range(low=None, high=None, low_open: bool = False, high_open: bool = False) -> str:
    """A range in words as the messages give it: ">= 1", "> 0", "<= 1", "in [0, 1)"."""
    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {low}"
    return f"{'<' if high_open else '<='} {high}"


def check_range(key: str, value, low=None, high=None, low_open: bool = False, high_open: bool = False) -> None:
    """A number (None: not set, always allowed) within its range, else a ConfigError naming the key, the value and
    the allowed range. NaN and the infinities are outside every range (no setting is infinite: an unbounded one is
    None)."""
    if value is None or isinstance(value, bool):
        return
    inside = value == value and value not in (math.inf, -math.inf)  # not NaN, finite
    if low is not None:
        inside = inside and (value > low if low_open else value >= low)
    if high is not None:
        inside = inside and (value < high if high_open else value <= high)
    if not inside:
        finite = "" if value == value and value not in (math.inf, -math.inf) else "a finite number "
        raise ConfigError(f"{key} must be {finite}{allowed_range(low, high, low_open, high_open)}, got {value!r}")


def check_name(key: str, value) -> None:
    """A value that becomes a folder name (name=, a results folder's name) is one path component: no separator,
    not `.` or `..`, not empty; else a ConfigError."""
    text = str(value)
    bad = (not text or text in (".", "..") or "/" in text or "\\" in text or "\0" in text)
    if bad:
        raise ConfigError(f"{key}={text!r} is not a folder name: it must be one path component (no '/', '\\', '..' "
                          f"or absolute path), since runs go to paths.runs/<name>/ and results to paths.results/<name>/; "
                          f"set paths.runs= or paths.results= to write elsewhere")


FILE_FOR_FOLDER = "a file stands where a folder of the output should be: move it away"  # EEXIST from mkdir, ENOTDIR


def write_error(path, e: OSError) -> UserError:
    """A failed write (disk full, file size limit, no permission, read-only disk) as one line: the file, the
    reason, a fix."""
    reason = e.strerror or str(e) or type(e).__name__
    fix = {errno.ENOSPC: "free some space", errno.EDQUOT: "free some space or raise the quota",
           errno.EFBIG: "raise the file size limit (ulimit -f)", errno.EROFS: "remount the disk writable",
           errno.EEXIST: FILE_FOR_FOLDER, errno.ENOTDIR: FILE_FOR_FOLDER,
           errno.EISDIR: "a folder stands where the output file should be: move it away"}
    return UserError(f"cannot write {path} ({reason}); {fix.get(e.errno, 'fix the folder permissions')}, or write "
                     f"elsewhere: paths.runs=..., paths.results=..., paths.cache=...")
