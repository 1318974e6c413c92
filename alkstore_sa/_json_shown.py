"""Payloads as JSON text for people (the dashboard's pages, ``alkstore dead show``).
Internal.

A payload may be nested as deeply as ``json.dumps`` can encode it (SPEC §5). Showing it
must not need more recursion depth than accepting it did: it is encoded compact by the
same C encoder, on a fresh stack (``full_depth``), and indented afterwards by a loop over
that text. ``json.dumps(indent=...)`` would take the pure-Python encoder, whose budget is
not the C encoder's (one more frame per level on some Pythons, another limit on others),
and a document around the payload (a job's fields, a list of jobs) would add its own
levels: it is encoded apart and the payload's text spliced into it.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

from ._validate import full_depth

# compact JSON (no whitespace outside strings) in tokens: a whole string, an empty
# container, one structural character, or a run of a scalar (number, true, false, null)
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\{\}|\[\]|[{}\[\],:]|[^"{}\[\],:]+', re.DOTALL)


# Made once, and called as the enqueue path calls its own (_validate._dumps): the encoder's
# encode() straight on the fresh stack, so showing a payload takes exactly the frames that
# accepting it took (json.dumps would add one, and the deepest payload accepted would fail)
_ENCODERS = {
    (ascii, keys): json.JSONEncoder(ensure_ascii=ascii, sort_keys=keys, separators=(",", ":"))
    for ascii in (False, True)
    for keys in (False, True)
}


def compact(value: Any, *, ensure_ascii: bool = True, sort_keys: bool = False) -> str:
    """``value`` as compact JSON text (``","`` and ``":"`` separators)."""
    return full_depth(_ENCODERS[ensure_ascii, sort_keys].encode, value)


def indented(text: str, indent: int = 2) -> str:
    """Compact JSON text laid out as ``json.dumps(..., indent=indent)`` lays it out, at
    any depth (a loop, no recursion)."""
    laid_out = indented_within(text, None, indent)
    assert laid_out is not None  # no limit
    return laid_out


def indented_within(text: str, limit: int | None, indent: int = 2) -> str | None:
    """``indented``, or None once the result would be longer than ``limit``: each line
    is indented as deep as it is nested, so a small, deeply nested payload can lay out
    thousands of times larger."""
    out: list[str] = []
    size = 0
    level = 0
    pad = " " * indent
    for m in _TOKEN.finditer(text):
        token = m.group()
        if token in ("{", "["):
            level += 1
            piece = token + "\n" + pad * level
        elif token in ("}", "]"):
            level -= 1
            piece = "\n" + pad * level + token
        elif token == ",":
            piece = ",\n" + pad * level
        elif token == ":":
            piece = ": "
        else:
            piece = token
        size += len(piece)
        if limit is not None and size > limit:
            return None
        out.append(piece)
    return "".join(out)


def with_payloads(document: Any, payloads: dict[str, Any], *, ensure_ascii: bool = True) -> str:
    """``document`` as compact JSON, where each string value that is a key of
    ``payloads`` (see ``hole``) is replaced by that payload's own compact text."""
    text = compact(document, ensure_ascii=ensure_ascii)
    for key, payload in payloads.items():
        text = text.replace(json.dumps(key), compact(payload, ensure_ascii=ensure_ascii), 1)
    return text


# a whole string (kept as it is), or a number JSON has no form for, as json.dumps writes it
_NON_FINITE = re.compile(r'"(?:[^"\\]|\\.)*"|-?Infinity|NaN', re.DOTALL)


def strict(text: str) -> str:
    """JSON text from ``json.dumps`` as strict JSON: each ``NaN``, ``Infinity`` and
    ``-Infinity`` it wrote (only a row written by hand holds one: a float column, a payload)
    becomes that word as a string, which ``float()`` reads back. A strict parser (a
    browser's ``JSON.parse``, ``jq``) refuses the bare words, and the whole document with
    them. A loop over the text, so any depth goes. Text holding neither word anywhere (the
    usual case) is returned as it is, without the loop (about 70 ms per MiB)."""
    if "NaN" not in text and "Infinity" not in text:
        return text
    return _NON_FINITE.sub(lambda m: m[0] if m[0][0] == '"' else f'"{m[0]}"', text)


def hole() -> str:
    """A string no document holds by chance, to stand for a payload in ``with_payloads``."""
    return f"alkstore-payload-{secrets.token_hex(16)}"
