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

    def __reduce__(self):
        # a copy made by pickling (a Prefect state, a process pool's result) keeps the message only
        r = super().__reduce__()
        if len(r) > 2 and isinstance(r[2], dict) and r[2].get("operator_detail") is not None:
            r = (r[0], r[1], {**r[2], "operator_detail": None}, *r[3:])
        return r
