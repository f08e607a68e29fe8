"""One progress display for a run: every stage (model conversion, embedding, generation,
voting, release) shows on the terminal through rich, under the run's current stage
(``iteration 2/3``), with the run's log lines printed above the bars.

* :class:`Display` draws it: on a terminal (or in Jupyter) live rich bars and spinners; when
  stderr is not a terminal (a CI log, ``2> file``) plain lines without ``\\r`` - a start line,
  one at each quarter and a done line per bar.
* A bar counts what a user waits for (texts, tokens, documents; its label says which), not
  batches: ``advance(n)`` adds the ``n`` items a batch finished. Its time left is measured
  from the bar's own start, so it shows as soon as the first batch is done (rich's own
  estimate needs two updates within 30 s, which slow batches never give), and counts down
  between updates.
* :func:`session` makes a display the active one for the duration of a command and routes
  what third-party libraries print: Hugging Face bars off, their warnings to the
  ``dpsynth.thirdparty`` logger (DEBUG, not the terminal), dpsynth's own log warnings to the
  display.
* :func:`bar`, :func:`step`, :func:`stage`, :func:`note` and :func:`warn` reach the active
  display from anywhere (they do nothing when none is active, except :func:`bar`, which then
  draws a bar of its own, as before, and :func:`warn`, which then prints the warning).

Callers pass counts and names, never private text.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["Advance", "Display", "bar", "current", "note", "session", "stage", "step", "time_left",
           "warn"]

_active: list[Display] = []
_lock = threading.Lock()


def _plain_time(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def quarter_marks(total: int) -> list[int]:
    """The counts at which a plain (non-terminal) bar prints a line: each quarter of
    ``total`` that is neither 0 nor the end, once each."""
    return sorted({total * q // 4 for q in (1, 2, 3)} - {0, total})


#: A bar's ``advance``: ``advance(n=1)`` adds ``n`` finished items.
Advance = Callable[..., None]


def _ignore(n: int = 1) -> None:
    """The ``advance`` of a bar that shows nothing."""


class _PlainCount:
    """A plain bar's count and the quarter marks it has passed (thread-safe)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.count = 0
        self._marks = quarter_marks(total)
        self._lock = threading.Lock()

    def add(self, n: int) -> tuple[int, list[int]]:
        """Add ``n``; (the new count, the marks crossed by this addition, each only once)."""
        with self._lock:
            before, self.count = self.count, self.count + int(n)
            return self.count, [m for m in self._marks if before < m <= self.count]


def _clock(seconds: float) -> str:
    """``h:mm:ss`` (rich's style for time columns)."""
    minutes, secs = divmod(int(round(max(0.0, seconds))), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def time_left(elapsed: float, completed: float, total: float, since: float = 0.0
              ) -> float | None:
    """Seconds left of a bar: the rate over the ``elapsed`` seconds from its start to its
    last update (``completed`` items by then) applied to the items still to do, less the
    ``since`` seconds passed after that update (at least 0); None before the first item."""
    if completed <= 0 or elapsed <= 0:
        return None
    return max(0.0, elapsed * (total - completed) / completed - since)


def _eta_column() -> Any:
    """A rich column of the time left from the bar's own start (:func:`time_left`): shown
    after the first batch, counting down between updates."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class TimeLeft(ProgressColumn):
        def render(self, task: Any) -> Text:
            at, start = task.fields.get("at"), task.start_time
            left = None
            if at is not None and start is not None and task.total:
                now = task.get_time()
                left = time_left(at - start, task.completed, task.total, now - at)
            return Text(f"eta {_clock(left)}" if left is not None else "eta -:--:--",
                        style="progress.remaining")

    return TimeLeft()


class Display:
    """Progress on a rich console (stderr by default). ``enabled=False`` shows no bars and no
    notes (``--quiet``), only warnings."""

    def __init__(self, *, enabled: bool = True, console: Any = None) -> None:
        from rich.console import Console

        self.enabled = enabled
        self.console = console if console is not None else Console(stderr=True)
        self.live = bool(self.console.is_terminal or self.console.is_jupyter)
        self.stage_text = ""
        self._lock = threading.RLock()
        self._progress: Any = None
        self._running = 0

    # -- messages --------------------------------------------------------------------------
    def _print(self, text: str, style: str | None = None) -> None:
        with self._lock:
            target = self._progress.console if self._progress is not None else self.console
            target.print(text, style=style, markup=False, highlight=False, soft_wrap=True)

    def note(self, message: str) -> None:
        """A line above the bars (the run's log lines, a finished step)."""
        if self.enabled:
            self._print(f"{time.strftime('%H:%M:%S')} {message}", None)

    def warn(self, message: str) -> None:
        """A warning, shown even when the display is disabled."""
        self._print(f"warning: {message}", "yellow" if self.live else None)

    def stage(self, text: str) -> None:
        """The run's current stage (e.g. ``iteration 2/3``), shown before every bar."""
        self.stage_text = text

    def _label(self, label: str) -> str:
        return f"{self.stage_text} · {label}" if self.stage_text else label

    # -- bars ------------------------------------------------------------------------------
    def _start_live(self) -> Any:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        with self._lock:
            if self._progress is None:
                self._progress = Progress(
                    SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                    MofNCompleteColumn(), TimeElapsedColumn(), _eta_column(),
                    console=self.console, transient=True)
                self._progress.start()
            self._running += 1
            return self._progress

    def _stop_live(self) -> None:
        with self._lock:
            self._running -= 1
            if self._running == 0 and self._progress is not None:
                self._progress.stop()
                self._progress = None

    @contextlib.contextmanager
    def bar(self, label: str, total: int) -> Iterator[Advance]:
        """A bar of ``total`` items (texts, tokens: the label says which); yields
        ``advance(n=1)`` (thread-safe), called with the items each batch finished. It ends
        with one done line (label, count, time)."""
        if not self.enabled or total <= 0:
            yield _ignore
            return
        text = self._label(label)
        started = time.monotonic()
        if self.live:
            progress = self._start_live()
            task = progress.add_task(text, total=total, at=None)

            def advance(n: int = 1) -> None:
                progress.update(task, advance=n, at=progress.get_time())

            try:
                yield advance
            finally:
                done = int(progress.tasks[progress.task_ids.index(task)].completed)
                progress.remove_task(task)
                self._stop_live()
                self.note(f"{text}: {done}/{total} in {_plain_time(time.monotonic() - started)}")
            return
        plain = _PlainCount(total)
        self.note(f"{text}: 0/{total}")
        try:
            yield lambda n=1: self._plain_marks(text, plain, n, started)
        finally:
            self.note(f"{text}: {plain.count}/{total} in "
                      f"{_plain_time(time.monotonic() - started)}")

    def _plain_marks(self, text: str, plain: _PlainCount, n: int, started: float) -> None:
        """A plain bar's lines for the quarter marks that ``n`` more items crossed: one line
        each, once (a batch may cross several), the time left on the last."""
        count, crossed = plain.add(n)
        for i, mark in enumerate(crossed):
            left = ""
            if i == len(crossed) - 1 and 0 < count < plain.total:
                spent = time.monotonic() - started
                left = f", about {_plain_time(spent * (plain.total - count) / count)} left"
            self.note(f"{text}: {mark}/{plain.total}{left}")

    @contextlib.contextmanager
    def step(self, label: str) -> Iterator[None]:
        """A step without a count (voting, a model conversion): a spinner on a terminal; then
        one done line."""
        if not self.enabled:
            yield
            return
        text = self._label(label)
        started = time.monotonic()
        if self.live:
            progress = self._start_live()
            task = progress.add_task(text, total=None)
            try:
                yield
            finally:
                progress.remove_task(task)
                self._stop_live()
        else:
            yield
        self.note(f"{text}: done in {_plain_time(time.monotonic() - started)}")

    def close(self) -> None:
        with self._lock:
            if self._progress is not None:
                self._progress.stop()
                self._progress = None
                self._running = 0


def current() -> Display | None:
    """The active display (the innermost :func:`session`), or None."""
    with _lock:
        return _active[-1] if _active else None


def note(message: str) -> None:
    display = current()
    if display is not None:
        display.note(message)


def private_note(message: str) -> None:
    """A run's message that carries an exact fact about the private data ("[private]" lines)
    on the operator's display; the run's other log lines reach the display already."""
    if message.startswith("[private]"):
        note(message)


def warn(message: str) -> None:
    display = current()
    if display is not None:
        display.warn(message)
    else:
        from rich.console import Console

        Console(stderr=True).print(f"warning: {message}", markup=False, highlight=False,
                                   soft_wrap=True)


def stage(text: str) -> None:
    display = current()
    if display is not None:
        display.stage(text)


@contextlib.contextmanager
def bar(label: str, total: int, enabled: bool = True) -> Iterator[Advance]:
    """A bar of ``total`` items on the active display, or on a display of its own when none
    is active; yields ``advance(n=1)``."""
    if not enabled:
        yield _ignore
        return
    display = current()
    if display is None:
        display = Display()
        try:
            with display.bar(label, total) as advance:
                yield advance
        finally:
            display.close()
        return
    with display.bar(label, total) as advance:
        yield advance


@contextlib.contextmanager
def step(label: str) -> Iterator[None]:
    display = current()
    if display is None:
        yield
        return
    with display.step(label):
        yield


class _ToDisplay(logging.Handler):
    """dpsynth's own log warnings (``logging.getLogger('dpsynth...')``) as display warnings."""

    def __init__(self, display: Display) -> None:
        super().__init__(logging.WARNING)
        self.display = display

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self.display.warn(record.getMessage())


THIRD_PARTY_LOGGER = "dpsynth.thirdparty"


def _route_warning(message: Warning | str, category: type[Warning], filename: str,
                   lineno: int, file: Any = None, line: str | None = None) -> None:
    """Python warnings during a session: dpsynth's own to the display, every other
    library's to the ``dpsynth.thirdparty`` logger at DEBUG."""
    if "/dpsynth/" in filename.replace("\\", "/"):
        warn(f"{category.__name__}: {message}")
        return
    logging.getLogger(THIRD_PARTY_LOGGER).debug("%s:%s: %s: %s", filename, lineno,
                                                category.__name__, message)


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """Switch off the Hugging Face libraries' own progress bars and info logs while a command
    runs (they would interleave with the display), and restore them after; each library only
    if it is installed."""
    undo: list[Callable[[], None]] = []
    with contextlib.suppress(Exception):
        from huggingface_hub import utils as hub_utils

        if not hub_utils.are_progress_bars_disabled():
            hub_utils.disable_progress_bars()
            undo.append(hub_utils.enable_progress_bars)
    with contextlib.suppress(Exception):
        from transformers.utils import logging as hf_logging

        if hf_logging.is_progress_bar_enabled():
            hf_logging.disable_progress_bar()
            undo.append(hf_logging.enable_progress_bar)
        level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        undo.append(lambda: hf_logging.set_verbosity(level))
    try:
        yield
    finally:
        for step_back in reversed(undo):
            with contextlib.suppress(Exception):
                step_back()


@contextlib.contextmanager
def session(enabled: bool = True, console: Any = None) -> Iterator[Display]:
    """Make a new :class:`Display` the active one while a command runs (see the module
    docstring for what it routes); restores everything afterwards."""
    display = Display(enabled=enabled, console=console)
    own = logging.getLogger("dpsynth")
    handler = _ToDisplay(display)
    own.addHandler(handler)  # (with it, logging's last-resort stderr print stays silent)
    with _lock:
        _active.append(display)
    try:
        with quiet_libraries(), warnings.catch_warnings():
            warnings.simplefilter("default")
            warnings.showwarning = _route_warning
            yield display
    finally:
        display.close()
        with _lock:
            _active.remove(display)
        own.removeHandler(handler)
