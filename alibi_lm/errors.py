"""User-facing errors: one line that names the bad key or file and how to fix it.

The command-line apps catch UserError, print `error: <message>` to stderr and exit with status 2
(no traceback unless HYDRA_FULL_ERROR=1 or ALIBI_LM_DEBUG=1).
"""


class UserError(Exception):
    """Bad input from the user: a config, a path, a checkpoint. The message is one line."""
