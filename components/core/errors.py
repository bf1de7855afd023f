"""User-facing errors.

A `VeilError` is bad input or a bad request: the CLI prints its message as one line and exits 2.
Anything else escaping is a bug and keeps its traceback.
"""


class VeilError(Exception):
    """Bad input, named plainly: what is wrong and where (file, line, field)."""

    exit_code = 2

    def __init__(self, message: str):
        # One line, always: a multi-line message would read like a traceback.
        super().__init__(" ".join(str(message).split()))
