"""Parts the PE-family strategies share and compose (docs/methods.md §1): the noisy label
quota, the zero-shot reference set, selection with variation, the final trim to the quota and
Aug-PE's lookahead."""

from __future__ import annotations

import numpy as np

from ..config import SynthesisConfig
from ..context import PrivateView, Releaser, Rngs
from ..errors import PrivacyError
from ..privacy.lattice import count_lattice
from .lengths import Sizes, exact_label_lengths
from .operators import Generation
from .pool import Pool
from .selection import allocate, select_per_label, split_weights


def noisy_label_counts(view: PrivateView, releaser: Releaser) -> np.ndarray | None:
    """The DP label counts (one Gaussian release, L2 sensitivity 1); None for one label
    class, where nothing is released."""
    if view.n_labels == 1:
        return None
    counts = view.compute.label_counts(view.n_labels)
    lattice = count_lattice(view.config.privacy.unit == "user")
    return np.asarray(releaser.gaussian("label_counts", counts, 1.0, name="label_counts",
                                        lattice=lattice))


def quota_of(noisy: np.ndarray | None, total: int, noise_var: float = 0.0,
             split: str = "noisy_counts") -> np.ndarray:
    """``total`` samples split over labels by released counts (None: one label class), the
    counts first shrunk toward their mean by their noise variance, or evenly
    (:func:`split_weights`)."""
    return np.array([total]) if noisy is None else allocate(
        total, split_weights(noisy, noise_var, split))


def noisy_quota(view: PrivateView, releaser: Releaser, total: int) -> np.ndarray:
    """Samples per label from DP label counts (never raw frequencies; docs/methods.md §0).
    One label class: no release, the whole total."""
    return quota_of(noisy_label_counts(view, releaser), total, releaser.noise_variance())


def released_sizes(view: PrivateView, releaser: Releaser) -> Sizes:
    """The noisy (label class x length bin) histogram (:mod:`dpsynth.evolution.lengths`),
    released under the label counts' name and lattice: one Gaussian release, L2 sensitivity
    1, in place of the label counts (docs/methods.md §1, "Sizes from the data")."""
    exact = exact_label_lengths(view.compute, view.n_labels)
    lattice = count_lattice(view.config.privacy.unit == "user")
    noisy = np.asarray(releaser.gaussian("label_counts", exact.ravel(), 1.0,
                                         name="label_counts", lattice=lattice))
    if noisy.size != exact.size:  # a stored release replayed on other label classes
        raise PrivacyError(f"the stored label_counts release has {noisy.size} cells, this "
                           f"run's (label x length) histogram {exact.size}: the label classes "
                           "changed since it was released; start a new run")
    return Sizes.of(noisy.reshape(exact.shape))


def first_per_label(pool: Pool, per_label: np.ndarray) -> Pool:
    """The first ``per_label[y]`` candidates of each label y, in pool order."""
    keep = [np.flatnonzero(pool.labels == y)[: int(n)] for y, n in enumerate(per_label)]
    return pool.take(np.sort(np.concatenate(keep)) if keep else np.zeros(0, np.int64))


#: Rounds of variations :func:`release_from_winners` asks for before it releases fewer texts
#: than the quota (each round only for the slots the rounds before left empty).
RELEASE_ROUNDS = 3


def release_from_winners(gen: Generation, winners: Pool, quota: np.ndarray, tag: str,
                         rounds: int = RELEASE_ROUNDS) -> Pool:
    """The release drawn from the last vote's winners (post-processing, no budget): every
    winner, then variations of the winners of label y, spread evenly over them, until
    ``quota[y]`` texts. A variation the filters refused on every retry leaves its slot empty;
    the next round (its own tag, so its own seeds) fills the empty slots from the winners
    that come next in turn, up to ``rounds`` rounds (fewer texts only where all failed, or a
    label has no winner)."""
    release = winners
    asked = np.zeros(len(quota), dtype=np.int64)  # variations asked for so far, per label
    for r in range(rounds):
        parents: list[int] = []
        for y, n_y in enumerate(quota):
            idx = np.flatnonzero(winners.labels == y)
            need = int(n_y) - int(np.count_nonzero(release.labels == y))
            if need > 0 and len(idx):
                parents.extend(idx[(asked[y] + np.arange(need)) % len(idx)].tolist())
                asked[y] += need
        if not parents:
            break
        more, _ = gen.variations(winners.take(np.asarray(parents, dtype=np.int64)), 1,
                                 tag if r == 0 else f"{tag}/more{r}")
        release = release.extend(more)
    return release


def zero_shot_to_quota(gen: Generation, quota: np.ndarray, tag: str,
                       rounds: int = RELEASE_ROUNDS) -> Pool:
    """RANDOM_API until ``quota[y]`` texts of each label y: the slots a generation refused on
    every retry left empty are asked for again in a further round (its own tag and seeds),
    up to ``rounds`` rounds. Reads no private record."""
    pool = gen.zero_shot(quota, tag)
    for r in range(1, rounds):
        have = np.bincount(pool.labels, minlength=len(quota))[:len(quota)]
        need = np.maximum(np.asarray(quota, dtype=np.int64) - have, 0)
        if not need.any():
            break
        pool = pool.extend(gen.zero_shot(need, f"{tag}/more{r}"))
    return pool


def reference_set(pool: Pool, quota: np.ndarray, rngs: Rngs) -> Pool:
    """The epsilon-0 reference of the evaluation (release/zero_shot.jsonl): quota[y] zero-shot
    samples per label drawn at random from the initial pool (only the split came from DP)."""
    rng = rngs("zero_shot_reference")
    keep: list[int] = []
    for y, n_y in enumerate(quota):
        idx = np.flatnonzero(pool.labels == y)
        keep.extend(rng.permutation(idx)[:n_y].tolist())
    return pool.take(np.array(sorted(keep), dtype=np.int64))


def trim_to_quota(pool: Pool, quota: np.ndarray, rngs: Rngs) -> Pool:
    """At most quota[y] samples per label, kept at random (in pool order): the released set.
    After a selection round this keeps everything; with T = 0 it subsamples the initial pool."""
    rng = rngs("finalize")
    keep: list[int] = []
    for y, n_y in enumerate(quota):
        idx = np.flatnonzero(pool.labels == y)
        keep.extend(idx if len(idx) <= n_y else rng.permutation(idx)[:n_y])
    return pool.take(np.array(sorted(keep), dtype=np.int64))


def lookahead_embeddings(gen: Generation, pool: Pool, emb: np.ndarray, n_look: int,
                         tag: str) -> np.ndarray:
    """Aug-PE's lookahead (section 3.2): a candidate is represented by the mean embedding of
    ``n_look`` of its variations (itself where none succeeded); 0 returns ``emb``."""
    if n_look == 0:
        return emb
    look, parents = gen.variations(pool, n_look, tag)
    look_emb = gen.embed(look.texts)
    sums = np.zeros(emb.shape, dtype=np.float64)
    np.add.at(sums, parents, look_emb)
    counts = np.bincount(parents, minlength=len(pool))[:, None]
    mean = np.where(counts > 0, sums / np.maximum(counts, 1), emb)
    return (mean / np.linalg.norm(mean, axis=1, keepdims=True)).astype(np.float32)


def select_and_vary(gen: Generation, rngs: Rngs, syn: SynthesisConfig, t: int, pool: Pool,
                    scores: np.ndarray, quota: np.ndarray, last: bool) -> Pool:
    """Aug-PE's next pool (docs/methods.md §1, steps 3d-3e): keep quota[y] per label by score,
    then L - 1 variations of each kept sample (none after the last vote)."""
    kept = pool.take(select_per_label(scores, pool.labels, quota, syn.selection,
                                      rngs(f"select{t}")))
    if last or syn.pool_multiplier == 1:
        return kept
    return kept.extend(gen.variations(kept, syn.pool_multiplier - 1, f"var{t}")[0])
