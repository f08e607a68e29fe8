"""Turning instructions into cleaned texts with one generator: seeding, retries, counting.

Each wanted text has a stable tag ("init/3/17"); its request seed derives from the run seed,
the tag and the attempt number, so a resumed run sends byte-identical requests and the
on-disk request cache answers them without a second LLM call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import GeneratorConfig, SynthesisConfig
from ..context import stable_seed
from ..llm.base import Generator
from .lengths import tokens_for, words_within
from .prompts import clean_generation, instruction_sentences, render, trim_cut_off, with_writer


@dataclass
class GenerationCounts:
    requested: int = 0
    sent: int = 0
    dropped: int = 0
    retried: int = 0
    #: answers the filters refused (chatter, echoes, placeholders, duplicates, off-label
    #: texts), then retried
    rejected: int = 0
    #: of those, refused by the label check (another label's text)
    off_label: int = 0
    #: of those, shorter than the length band's short end (:meth:`Synthesizer._short`)
    short: int = 0

    def add(self, other: GenerationCounts) -> None:
        self.requested += other.requested
        self.sent += other.sent
        self.dropped += other.dropped
        self.retried += other.retried
        self.rejected += other.rejected
        self.off_label += other.off_label
        self.short += other.short


@dataclass
class Synthesizer:
    """One generator with its sampling settings; ``writer`` is the public ``prompts.writer``
    (:func:`~dpsynth.evolution.prompts.render` places it)."""

    generator: Generator
    config: GeneratorConfig
    synthesis: SynthesisConfig
    seed: int
    writer: str = ""
    #: max_new_tokens when the generator's config leaves it unset (from the texts' length)
    length_tokens: int = 64
    #: the texts' length in words (None: unknown): a longer text that stops mid-sentence is
    #: cut back to its last full sentence (:func:`trim_cut_off`)
    max_words: int | None = None
    #: the short end of the length band in words (None: only ``synthesis.min_chars``): a
    #: shorter text is regenerated like a refused one, and kept when every attempt was short
    #: (the band steers; it never empties a release)
    min_words: int | None = None
    counts: GenerationCounts = field(default_factory=GenerationCounts)

    @property
    def name(self) -> str:
        return self.config.short_name

    @property
    def chat(self) -> bool:
        if self.config.chat is not None:
            return self.config.chat
        return bool(self.generator.supports_chat)

    def complete(self, instructions: Sequence[str], tags: Sequence[str],
                 progress: bool = True, accept: Callable[[int, str], bool] | None = None,
                 check: Callable[[list[int], list[str]], np.ndarray] | None = None,
                 words: Sequence[int | None] | None = None) -> list[str | None]:
        """Generate one cleaned text per instruction; None where every attempt failed.
        ``accept(i, text)``: False refuses instruction i's cleaned text too (a duplicate, an
        unchanged variation), which is then retried like a refused one. ``check(indices,
        texts)``: a mask of the cleaned texts of one attempt to refuse as off-label
        (:class:`~dpsynth.evolution.label_check.LabelCheck`); an instruction whose every
        attempt was off-label or short keeps its last such text (the checks steer; they never
        empty a release). ``words``: each instruction's own length in words (its token cap and
        the length it is trimmed back from), else ``max_words`` for all."""
        results: list[str | None] = [None] * len(instructions)
        fallback: dict[int, str] = {}  # the last clean but short or off-label text
        pending = list(range(len(instructions)))
        self.counts.requested += len(instructions)
        for attempt in range(self.synthesis.retries + 1):
            if not pending:
                break
            if attempt:
                self.counts.retried += len(pending)
            outputs = self.generator.generate(self._requests(instructions, tags, pending,
                                                             attempt, words), progress=progress)
            self.counts.sent += len(pending)
            cleaned = {i: self._cleaned(raw or "", instructions[i],
                                        words[i] if words is not None else None)
                       for i, raw in zip(pending, outputs, strict=True)}
            off = self._off_label(cleaned, check)
            failed = []
            for i in pending:
                text = cleaned[i]
                short = text is not None and self._short(text, self._cap(i, words))
                self.counts.short += int(short and i not in off)
                held = text is not None and (i in off or short)
                if held and (accept is None or accept(i, text)):
                    fallback[i] = text  # type: ignore[assignment]
                if held or text is None or (accept is not None and not accept(i, text)):
                    self.counts.rejected += 1
                    failed.append(i)
                else:
                    results[i] = text
            pending = failed
        for i in [i for i in pending if i in fallback]:  # every attempt held back: keep last
            results[i] = fallback[i]
        self.counts.dropped += sum(1 for i in pending if i not in fallback)
        return results

    def _requests(self, instructions: Sequence[str], tags: Sequence[str],
                  pending: Sequence[int], attempt: int,
                  words: Sequence[int | None] | None = None) -> list[Any]:
        """The requests of one attempt, seeded by the run seed, the tag and the attempt; each
        capped at its own length's tokens when ``words`` gives one (a generator config's
        ``max_new_tokens`` wins)."""
        from ..llm import GenerationRequest, SamplingParams

        return [
            GenerationRequest(
                prompt=render(instructions[i], self.chat, self.writer),
                params=SamplingParams(
                    temperature=self.config.temperature,
                    top_p=self.config.top_p,
                    top_k=self.config.sampling_top_k,
                    max_new_tokens=self._cap(i, words),
                    seed=stable_seed(self.seed, self.name, tags[i], attempt),
                    stop=() if self.chat else ("\n\n",),
                ),
            )
            for i in pending
        ]

    def _cap(self, i: int, words: Sequence[int | None] | None) -> int:
        """Request ``i``'s token cap: a generator config's ``max_new_tokens``, else its own
        length's tokens (``words``), else the texts' length's."""
        own = words[i] if words is not None else None
        return self.config.max_new_tokens or (tokens_for(own) if own else self.length_tokens)

    def _cleaned(self, raw: str, instruction: str, words: int | None = None) -> str | None:
        """One generation through the public filters (:func:`clean_generation`), trimmed to
        its last full sentence when the token cap cut it (:meth:`_longest`)."""
        echoes = (instruction_sentences(with_writer(instruction, self.writer))
                  if self.synthesis.strip_echoes else ())
        text = clean_generation(raw, self.synthesis.min_chars, echoes=echoes,
                                drop_off_task=self.synthesis.drop_off_task, writer=self.writer)
        if text is not None:
            text = trim_cut_off(text, self._longest(words))
        return text

    def _longest(self, words: int | None) -> int:
        """The words a text reaches when its token cap cuts it: its own ``words``, else
        ``max_words``, else (WASP's and SecPE's texts, with no length estimate) the words the
        default cap holds; never more than a generator config's ``max_new_tokens`` holds, which
        caps the request whatever the length (the demo's 64 tokens, under lengths of up to 64
        words, left 47 % of its released texts cut and untrimmed)."""
        longest = words or self.max_words or words_within(self.length_tokens)
        if self.config.max_new_tokens:
            longest = min(longest, words_within(self.config.max_new_tokens))
        return longest

    def _short(self, text: str, cap: int) -> bool:
        """Below the length band (regenerated; kept when every attempt was short), where the
        request's token ``cap`` can reach the band's short end: a cap that holds fewer words
        (a generator config's ``max_new_tokens`` under the records' length, a drawn length
        below the band) would refuse every attempt, and regenerate each request for nothing
        (the 16-token benchmark job against pe sent each of its requests three times)."""
        if self.min_words is None or words_within(cap) < self.min_words:
            return False
        return len(text.split()) < self.min_words

    def _off_label(self, cleaned: Mapping[int, str | None],
                   check: Callable[[list[int], list[str]], np.ndarray] | None) -> set[int]:
        """The instructions whose cleaned text ``check`` refuses (counted in ``off_label``)."""
        if check is None:
            return set()
        kept = [(i, t) for i, t in cleaned.items() if t is not None]
        if not kept:
            return set()
        mask = check([i for i, _ in kept], [t for _, t in kept])
        off = {i for (i, _), refuse in zip(kept, mask, strict=True) if refuse}
        self.counts.off_label += len(off)
        return off
