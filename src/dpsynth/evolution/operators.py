"""Generation operators of the PE family over a pool: RANDOM_API, VARIATION_API and WASP's
contrastive generation (docs/methods.md §1-2), plus the embedder of synthetic texts.

:class:`Generation` is the collaborator a strategy is handed for everything that calls a model;
it sees public inputs only (the label classes, prompts, synthetic texts). Each operator spreads
its work over the run's generators by given weights.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ..config import PromptConfig, RunConfig
from ..context import stable_seed
from ..embed.shared import SharedEmbedder
from ..llm.cache import CachedGenerator
from ..llm.runtime import stepper_threads, torch_threads
from ..progress import step
from . import prompts as P
from .label_check import LabelCheck
from .lengths import bin_words, drawn_lengths, length_bin, tokens_for
from .pool import Pool
from .preference import PreferencePair, Trainer, is_tuned, ranked_pairs, train_dpo
from .prompts import render
from .selection import allocate
from .textgen import Synthesizer


def described_value(prompts: PromptConfig) -> Callable[[str, str], str]:
    """What the label check's embedder reads for a column's value: its public description
    (``prompts.label_descriptions``), else its readable name."""
    descriptions = prompts.descriptions()
    return lambda col, v: descriptions.get(col, {}).get(v, P.readable_label(v))


def split_by_weights(n: int, weights: np.ndarray) -> np.ndarray:
    """How many of n samples each generator makes (largest remainder on the weights)."""
    return allocate(n, np.asarray(weights, dtype=np.float64))


class Generation:
    """The run's generators and embedder, loaded on first use (a run that fails validation
    never pays for a model load), and the operators built on them.

    ``embedder``: the run's embedder, shared with the private-statistics engine and loaded on
    first use by whichever needs it first; ``generators``: ready objects used instead of
    loading the configured models (one per ``config.generators`` entry), e.g. the test fakes;
    ``label_dict`` maps a joint class code to its label values (public)."""

    def __init__(self, config: RunConfig, label_dict: Callable[[int], dict[str, str]],
                 seed: int, cache_path: Path, embedder: SharedEmbedder, *,
                 rng: Callable[[str], np.random.Generator], log: Callable[[str], None],
                 progress: bool = True, generators: Sequence[Any] | None = None,
                 trainer: Trainer | None = None,
                 label_domain: Mapping[str, Sequence[str]] | None = None) -> None:
        if generators is not None and len(generators) != len(config.generators):
            raise ValueError(f"{len(generators)} generators given for "
                             f"{len(config.generators)} configured")
        self.config = config
        self.label_dict = label_dict
        self.seed = seed
        self.cache_path = cache_path
        self.rng = rng
        self.log = log
        self.progress = progress
        self._given_generators = list(generators) if generators is not None else None
        self._embedder = embedder
        #: the longest text to write, in words (synthesis.max_words, or set from a DP
        #: estimate by :meth:`write_up_to`); None: 64 tokens
        self.max_words: int | None = config.synthesis.max_words
        #: the shortest text kept, in words (synthesis.min_words, or the DP estimate's)
        self.min_words: int | None = config.synthesis.min_words
        #: the released length distribution's bins up to max_words (:meth:`Sizes.length_mix`):
        #: each zero-shot request draws its own length from it, each variation keeps its
        #: parent's; None: every text up to max_words
        self.length_mix: list[float] | None = None
        #: trains a generator on preference pairs (:func:`preference.train_dpo`; a test's
        #: recorder) and the tuned model each generator runs now (folder), if any
        self.trainer: Trainer = trainer or train_dpo
        self.tuned: dict[int, Path] = {}
        #: label column -> its declared values (public), for the label check; None: no check
        self.label_domain = label_domain
        #: generator -> the label check's gate (column -> checked), once decided; the loop's
        #: checkpoint keeps it so that a resumed run checks as the first attempt did
        self.label_gates: dict[int, dict[str, bool]] = {}

    def write_up_to(self, words: int | None, at_least: int | None = None,
                    mix: list[float] | None = None) -> None:
        """Generations of up to ``words`` words from now on (generators whose config sets
        max_new_tokens keep it), and of at least ``at_least`` words (a shorter one is
        regenerated; None: no such bound); with ``mix``, each request up to a length of its
        own (:attr:`length_mix`)."""
        self.max_words, self.min_words, self.length_mix = words, at_least, mix
        if "synthesizers" in self.__dict__:
            for synth in self.synthesizers:
                synth.length_tokens, synth.max_words = self._length_tokens(), words
                synth.min_words = at_least

    def _length_tokens(self) -> int:
        return 64 if self.max_words is None else tokens_for(self.max_words)

    # -- models ----------------------------------------------------------------------------
    @property
    def embedder(self) -> Any:
        """The run's embedder, shared with the private-statistics engine (loaded on first
        use)."""
        return self._embedder.get()

    @cached_property
    def synthesizers(self) -> list[Synthesizer]:
        from ..llm import load_generator
        from ..llm.cache import RequestCache

        out = []
        for i, gen_cfg in enumerate(self.config.generators):
            if self._given_generators is not None:
                # the same request cache as a loaded model: resume pays no call twice
                generator: Any = CachedGenerator(self._given_generators[i],
                                                 RequestCache(self.cache_path))
            else:
                self.log(f"loading generator {i}: {gen_cfg.short_name}")
                with step(f"loading generator {gen_cfg.short_name}"):
                    generator = load_generator(gen_cfg.load_spec(), cache_path=self.cache_path)
            out.append(Synthesizer(generator, gen_cfg, self.config.synthesis, self.seed,
                                   self.config.prompts.writer, self._length_tokens(),
                                   self.max_words, self.min_words))
        return out

    @property
    def names(self) -> list[str]:
        return [g.short_name for g in self.config.generators]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings of synthetic texts (public)."""
        return self.embedder.embed(list(texts), progress=self.progress)

    def rows(self, pool: Pool) -> list[dict[str, Any]]:
        """release/*.jsonl rows of a synthetic pool: text, labels by column, generator name."""
        names = self.names
        return [{"text": text, "labels": self.label_dict(int(y)), "generator": names[int(g)]}
                for text, y, g in zip(pool.texts, pool.labels, pool.sources, strict=True)]

    def counts(self) -> dict[str, int]:
        """LLM request counts of this attempt, for summary.json."""
        total: dict[str, int] = {"requested": 0, "sent": 0, "dropped": 0, "retried": 0,
                                 "rejected": 0, "off_label": 0, "short": 0}
        if "synthesizers" not in self.__dict__:
            return total
        for synth in self.synthesizers:
            for key in total:
                total[key] += getattr(synth.counts, key)
        # llm_calls: answers received (and stored) by this attempt, i.e. calls paid for;
        # requests that failed for good are in llm_requests_sent but not in llm_calls
        cached = [s.generator for s in self.synthesizers
                  if isinstance(s.generator, CachedGenerator)]
        total["llm_calls"] = sum(g.delivered for g in cached)
        total["llm_requests_sent"] = sum(g.misses for g in cached)
        total["http_retries"] = sum(int(getattr(s.generator, "retries", 0) or 0)
                                    for s in self.synthesizers)
        return total

    # -- learning from the released votes (docs/methods.md §1) ---------------------------
    def learn_from_votes(self, pool: Pool, scores: np.ndarray, folder: Path, tag: str
                         ) -> list[str]:
        """Train each generator on pairs of its own candidates ranked by the released
        ``scores`` (:func:`preference.ranked_pairs`; the label's zero-shot prompt as the
        prompt) and generate with the tuned model from now on. A tuned model already in
        ``folder`` (a resumed run) is loaded, not trained again. Returns the tuned models'
        folder names, for the strategy's checkpoint."""
        settings = self.config.synthesis.preference
        names = []
        for g, synth in enumerate(self.synthesizers):
            chosen = ranked_pairs(pool, scores, settings.pairs, self.rng(f"pairs/{tag}/{g}"),
                                  source=g)
            if not chosen:
                continue
            pairs = [PreferencePair(render(P.zero_shot_instruction(
                self.config.prompts.task, self._label_text(int(pool.labels[c]))), synth.chat,
                self.config.prompts.writer), pool.texts[c], pool.texts[r]) for c, r in chosen]
            digest = hashlib.sha256(repr([(p.chosen, p.rejected) for p in pairs]).encode())
            out = folder / f"{tag}-g{g}-{digest.hexdigest()[:12]}"
            if not is_tuned(out):
                base = (None if self._given_generators is not None
                        else Path(synth.generator.model_dir))
                self.log(f"preference training of generator {g} on {len(pairs)} pairs")
                # on the generator's configured threads, else every core: never the cores
                # idle when the generator was loaded (llm.runtime.stepper_threads)
                with step(f"learning from the votes ({len(pairs)} pairs)"), \
                        torch_threads(stepper_threads(synth.generator)):
                    self.trainer(base, pairs, out, settings,
                                 stable_seed(self.seed, "preference", tag, g))
            self.use_tuned(g, out)
            names.append(out.name)
        return names

    def use_tuned(self, g: int, folder: Path) -> None:
        """Generator ``g`` writes with the tuned model in ``folder`` from now on (the
        given test generators stay as they are: they have no weights)."""
        if self.tuned.get(g) == folder:
            return
        self.tuned[g] = folder
        if self._given_generators is not None:
            return
        from ..llm import load_generator

        cfg = self.config.generators[g]
        spec = {"backend": "local", "model": str(folder), "engine": cfg.engine,
                "num_threads": cfg.threads, "batch_size": cfg.batch_size}
        self.synthesizers[g].generator = load_generator(spec, cache_path=self.cache_path)

    # -- operators -------------------------------------------------------------------------
    def _run_jobs(self, instructions: list[str], labels: list[int], sources: list[int],
                  tags: list[str], parents: Sequence[str] | None = None,
                  words: Sequence[int | None] | None = None) -> tuple[Pool, np.ndarray]:
        """Send each instruction to its generator; keep the cleaned successes (and say which).
        A text that repeats another text of the call, or (``parents``) the text it varies,
        is refused and retried, as is one the label check refuses (public: synthetic texts
        only)."""
        texts: list[str | None] = [None] * len(instructions)
        src = np.asarray(sources, dtype=np.int64)
        seen: set[str] = set()
        for g, synth in enumerate(self.synthesizers):
            idx = np.flatnonzero(src == g)
            if len(idx) == 0:
                continue

            def fresh(j: int, text: str, idx: np.ndarray = idx) -> bool:
                key = P.normalised(text)
                if key in seen or (parents is not None and key == P.normalised(
                        parents[int(idx[j])])):
                    return False
                seen.add(key)
                return True

            out = synth.complete([instructions[i] for i in idx], [tags[i] for i in idx],
                                 progress=self.progress, accept=fresh,
                                 check=self._label_check(g, [labels[i] for i in idx],
                                                         tags[idx[0]].split("/")[0]),
                                 words=None if words is None else [words[i] for i in idx])
            for i, text in zip(idx, out, strict=True):
                texts[i] = text
        ok = np.array([i for i, t in enumerate(texts) if t is not None], dtype=np.int64)
        return Pool.build(texts, labels, sources), ok

    def _label_check(self, g: int, labels: Sequence[int], call: str
                     ) -> Callable[[list[int], list[str]], np.ndarray] | None:
        """The label check of generator ``g``'s share of a call (None when
        ``synthesis.label_check`` is off or the label domain is unknown). A gate this call
        decides is kept in ``label_gates`` and said in the run log."""
        if not self.config.synthesis.label_check or not self.label_domain:
            return None
        check = LabelCheck(self.label_domain, described_value(self.config.prompts),
                           self.embedder, gate=self.label_gates.get(g))

        def refused(indices: list[int], texts: list[str]) -> np.ndarray:
            undecided = check.gate is None
            mask = check.refused(texts, [self.label_dict(int(labels[i])) for i in indices])
            if undecided and check.gate is not None:
                self.label_gates[g] = check.gate
                for col, on in check.gate.items():
                    self.log(f"label check of generator {g} ({call}): {col} "
                             f"{'checked' if on else 'not checked'} (kappa "
                             f"{check.kappas[col]}; {int(mask.sum())} of {len(texts)} refused)")
            return mask

        return refused

    def _label_text(self, y: int) -> str:
        return P.describe_labels(self.label_dict(y), self.config.prompts)

    def zero_shot(self, per_label: np.ndarray, tag: str,
                  weights: np.ndarray | None = None) -> Pool:
        """RANDOM_API: per_label[y] label-conditioned zero-shot samples for each label y."""
        weights = np.ones(len(self.config.generators)) if weights is None else weights
        instructions, labels, sources, tags = [], [], [], []
        task = self.config.prompts.task
        for y, n_y in enumerate(per_label):
            text = self._label_text(y)
            for g, n_g in enumerate(split_by_weights(int(n_y), weights)):
                for j in range(int(n_g)):
                    instructions.append(P.zero_shot_instruction(task, text))
                    labels.append(y)
                    sources.append(g)
                    tags.append(f"{tag}/{y}/{g}/{j}")
        words = (drawn_lengths(self.length_mix, len(instructions), self.rng(f"lengths/{tag}"))
                 if self.length_mix else None)
        return self._run_jobs(instructions, labels, sources, tags, words=words)[0]

    def _parent_words(self, parents: Sequence[str]) -> list[int | None] | None:
        """A variation's length: its parent's length bin, up to ``max_words`` (None without a
        :attr:`length_mix`)."""
        if not self.length_mix:
            return None
        cap = self.max_words or bin_words(len(self.length_mix) - 1)
        return [min(bin_words(length_bin(text)), cap) for text in parents]

    def variations(self, pool: Pool, n_each: int, tag: str) -> tuple[Pool, np.ndarray]:
        """VARIATION_API (docs/methods.md §1, step 3e): n_each variations of every sample in
        the pool, by the generator that wrote it; rephrase with a random style or fill in
        masked words. Returns the variations and, for each, the index of its parent."""
        cfg = self.config.synthesis
        styles = self.config.prompts.styles
        task = self.config.prompts.task
        rng = self.rng(tag)
        instructions, labels, sources, tags, parents = [], [], [], [], []
        for i, text in enumerate(pool.texts):
            label = int(pool.labels[i])
            label_text = self._label_text(label)
            for j in range(n_each):
                kind = cfg.variation
                if kind == "mixed":
                    kind = "rephrase" if rng.random() < 0.5 else "fill_in"
                if kind == "rephrase":
                    style = styles[int(rng.integers(len(styles)))]
                    instr = P.rephrase_instruction(task, label_text, text, style)
                else:
                    masked = P.mask_words(text, cfg.mask_rate, rng)
                    instr = P.fill_in_instruction(task, label_text, masked)
                instructions.append(instr)
                labels.append(label)
                sources.append(int(pool.sources[i]))
                tags.append(f"{tag}/{i}/{j}")
                parents.append(text)
        out, ok = self._run_jobs(instructions, labels, sources, tags, parents,
                                 self._parent_words(parents))
        return out, ok // max(n_each, 1)

    def contrastive(self, per_label: np.ndarray, weights: np.ndarray,
                    good: dict[int, list[str]], bad: dict[int, list[str]], n_demos: int,
                    tag: str) -> Pool:
        """WASP step 5: per label, new samples from prompts with random subsets of n_demos/2
        good and n_demos/2 bad demonstrations; generators share the work by their weights."""
        half = max(1, n_demos // 2)
        rng = self.rng(tag)
        instructions, labels, sources, tags = [], [], [], []
        task = self.config.prompts.task
        for y, n_y in enumerate(per_label):
            label_text = self._label_text(y)
            g_texts, b_texts = good.get(y, []), bad.get(y, [])
            for g, n_g in enumerate(split_by_weights(int(n_y), weights)):
                for j in range(int(n_g)):
                    if g_texts and b_texts:
                        gi = rng.choice(len(g_texts), size=min(half, len(g_texts)),
                                        replace=False)
                        bi = rng.choice(len(b_texts), size=min(half, len(b_texts)),
                                        replace=False)
                        instr = P.contrastive_instruction(task, label_text,
                                                          [g_texts[k] for k in gi],
                                                          [b_texts[k] for k in bi])
                    else:
                        instr = P.zero_shot_instruction(task, label_text)
                    instructions.append(instr)
                    labels.append(y)
                    sources.append(g)
                    tags.append(f"{tag}/{y}/{g}/{j}")
        return self._run_jobs(instructions, labels, sources, tags)[0]
