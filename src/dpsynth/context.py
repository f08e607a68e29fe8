"""Everything one run needs, opened once: data, labels, privacy session, models, caches.

Models load lazily, so a run that fails validation never pays for a model load.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from .config import RunConfig
from .evolution.textgen import Synthesizer
from .runs import RunDir


class RunContext:
    """Thin holder of a run's state; the methods and the loop take it as their argument."""

    def __init__(self, config: RunConfig, run: RunDir, dataset: Any, sigma: float,
                 session: Any, *, progress: bool = True,
                 generators: Sequence[Any] | None = None, embedder: Any | None = None) -> None:
        """``generators`` / ``embedder``: ready objects used instead of loading the configured
        models (one generator per ``config.generators`` entry), e.g. the test fakes."""
        if generators is not None and len(generators) != len(config.generators):
            raise ValueError(f"{len(generators)} generators given for "
                             f"{len(config.generators)} configured")
        self._given_generators = list(generators) if generators is not None else None
        self._given_embedder = embedder
        self.config = config
        self.run = run
        from .privacy import run_seed

        # the run's private seed (private/seed, drawn once when the config gives none): drives
        # post-processing and LLM sampling, so a resumed run makes the same choices
        self.seed: int = run_seed(run.private, config.privacy.seed)
        self.dataset = dataset
        self.sigma = sigma
        self.session = session
        self.progress = progress
        # the classes are the product of the public label domain (declared in the config or
        # found privately), never derived from the records (docs/methods.md §0)
        self.label_codes, self.label_classes = dataset.joint_label_codes()
        self.label_codes = np.asarray(self.label_codes, dtype=np.int64)
        self.users: np.ndarray | None = None
        if config.privacy.unit == "user":
            _, inverse = np.unique(np.asarray(dataset.users), return_inverse=True)
            self.users = inverse.astype(np.int64)

    def rng_for(self, tag: str) -> np.random.Generator:
        """A generator for post-processing randomness (selection, styles, masks) derived from
        the run seed and a tag, so a resumed step makes exactly the same choices."""
        from .evolution.textgen import stable_seed

        return np.random.default_rng(stable_seed(self.seed, "post", tag))

    # -- labels ----------------------------------------------------------------------------
    @property
    def n_labels(self) -> int:
        """Joint label classes, including declared ones that no record holds."""
        return len(self.label_classes)

    def label_dict(self, code: int) -> dict[str, str]:
        """Label column -> value of joint class ``code``."""
        return dict(zip(self.dataset.label_columns, self.label_classes[code], strict=True))

    # -- privacy ---------------------------------------------------------------------------
    @property
    def private(self) -> bool:
        return not math.isinf(self.config.privacy.epsilon)

    def release_gaussian(self, key: str, value: np.ndarray, sensitivity: float,
                         name: str = "gaussian") -> np.ndarray:
        """Release value + N(0, (sigma)^2) through the session (stored, accounted, resumable).

        With epsilon = inf the run is declared non-private and the true value is used.
        """
        if not self.private:
            return np.asarray(value, dtype=np.float64)
        return self.session.gaussian(key, np.asarray(value, dtype=np.float64), sensitivity,
                                     self.sigma * sensitivity, name=name)

    # -- models ----------------------------------------------------------------------------
    @cached_property
    def embedder(self) -> Any:
        from .embed import Embedder

        if self._given_embedder is not None:
            return self._given_embedder
        cfg = self.config.embedder
        self.log(f"loading embedder {cfg.model} (engine {cfg.engine})")
        embedder = Embedder(cfg.model, cache_dir=self.run.private / "embed-cache",
                            batch_size=cfg.batch_size, engine=cfg.engine, threads=cfg.threads)
        self.log(f"embedder engine: {getattr(embedder, 'engine_tag', type(embedder).__name__)}")
        return embedder

    @cached_property
    def synthesizers(self) -> list[Synthesizer]:
        from .llm import load_generator

        out = []
        for i, gen_cfg in enumerate(self.config.generators):
            if self._given_generators is not None:
                from .llm.cache import CachedGenerator, RequestCache

                # the same request cache as a loaded model: resume pays no call twice
                generator = CachedGenerator(self._given_generators[i],
                                            RequestCache(self.llm_cache_path))
            else:
                self.log(f"loading generator {i}: {gen_cfg.short_name}")
                extra = {"batch_size": gen_cfg.batch_size} if gen_cfg.backend == "local" else {}
                generator = load_generator(gen_cfg.spec(), cache_path=self.llm_cache_path,
                                           **extra)
            out.append(Synthesizer(generator, gen_cfg, self.config.synthesis,
                                   self.seed))
        return out

    @property
    def llm_cache_path(self) -> Path:
        if self.config.llm_cache:
            return Path(self.config.llm_cache)
        return self.run.private / "llm-cache.sqlite"

    @cached_property
    def private_embeddings(self) -> np.ndarray:
        """Embeddings of the private texts: streamed in chunks into a memory-mapped .npy in the
        private area (mode 0600), resumed where a stopped run left it (``embed.embed_to_file``)."""
        from .embed import embed_to_file

        return embed_to_file(self.embedder, self.dataset.texts, len(self.dataset),
                             self.run.private / "private-embeddings.npy", log=self.log)

    @cached_property
    def compute(self) -> Any:
        """The private-statistics engine (``compute.engine``): the methods' one access to
        private embeddings (dpsynth.compute; docs/methods.md §0)."""
        from .compute import make_compute

        return make_compute(self)

    def close_compute(self) -> None:
        """Release the compute engine's workers, if it was started."""
        if "compute" in self.__dict__:
            try:
                self.__dict__.pop("compute").close()
            except Exception as err:  # the run's outcome stands; note it for the operator
                self.log(f"compute engine did not close cleanly: {type(err).__name__}")

    def embed_synthetic(self, texts: Sequence[str]) -> np.ndarray:
        return self.embedder.embed(list(texts), progress=self.progress)

    def rows(self, pool: Any) -> list[dict[str, Any]]:
        """release/*.jsonl rows of a synthetic pool: text, labels by column, generator name."""
        names = [g.short_name for g in self.config.generators]
        return [{"text": text, "labels": self.label_dict(int(y)), "generator": names[int(g)]}
                for text, y, g in zip(pool.texts, pool.labels, pool.sources, strict=True)]

    # -- logging ---------------------------------------------------------------------------
    def log(self, message: str) -> None:
        """Progress note to log.txt (counts and names only; never private text)."""
        self.run.log(message)

    def llm_counts(self) -> dict[str, int]:
        total: dict[str, int] = {"requested": 0, "sent": 0, "dropped": 0, "retried": 0}
        if "synthesizers" not in self.__dict__:
            return total
        for synth in self.synthesizers:
            for key in total:
                total[key] += getattr(synth.counts, key)
        # llm_calls: answers received (and stored) by this attempt, i.e. calls paid for;
        # requests that failed for good are in llm_requests_sent but not in llm_calls
        total["llm_calls"] = sum(int(getattr(s.generator, "delivered", 0))
                                 for s in self.synthesizers)
        total["llm_requests_sent"] = sum(int(getattr(s.generator, "misses", 0))
                                         for s in self.synthesizers)
        total["http_retries"] = sum(int(getattr(s.generator, "retries", 0) or 0)
                                    for s in self.synthesizers)
        return total


def demo_data_paths(run: RunDir, rows: int, seed: int) -> dict[str, Path]:
    """Write the built-in demo corpus into the run's private area (once) and return its paths."""
    from .demo_corpus import write_demo_corpus

    out = run.private / "demo-data"
    if not (out / "private.csv").is_file():
        out.mkdir(mode=0o700, parents=True, exist_ok=True)
        return write_demo_corpus(out, n=rows, seed=seed)
    return {p.stem: p for p in out.iterdir() if p.suffix in {".csv", ".json"}}
