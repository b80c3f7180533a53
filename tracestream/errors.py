"""The one exception type the library raises for bad input and refusals.

The CLI turns it into a single stderr line and exit code 2; a notebook gets the
same message as an exception.
"""


class TraceError(Exception):
    """Bad input or a refusal: the message says what and where; nothing was written."""

    def __init__(self, message: str = ""):
        # one line, whatever the values quoted in it contain (a pid, an id, a ts text)
        super().__init__(" ".join(str(message).splitlines()))


class VerificationFailed(Exception):
    """`verify` found differences; carries the list of failed checks."""

    def __init__(self, failures):
        super().__init__("; ".join(failures))
        self.failures = list(failures)


def require_utf8(text, what: str) -> None:
    """Refuse text that cannot be written as UTF-8 JSON (a non-UTF-8 byte in an option or a
    file name arrives as a lone surrogate): it would end in the report or the trace."""
    if not isinstance(text, str):
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise TraceError(
            f"{what} is not valid UTF-8 text (character {exc.start} of {text!a}); tracestream "
            "records it in JSON, which must be UTF-8"
        ) from None
