"""User-facing errors.

A `VeilError` is bad input or a bad request: the CLI prints its message as one line and exits 2.
Anything else escaping is a bug and keeps its traceback.
"""


class VeilError(Exception):
    """Bad input, named plainly: what is wrong and where (file, line, field)."""

    exit_code = 2

    def __init__(self, message: str, *, operator_detail: str | None = None):
        # One line, always: a multi-line message would read like a traceback.
        super().__init__(" ".join(str(message).split()))
        # What only the operator may read (person ids, names): the CLI prints it on their terminal
        # after the message; str(e) — what Prefect logs and callers record — never holds it, and a
        # pickled copy (a Prefect state) drops it.
        self.operator_detail = None if operator_detail is None else " ".join(str(operator_detail).split())
