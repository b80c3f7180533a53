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
