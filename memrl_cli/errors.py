"""The one exception type for problems a user can fix (bad input, missing data, wrong bank)."""


class MemrlError(Exception):
    """A user-facing error: its message is one line that says what is wrong and how to fix it.

    The CLI prints it on stderr (or as a JSON error with `--json`) and exits non-zero,
    without a traceback. Anything else escaping the library is a bug.
    """

    exit_code = 1


class BankBusyError(MemrlError):
    """The bank stayed locked by another writer for longer than the busy timeout."""

    exit_code = 3


def error_object(exc: MemrlError) -> dict[str, dict[str, str]]:
    """The JSON form of an error, as `--json` prints it and the servers answer it: {"error": {"type", "message"}}."""
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return {"error": {"type": type(exc).__name__, "message": message}}
