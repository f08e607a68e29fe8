"""The small typed collaborators a method is handed (docs/architecture.md, "Seams").

* :class:`Rngs` - post-processing randomness derived from the run seed and a tag;
* :class:`PrivateView` - the private data as a method may see it: the public label classes,
  and per-record fields (label codes, users, texts) read lazily, only where a local step needs
  them (with ``compute.engine: ray`` they live on the shards), plus the compute engine the
  method's execution built for the run (:func:`dpsynth.run_dataset.run_engine`);
* :class:`Releaser` - the only door to the privacy session: every noisy statistic a method
  releases goes through it (docs/methods.md §0).

They import nothing of the evolution package, which sits above them and imports them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .config import RunConfig
from .run_folder import RunDir

if TYPE_CHECKING:
    from .compute.sharded import ShardedDataset
    from .data import Dataset
    from .privacy import Event, Lattice, NoiseSource, PrivacySession


def stable_seed(*parts: object) -> int:
    """A 31-bit seed from the parts' text (SHA-256): the same parts give the same seed in
    every process and on every machine."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


class PrivateStatistics(Protocol):
    """Exact private statistics without noise (the releaser adds it): what a method asks of
    the compute engine (implemented by :class:`dpsynth.compute.PrivateCompute`). It names no
    method: a method runs its own shard kernels through ``map`` (and ``map_keeping`` /
    ``off_driver`` / ``fetch`` for results that must stay off the driver)."""

    user_level: bool

    def map(self, kernel: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]: ...

    def map_keeping(self, kernel: Callable[..., Any], *args: Any, **kwargs: Any
                    ) -> tuple[list[Any], list[Any]]: ...

    def off_driver(self, fn: Callable[..., Any], *args: Any, returns: int = 1) -> Any: ...

    def fetch(self, handle: Any) -> Any: ...

    def shared(self, array: np.ndarray) -> Any: ...

    def n_records(self) -> int: ...

    def label_counts(self, n_labels: int) -> np.ndarray: ...

    def knn_histogram(self, cand_emb: np.ndarray, cand_labels: np.ndarray, k: int,
                      **vote_options: Any) -> np.ndarray: ...

    def topq_histograms(self, cand_emb: np.ndarray, cand_labels: np.ndarray, q: int,
                        **vote_options: Any) -> np.ndarray: ...

    def close(self) -> None: ...


class Rngs:
    """Random generators for post-processing (selection, styles, masks), one per tag, derived
    from the run's private seed: a resumed step makes exactly the same choices."""

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)

    def __call__(self, tag: str) -> np.random.Generator:
        return np.random.default_rng(stable_seed(self.seed, "post", tag))

    def seed_for(self, *parts: object) -> int:
        """An integer seed for a named purpose (e.g. a federated round's seeded noise)."""
        return stable_seed(self.seed, *parts)


def label_classes(dataset: Dataset | ShardedDataset) -> list[tuple[str, ...]]:
    """Joint label classes of a dataset, in declared order: the product of the public label
    domains (never derived from the records; docs/methods.md §0). Raises ``ValueError``
    without a public domain."""
    return list(dataset.label_classes())


class PrivateView:
    """A run's private data as the methods see it.

    The label classes (the product of the public label domains, docs/methods.md §0) are always
    available; per-record fields are computed on first use only. ``compute``: the run's
    private-statistics engine; ``embeddings``: the private embeddings, computed on the first
    call (:func:`dpsynth.run_dataset.private_embeddings`), for a local step that reads them.
    """

    def __init__(self, config: RunConfig, run: RunDir, dataset: Dataset | ShardedDataset,
                 compute: PrivateStatistics, *, embeddings: Callable[[], np.ndarray],
                 progress: bool = True) -> None:
        self.config = config
        self.run = run
        self.dataset = dataset
        self.compute = compute
        self._embeddings = embeddings
        self.progress = progress

    # -- public facts -----------------------------------------------------------------------
    @cached_property
    def label_classes(self) -> list[tuple[str, ...]]:
        """Joint label classes, in declared order (public: never derived from the records)."""
        return label_classes(self.dataset)

    @property
    def label_columns(self) -> list[str]:
        return list(self.dataset.label_columns)

    @property
    def n_labels(self) -> int:
        """Joint label classes, including declared ones that no record holds."""
        return len(self.label_classes)

    @property
    def label_domain(self) -> dict[str, list[str]]:
        """Label column -> its values, the public domain the label classes are the product
        of (declared, or released by the discovery)."""
        domain = self.dataset.label_domain or {}
        return {col: list(domain[col]) for col in self.label_columns}

    def label_dict(self, code: int) -> dict[str, str]:
        """Label column -> value of joint class ``code``."""
        return dict(zip(self.label_columns, self.label_classes[code], strict=True))

    # -- per-record fields (lazy) -----------------------------------------------------------
    def __len__(self) -> int:
        return len(self.dataset)

    @cached_property
    def label_codes(self) -> np.ndarray:
        """Joint label code of every record (local steps only)."""
        return np.asarray(self.dataset.joint_label_codes()[0], dtype=np.int64)

    @cached_property
    def users(self) -> np.ndarray | None:
        """Dense user index of every record with ``privacy.unit: user``, else None."""
        if self.config.privacy.unit != "user":
            return None
        _, inverse = np.unique(np.asarray(self.dataset.users), return_inverse=True)
        return inverse.astype(np.int64)

    @property
    def texts(self) -> list[str]:
        return self.dataset.texts

    @property
    def private_embeddings(self) -> np.ndarray:
        """Embeddings of the private texts (local steps only; computed on first use)."""
        return self._embeddings()

    def close(self) -> None:
        """Release the compute engine's workers."""
        try:
            self.compute.close()
        except Exception as err:  # the run's outcome stands; note it for the operator
            self.log(f"compute engine did not close cleanly: {type(err).__name__}")

    def log(self, message: str) -> None:
        """Progress note to log.txt (counts and names only; never private text)."""
        self.run.log(message)


class Releaser:
    """The only door from a method to the privacy session: Gaussian releases at the run's noise
    multiplier, noisy counts at an explicit scale, keyed noise streams and externally noised
    rounds (charged before they run).

    ``sigma`` is the noise multiplier; with epsilon = inf (``private`` False) the true value
    is returned and nothing is stored."""

    def __init__(self, session: PrivacySession, sigma: float, private: bool = True) -> None:
        self._session = session
        self.sigma = float(sigma)
        self.private = private

    def noise_variance(self, cells: int = 1) -> float:
        """The variance of the noise on a sum of ``cells`` values of one :meth:`gaussian`
        release at sensitivity 1 (0 when nothing is noised): what post-processing of the
        released values may weigh them by."""
        return self.sigma ** 2 * cells if self.private else 0.0

    def gaussian(self, key: str, value: np.ndarray, sensitivity: float,
                 name: str = "gaussian", *, std: float | None = None,
                 lattice: Lattice | None = None) -> np.ndarray:
        """value + discrete Gaussian noise of std ``std`` on the public ``lattice`` through the
        session (stored, accounted, resumable; docs/methods.md §0); ``std`` defaults to
        sigma x sensitivity, ``lattice`` None rounds a real value onto the fixed-point grid."""
        value = np.asarray(value, dtype=np.float64)
        if not self.private:
            return value
        std = self.sigma * sensitivity if std is None else std
        return np.asarray(self._session.gaussian(key, value, sensitivity, std, name=name,
                                                 lattice=lattice))

    def noisy_counts(self, key: str, counts: Any, sigma: float, name: str,
                     lattice: Lattice | None = None) -> Any:
        """Noisy counts at an explicit noise scale (label-domain discovery)."""
        return self._session.noisy_counts(key, counts, sigma, name=name, lattice=lattice)

    def noise_for(self, key: str) -> NoiseSource:
        """The key's own noise stream (mechanism randomness such as Poisson coins)."""
        return self._session.noise_for(key)

    def external_round(self, key: str, event: Event, compute: Callable[[], np.ndarray],
                       folder: Path) -> np.ndarray:
        """A value noised outside this process (a federated round), charged before it runs."""
        from .federated.rounds import accounted_round

        return accounted_round(self._session, key, event, compute, folder)

    @property
    def session(self) -> PrivacySession:
        """The session itself, for mechanisms that release through it directly
        (representatives.release_representatives)."""
        return self._session

    def mechanisms(self) -> list[dict[str, Any]]:
        """The accountant's summary of what was released so far."""
        return self._session.accountant.summary()

    def statement(self, unit: str, target: tuple[float, float]) -> dict[str, Any]:
        return self._session.statement(unit, target)
