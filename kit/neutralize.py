"""Make strings from files and bundles of other sites harmless where the kit shows or writes them.

A bundle or YAML file may hold any text: terminal escape sequences (erase a line, set the window
title, paint a false ``status ok``), line breaks that forge a line of a comment or a checksum
list, spreadsheet formulas. These helpers either refuse such text where it names something
(:func:`control_problem`) or escape it where it is only shown (:func:`terminal_safe`,
:func:`csv_safe`).
"""

import re

_CONTROL = re.compile(
    "[\x00-\x1f\x7f-\x9f\u2028\u2029\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]"
)
"""C0 and C1 controls (ESC, CR, LF, NUL, CSI...), the line and paragraph separators (which
``str.splitlines`` breaks at), and the invisible direction overrides that reorder a line."""

_CONTROL_KEEP_LINES = re.compile(_CONTROL.pattern.replace("\x00-\x1f", "\x00-\x08\x0b-\x1f"))
""":data:`_CONTROL` without tab and newline: for a whole multi-line text the kit laid out."""

CSV_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
"""A cell starting with one of these is a formula to a spreadsheet (OWASP CSV injection)."""


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def has_control(text: str) -> bool:
    """Whether ``text`` holds a control, line-separator or direction-override character."""
    return _CONTROL.search(text) is not None


def control_problem(text: str, what: str) -> str | None:
    """One line saying that ``text`` (naming ``what``) holds a control character, or None."""
    match = _CONTROL.search(text)
    if match is None:
        return None
    return (f"{what} holds the control character {_escape(match)} at position "
            f"{match.start()}: names and values may not hold line breaks or escapes")


def terminal_safe(text: str, keep_lines: bool = False) -> str:
    r"""``text`` with every control character written as an escape (``\x1b``, ``\u2028``).

    Args:
        text: Any string, e.g. a bundle's ``manifest.error``.
        keep_lines: Keep newlines and tabs (for a whole table the kit laid out itself).
    """
    return (_CONTROL_KEEP_LINES if keep_lines else _CONTROL).sub(_escape, text)


def csv_safe(cell: str) -> str:
    """A CSV cell a spreadsheet shows as text: one starting like a formula gets a ``'``."""
    return "'" + cell if cell.startswith(CSV_FORMULA_STARTS) else cell


_KIT_MARKDOWN_TAGS = re.compile(r'<br>|<a id="[\w.-]+"></a>')
"""The only HTML the kit's own Markdown holds: line breaks in table cells and anchors."""


def markdown_safe(text: str) -> str:
    """Markdown whose HTML is only the kit's own tags: every other ``& < >`` escaped.

    Bundle strings (workload names, errors, check messages) are laid out into the Markdown as
    they are, so a ``<script>`` or ``<img onerror>`` in one would run where the Markdown is
    rendered; escaping the whole text once keeps every path of it covered.
    """
    out, start = [], 0
    for match in _KIT_MARKDOWN_TAGS.finditer(text):
        out += [html_escape(text[start:match.start()]), match.group(0)]
        start = match.end()
    out.append(html_escape(text[start:]))
    return "".join(out)


def html_escape(text: str) -> str:
    """``& < >`` as entities (quotes are left: Markdown text is not an attribute)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def refuse_control(value: str) -> str:
    """A pydantic ``AfterValidator``: ``value`` unchanged, or ValueError if it holds a control."""
    problem = control_problem(value, "the value")
    if problem:
        raise ValueError(problem)
    return value
