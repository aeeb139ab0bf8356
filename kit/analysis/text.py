"""Text for people: shorten a message without cutting a word in half."""

ELLIPSIS = "..."
"""Marks text left out; ASCII, so any terminal, CSV reader or log prints it."""


def shorten(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, cut at a word boundary and ending in ``...``.

    A cut mid-word reads as a different word (``connection refu``) or hides the useful end of a
    path. When the text has no space in the second half of its first ``width`` characters (one
    long path or token), it is cut there anyway rather than dropping nearly all of it.
    """
    if len(text) <= width:
        return text
    room = text[:width - len(ELLIPSIS) + 1]  # one more: is the cut right before a space?
    cut = room.rfind(" ")
    if cut < width // 2:
        cut = width - len(ELLIPSIS)
    return text[:cut].rstrip() + ELLIPSIS
