"""Make strings from files and bundles of other sites harmless where the kit shows or writes them.

A bundle or YAML file may hold any text: terminal escape sequences (erase a line, set the window
title, paint a false ``status ok``), line breaks that forge a line of a comment or a checksum
list, spreadsheet formulas, Markdown links and images. These helpers either refuse such text
where it names something (:func:`control_problem`) or escape it where it is only shown: one
line of a terminal (:func:`terminal_safe`), a table's cells (:func:`safe_table`), a bundle's
data before compare and report lay it out (:func:`neutral_data`), a CSV cell (:func:`csv_safe`),
a Markdown document (:func:`markdown_text` for a bundle's words, :func:`markdown_safe` for the
whole).
"""

import re
from collections.abc import Iterable, Sequence
from typing import Any

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


def cells_safe(rows: Iterable[Sequence[Any]]) -> list[list[Any]]:
    r"""Table rows whose text cells each stay on one line of one cell: every control character,
    newline and tab included, written as an escape (``\x0a``); numbers are left to the table.

    A newline in a cell would start a line of its own: a workload name could forge a row or a
    line of the comparability section.
    """
    return [[terminal_safe(c) if isinstance(c, str) else c for c in row] for row in rows]


def safe_table(rows: Iterable[Sequence[Any]], headers: Sequence[str] = (),
               tablefmt: str = "simple", **kwargs: Any) -> str:
    """``tabulate``'s table of ``rows`` with their text cells through :func:`cells_safe`; in a
    Markdown (``github``) table a ``|`` in a cell or header is escaped too, so that it cannot
    split a cell in two. Headers keep their line breaks (the kit wraps its own)."""
    from tabulate import tabulate

    cells = cells_safe(rows)
    if tablefmt == "github":
        cells = [[c.replace("|", "\\|") if isinstance(c, str) else c for c in row]
                 for row in cells]
        headers = [h.replace("|", "\\|") for h in headers]
    return tabulate(cells, headers=list(headers), tablefmt=tablefmt, **kwargs)


_MARKDOWN_MARKS = re.compile(r"([\\`*\[\]~])")
"""What makes Markdown of plain words: escapes, code, emphasis, links and images, strikes."""


def markdown_text(text: str) -> str:
    r"""``text`` as words in Markdown: ``\ ` * [ ] ~`` each escaped with a backslash.

    ``&``, ``<`` and ``>`` are left to :func:`markdown_safe`, which escapes them in the whole
    document; a ``|`` to :func:`safe_table`, since it only splits a table's cells.
    """
    return _MARKDOWN_MARKS.sub(r"\\\1", text)


def neutral_data(value: Any, markdown: bool = False) -> Any:
    """JSON data (a bundle's manifest or metrics) with every string, keys included, passed
    through :func:`terminal_safe`: what compare and report lay out is then one line each.

    Args:
        value: The data.
        markdown: Also pass every string value (not the keys, which the kit looks metrics up
            by) through :func:`markdown_text`, for a Markdown output.
    """
    if isinstance(value, str):
        return markdown_text(terminal_safe(value)) if markdown else terminal_safe(value)
    if isinstance(value, dict):
        return {terminal_safe(k): neutral_data(v, markdown) for k, v in value.items()}
    if isinstance(value, list):
        return [neutral_data(v, markdown) for v in value]
    return value


def csv_safe(cell: str) -> str:
    """A CSV cell a spreadsheet shows as text, on one line: controls escaped, and one starting
    like a formula gets a ``'``."""
    cell = terminal_safe(cell)
    return "'" + cell if cell.startswith(CSV_FORMULA_STARTS) else cell


_KIT_MARKDOWN_TAGS = re.compile(r'<br>|<a id="[\w.-]+"></a>')
"""The only HTML the kit's own Markdown holds: line breaks in table cells and anchors."""


_MARKDOWN_LINK = re.compile(r"(?<!\\)((?:\\\\)*)(!?)\[([^\]\n]*)\]\(([^)\n]*)\)")
"""An inline link ``[text](target)`` or image ``![alt](target)`` whose ``[`` is not escaped
(after an even number of backslashes); a target's own parentheses end it early: what is left
of it is then text."""
_MARKDOWN_DEFINITION = re.compile(r"^ {0,3}\[[^\]\n]+\]:[ \t]*(\S+).*$", re.MULTILINE)
"""A link reference definition, ``[id]: target``, which ``[text][id]`` links to."""
_WEB = re.compile(r"https?://", re.IGNORECASE)


def _target(raw: str) -> str:
    """A link's destination as a browser gets it: no ``<>``, title or backslash escapes."""
    target = raw.strip().split(maxsplit=1)[0] if raw.strip() else ""
    return target.strip("<>").replace("\\", "")


def _link_allowed(target: str, image: bool) -> bool:
    """The kit's own targets (``#anchor``, ``x_figures/y.png``: no scheme, so no ``:``) and,
    for a link, an http(s) address; never a remote image (it tells the sender who read the
    page), nor ``javascript:``, ``data:``, ``file:`` and the like."""
    local = ":" not in target and not target.startswith("//")
    return local or (not image and _WEB.match(target) is not None)


def _link(match: re.Match[str]) -> str:
    slashes, image, text, raw = match.groups()
    if _link_allowed(_target(raw), bool(image)):
        return match.group(0)
    return slashes + ("" if image else text)


def _definition(match: re.Match[str]) -> str:
    return match.group(0) if _link_allowed(_target(match.group(1)), image=False) else ""


def markdown_safe(text: str) -> str:
    """Markdown whose HTML is only the kit's own tags and whose links and images are only the
    kit's own or web links: every other ``& < >`` escaped, control characters other than the
    line breaks and tabs of the layout written as escapes, remote images dropped, and links
    to anything but an http(s) address or a place in the report reduced to their text.

    Bundle strings (workload names, errors, check messages) are laid out into the Markdown as
    they are, so a ``<script>`` or ``<img onerror>`` in one would run where the Markdown is
    rendered, a ``[x](javascript:...)`` would run when clicked and a remote image would tell
    its sender who read the report; neutralizing the whole text once keeps every path of it
    covered. (Line breaks and Markdown marks inside bundle strings are escaped before they are
    laid out, by :func:`neutral_data`, so none starts a heading, a list, emphasis or code.)
    """
    text = terminal_safe(text, keep_lines=True)
    out, start = [], 0
    for match in _KIT_MARKDOWN_TAGS.finditer(text):
        out += [html_escape(text[start:match.start()]), match.group(0)]
        start = match.end()
    out.append(html_escape(text[start:]))
    return _MARKDOWN_DEFINITION.sub(_definition, _MARKDOWN_LINK.sub(_link, "".join(out)))


def html_escape(text: str) -> str:
    """``& < >`` as entities (quotes are left: Markdown text is not an attribute)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def refuse_control(value: str) -> str:
    """A pydantic ``AfterValidator``: ``value`` unchanged, or ValueError if it holds a control."""
    problem = control_problem(value, "the value")
    if problem:
        raise ValueError(problem)
    return value
