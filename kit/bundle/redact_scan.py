r"""Find and replace a pattern's matches in a large text, visiting only the lines that can hold one.

``bundle pack --redact`` runs some thirty patterns over every text of a bundle. A profiled run's
Kineto traces and host execution traces are megabytes of JSON each (two 10 MB host ETs and two
4 MB traces for a 2-rank CPU run), and a pattern searched over all of it costs 0.2-2 s; packing
that bundle took 22 s of CPU (2026-12-07, issue 40). Yet almost no line of a trace can hold a
match: each pattern comes with a :class:`Hint`, something every match contains on its first
line (a lower-case literal, or a cheap *witness* pattern), found with ``str.find`` or one fast
search, and the pattern itself runs only from those lines.

The result is exactly that of ``pattern.sub`` over the whole text: a match starts on a line its
hint finds, and one that can go on past its line (``KEY=\n value``) does so only through
whitespace, ``crossings`` times at most, so it ends within the next ``crossings`` lines that
are not blank. Matches are taken in order and never overlap, as ``re`` takes them.
"""

import re
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import accumulate

Replacement = str | Callable[[re.Match[str]], str]

LARGE = 1 << 16
"""Texts shorter than this are searched whole: a JSON string or a log, where the lines are
not worth finding."""


@dataclass(frozen=True)
class Hint:
    """What every match of a pattern holds on the line where it starts.

    Attributes:
        literals: Lower-case strings, one of which the lower-cased match contains.
        witness: A pattern with a match inside every match (searched case as is).
        crossings: How many line breaks a match can cross, each through whitespace alone.
    """

    literals: tuple[str, ...] = ()
    witness: re.Pattern[str] | None = None
    crossings: int = 0


def _line_starts(text: str) -> list[int]:
    return list(accumulate((len(line) + 1 for line in text.split("\n")[:-1]), initial=0))


class LinedText:
    """A text being redacted, its lower-case form, and where each of their lines starts."""

    def __init__(self, text: str) -> None:
        self._set(text)

    def _set(self, text: str) -> None:
        self.text = text
        self.low = text.lower()  # never adds or drops a line break: line i is line i of both
        self._starts: list[int] | None = None
        self._low_starts: list[int] | None = None

    @property
    def starts(self) -> list[int]:
        """Where each line of the text starts."""
        if self._starts is None:
            self._starts = _line_starts(self.text)
        return self._starts

    @property
    def low_starts(self) -> list[int]:
        """Where each line of the lower-case text starts."""
        if self._low_starts is None:
            self._low_starts = _line_starts(self.low)
        return self._low_starts

    def may_hold(self, hint: Hint | None) -> bool:
        """Whether a match is possible at all (the hint's literals or witness, where it has
        literals: a witness alone is searched from line to line)."""
        if hint is None or not hint.literals or any(n in self.low for n in hint.literals):
            return True
        return hint.witness is not None and hint.witness.search(self.text) is not None

    def _lines_holding(self, hint: Hint) -> list[int]:
        """The lines where the hint is found, in order."""
        found: set[int] = set()
        for literal in hint.literals:
            starts, pos = self.low_starts, self.low.find(literal)
            while pos >= 0:
                line = bisect_right(starts, pos) - 1
                found.add(line)
                if line + 1 == len(starts):
                    break
                pos = self.low.find(literal, starts[line + 1])
        if hint.witness is not None:
            found.update(bisect_right(self.starts, m.start()) - 1
                         for m in hint.witness.finditer(self.text))
        return sorted(found)

    def _line_end(self, line: int) -> int:
        """Where line ``line`` of the text ends (its line break, or the text's end)."""
        starts = self.starts
        return starts[line + 1] - 1 if line + 1 < len(starts) else len(self.text)

    def _reach(self, line: int, crossings: int) -> int:
        """The end of the furthest line a match starting on ``line`` can reach."""
        last = len(self.starts) - 1
        for _ in range(crossings):
            if line == last:
                break
            line += 1
            while line < last and not self.text[self.starts[line]:self._line_end(line)].strip():
                line += 1
        return self._line_end(line)

    def finditer(self, pattern: re.Pattern[str],
                 hint: Hint | None) -> Iterator[tuple[int, int, re.Match[str]]]:
        """``pattern.finditer(text)``, searched only from the lines the hint finds: each
        match with where it starts and ends in the text."""
        if hint is None or len(self.text) < LARGE:
            if self.may_hold(hint):
                yield from ((m.start(), m.end(), m) for m in pattern.finditer(self.text))
            return
        lines = self._lines_holding(hint)
        if hint.crossings == 0:  # the lines alone, searched at once
            yield from self._in_lines(pattern, lines)
            return
        done = 0  # where the last match ended
        for line in lines:
            pos, end = max(self.starts[line], done), self._line_end(line)
            reach = self._reach(line, hint.crossings)
            while pos <= end:
                m = pattern.search(self.text, pos, reach)
                if m is None or m.start() > end:
                    break
                yield m.start(), m.end(), m
                done = pos = m.end() if m.end() > m.start() else m.end() + 1

    def _in_lines(self, pattern: re.Pattern[str],
                  lines: list[int]) -> Iterator[tuple[int, int, re.Match[str]]]:
        """Matches of a pattern that cannot cross a line break, on the given lines: searched
        in those lines joined by line breaks, which its lookarounds see as they do here."""
        texts = [self.text[self.starts[i]:self._line_end(i)] for i in lines]
        offsets = [0]
        for t in texts:
            offsets.append(offsets[-1] + len(t) + 1)
        for m in pattern.finditer("\n".join(texts)):
            k = bisect_right(offsets, m.start()) - 1
            shift = self.starts[lines[k]] - offsets[k]
            yield m.start() + shift, m.end() + shift, m

    def subn(self, pattern: re.Pattern[str], hint: Hint | None, repl: Replacement) -> int:
        """Replace as ``pattern.subn`` would (the text and its lower case follow); the count."""
        if hint is None or len(self.text) < LARGE:
            if not self.may_hold(hint):
                return 0
            text, count = pattern.subn(repl, self.text)
        else:
            parts, last, count = [], 0, 0
            for start, end, m in list(self.finditer(pattern, hint)):
                parts += [self.text[last:start], repl(m) if callable(repl) else m.expand(repl)]
                last, count = end, count + 1
            text = "".join([*parts, self.text[last:]])
        if count:
            self._set(text)
        return count
