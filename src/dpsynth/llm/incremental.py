"""The part of a completion still being generated that can be streamed already.

A streamed chunk cannot be taken back, so text is sent only once no later token can change it:
:class:`IncrementalText` holds back a tail that may be the start of a stop string (the final
text is cut before a stop), a trailing U+FFFD (a character whose bytes are not all decoded
yet) and, for a chat reply (stripped at both ends), leading and trailing whitespace. The parts
it returns therefore add up to a prefix of the final text; the server sends the rest when the
completion ends.
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import apply_stops


def stop_prefix_len(text: str, stops: Sequence[str]) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of a stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


def settled(text: str, stops: Sequence[str], strip: bool) -> str:
    """The prefix of the final text that ``text`` (all tokens decoded so far) already fixes."""
    cut = apply_stops(text, stops)
    if len(cut) == len(text):  # no stop yet: an unfinished character, then a tail that
        cut = text.rstrip("\ufffd")  # may still become a stop, wait
        cut = cut[: len(cut) - stop_prefix_len(cut, stops)]
    return cut.strip() if strip else cut


class IncrementalText:
    """Feed it the decoded text so far; it returns what is new and settled (maybe "")."""

    def __init__(self, stops: Sequence[str], strip: bool) -> None:
        self.stops = tuple(stops)
        self.strip = strip
        self.sent = ""

    def update(self, text: str) -> str:
        safe = settled(text, self.stops, self.strip)
        if len(safe) <= len(self.sent) or not safe.startswith(self.sent):
            return ""  # nothing new (or a decoder that rewrote earlier text: wait for the end)
        delta = safe[len(self.sent):]
        self.sent = safe
        return delta
