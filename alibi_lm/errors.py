"""User-facing errors: one line that names the bad key or file and how to fix it (alibi_lm.cli prints
it as `error: <message>` and exits with its exit_status)."""

import errno


class UserError(Exception):
    """Bad input from the user: a config, a path, a checkpoint. The message is one line."""

    exit_status = 2


class ConfigError(UserError, ValueError):
    """A config value that cannot work, raised where the value is defined (a config dataclass's
    __post_init__, a scheme's options): composing a config is the check."""


class TrainingDiverged(UserError):
    """The loss became NaN or inf: training stopped, the last good checkpoint is kept."""

    exit_status = 3


def check_choice(key: str, value, allowed) -> None:
    if value not in allowed:
        choices = ", ".join(str(a).lower() if isinstance(a, bool) else str(a) for a in allowed)  # as YAML spells them
        raise ConfigError(f"{key} must be one of {choices}, got {value!r}")


def write_error(path, e: OSError) -> UserError:
    """A failed write (disk full, file size limit, no permission, read-only disk) as one line: the file, the
    reason, a fix."""
    reason = e.strerror or str(e) or type(e).__name__
    fix = {errno.ENOSPC: "free some space", errno.EDQUOT: "free some space or raise the quota",
           errno.EFBIG: "raise the file size limit (ulimit -f)", errno.EROFS: "remount the disk writable"}
    return UserError(f"cannot write {path} ({reason}); {fix.get(e.errno, 'fix the folder permissions')}, or write "
                     f"elsewhere: paths.runs=..., paths.results=..., paths.cache=...")
