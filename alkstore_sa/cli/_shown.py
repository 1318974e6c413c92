"""Values shown on the operator's terminal, made inert.

What the human-readable output prints comes from the database or from other people —
queue and worker names, a handler's exception message as a dead job's ``last_error``,
schedule names. Printed raw, a control character in one is obeyed by the terminal: ESC
sequences clear the screen or recolour it, ``\\r`` and ``\\n`` forge lines, ``\\t`` a
column. ``shown()`` escapes each such character visibly, as Python writes it (``\\x1b``,
``\\n``, ``\\u202e``), and leaves every other character alone, so ordinary values print as
they are (a backslash is not doubled: this is for reading, ``--json`` is the exact form).
Every table and line the commands print goes through it, and so do the one-line error and
the log lines on stderr (``ShownFormatter``).
"""

from __future__ import annotations

import logging
import re
import sys
import unicodedata

# C0 and DEL, C1; then the Unicode characters that reorder or break displayed text: the
# bidirectional marks, embeddings, overrides and isolates ("Trojan Source"), and the line
# and paragraph separators
_ACTING = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    ch = match.group()
    code = ord(ch)
    return _SHORT.get(ch) or (f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}")


def shown(value: object) -> str:
    """``str(value)`` with every character a terminal would act on escaped. An escape is
    plain ASCII, as wide on the terminal as it is long, so a table padded by ``width`` of
    the shown text stays aligned."""
    return _ACTING.sub(_escape, str(value))


def _columns(ch: str) -> int:
    """How many terminal columns one character takes: none for a combining mark (it goes
    on the character before it) or an invisible format character (a zero-width joiner or
    space; the soft hyphen is shown), two for an East Asian wide or fullwidth character
    (CJK, kana, most emoji), one for everything else."""
    if unicodedata.combining(ch) or unicodedata.category(ch) in ("Mn", "Me") or (
        unicodedata.category(ch) == "Cf" and ch != "\xad"
    ):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def width(text: str) -> int:
    """How many columns ``text`` (a ``shown()`` value: no control characters) takes on a
    terminal, which is what a table is aligned by: ``len`` counts a wide character as one
    column and a combining accent as one more."""
    return sum(_columns(ch) for ch in text)


def as_written(text: str, stream: object = None) -> str:
    """``text`` as ``stream`` (default: stdout) writes it: a character its encoding lacks
    becomes what its error handler makes of it — a backslash escape (``\\u6ce8``, six
    columns where the character takes two) by default (``cli._lenient_stdout``), ``?`` under
    ``replace``. A table measures and pads this, so it stays aligned on such a terminal."""
    stream = sys.stdout if stream is None else stream
    encoding = getattr(stream, "encoding", None) or "utf-8"
    errors = getattr(stream, "errors", None) or "strict"
    try:
        return text.encode(encoding, errors).decode(encoding, "replace")
    except (UnicodeError, LookupError):  # 'strict' (the write would fail the same way), or no codec
        return text


def padded(text: str, columns: int, *, left: bool) -> str:
    """``text`` padded with spaces to ``columns`` terminal columns, on the right
    (``left=True``: the text reads from the column's left edge) or on the left."""
    fill = " " * max(columns - width(text), 0)
    return text + fill if left else fill + text


def shown_lines(text: str) -> str:
    """Multi-line text (a traceback) kept one line per ``\\n``, everything else escaped."""
    return "\n".join(shown(line) for line in text.split("\n"))


class ShownFormatter(logging.Formatter):
    """The CLI's log lines on stderr: the message escaped as one line (a worker logs its
    handlers' exception messages), the traceback below it escaped but for its line breaks.
    A newline inside an exception's message stays a line break there: in formatted text it
    cannot be told from the traceback's own (ESC, ``\r``, tabs are escaped all the same)."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        return shown(super().formatMessage(record))

    def formatException(self, ei: logging._SysExcInfoType) -> str:  # noqa: N802 - logging's name
        return shown_lines(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:  # noqa: N802 - logging's name
        return shown_lines(super().formatStack(stack_info))


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def stderr_handler() -> logging.Handler:
    """The log handler of the worker commands (``alkstore worker``, ``flask alkstore
    worker``): lines on stderr, escaped by ``ShownFormatter``."""
    handler = logging.StreamHandler()
    handler.setFormatter(ShownFormatter(LOG_FORMAT))
    return handler
