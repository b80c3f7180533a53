"""The one exception type the library raises for bad input and refusals.

The CLI turns it into a single stderr line and exit code 2; a notebook gets the
same message as an exception.
"""

import re
import shlex


def one_line(text) -> str:
    """`text` on one line (a message is one stderr line, whatever values are quoted in it)."""
    return " ".join(str(text).splitlines())


class TraceError(Exception):
    """Bad input or a refusal: the message says what and where; nothing was written."""

    def __init__(self, message: str = ""):
        # one line, whatever the values quoted in it contain (a pid, an id, a ts text)
        super().__init__(one_line(message))


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


_NO_VALUE = object()

_FLAGS = {"max_lanes": "--max-gpu-lanes"}
"""Spec fields whose command-line flag is not the field with dashes."""


def flag_of(field: str) -> str:
    """The command-line flag of a spec field: `num_layers` -> `--num-layers`."""
    return _FLAGS.get(field, "--" + field.replace("_", "-"))


class Option:
    """A spec field named in a refusal, optionally with a value to set it to.

    The library writes it as the field (`num_layers`, `anchor_offset=0`); the CLI
    writes the same message with its flags (`--num-layers`, `--anchor-offset 0`).
    """

    def __init__(self, field: str, value=_NO_VALUE):
        self.field = field
        self.value = value

    def text(self, name_of=None) -> str:
        """`field`/`field=value`, or with `name_of(field)` its flag: `--flag`/`--flag value`
        (shell-quoted; a true value is the flag alone)."""
        if name_of is None:
            return self.field if self.value is _NO_VALUE else f"{self.field}={self.value!r}"
        flag = name_of(self.field)
        if self.value is _NO_VALUE or self.value is True:
            return flag
        return f"{flag} {shlex.quote(str(self.value))}"


class SpecError(TraceError):
    """A refusal that names the options to change: its parts are text and `Option`s.

    `str()` names spec fields (the library, batch manifests); `render(flag_of)`
    names whatever `flag_of(field)` gives (the command line's flags).
    """

    def __init__(self, *parts):
        self.parts = parts
        super().__init__(self.render())

    def render(self, name_of=None) -> str:
        text = "".join(p.text(name_of) if isinstance(p, Option) else str(p) for p in self.parts)
        return one_line(text)


def malformed_report(why: str) -> TraceError:
    """The one refusal of a report that was edited or damaged (restore, verify, its rows)."""
    return TraceError(f"the report is incomplete or malformed ({why})")


def compile_pattern(pattern: str, field: str) -> re.Pattern:
    """The compiled pattern, or a refusal naming its spec field (e.g. `anchor_regex`)."""
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise SpecError(Option(field), f" {pattern!r} is not a valid regular expression: {exc}"
                        ) from None
