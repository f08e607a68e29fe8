"""Pure (Flower-free) parts of WASP's federated voting: party data, local noisy votes, quantisation.

Federated WASP (docs/methods.md §2, "Federated variant"): party l holds records, computes its
local vote histogram h_l, clips every coordinate to [0, B] (B = the public vote bound, from
``wasp.federated.max_records_per_party``), adds its own noise share N(0, sigma^2 / P) and only
the secure sum sum_l (clip_B(h_l) + n_l) = H + N(0, sigma^2) reaches the server (SecAgg+).

Everything that shapes the round (B, the clipping range C, the grid, the modulus) is a function
of public inputs only: the config (B, P, R, the modulus) and sigma (the noise multiplier
calibrated from the privacy target). No party size enters: a C derived from the largest party
would put the released sum on a grid whose step reveals that size.

Sensitivity. A neighbouring dataset adds or removes one record, which belongs to one party l
(the simulated split is record-local, ``dpsynth.federated.split``); only h_l changes, by at most
the vote function's L2 sensitivity S (Top-Q: sqrt(8/3 (1 - 4^-Q))). Clipping each coordinate to
[0, B] is 1-Lipschitz per coordinate, so ||clip_B(h_l') - clip_B(h_l)||_2 <= ||h_l' - h_l||_2
<= S, and the sum over parties keeps L2 sensitivity S whatever B is; a B below a party's true
vote mass costs utility (votes are cut), never privacy.

Quantisation and noise. SecAgg+ sums integers: each party's vector is clipped to [-C, C] and
mapped to the grid -C + Delta * Z with Delta = 2C / R (R = quantization_range). C is a power of
two >= B + k * sigma / sqrt(P) (k = 10 standard deviations of a party's noise share), and R a
power of two large enough that Delta <= 2^-(Q-1), the lattice of WASP's Top-Q votes
(``plan_quantisation(vote_grid=...)``), so every vote vector lies exactly on the grid. Each party
adds its share of the *distributed discrete Gaussian* on that grid (Kairouz, Liu and Steinke,
ICML 2021; :mod:`dpsynth.privacy.distributed`): integer steps Z_l ~ N_Z(0, (sigma / sqrt(P) /
Delta)^2) drawn exactly from its own noise source (:func:`party_submission`). SecAgg+'s
quantisation is then exact, the unmasked sum is sum_l (clip_B(h_l) + Delta Z_l), and the round
is charged by the KLS bound for the fewest parties that can be in the sum
(``DistributedDiscreteGaussianEvent``). The one event outside it: a party's value clipped at C,
which needs its noise to exceed k standard deviations; its probability in a round is at most
``clip_probability_bound`` = 2 * P * dim * Phi(-k) (about 1.5e-23 per coordinate for k = 10;
the discrete Gaussian's tails are no heavier than the continuous one's). A round is therefore
(epsilon, delta + beta)-DP with beta that bound; the run adds beta for every planned round to
its delta (:func:`round_clip_delta`, ``Wasp.release_plan``), from public inputs only (C is
at least B + k sigma / sqrt(P) by construction, so beta does not depend on sigma).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dpsynth.errors import ComputeError
from dpsynth.privacy.distributed import DEFAULT_NOISE_BOUND_SDS, QuantisationPlan

if TYPE_CHECKING:
    from dpsynth.privacy.noise import NoiseSource

VoteFn = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray]
"""vote_fn(party_embeddings, party_labels, candidate_embeddings, candidate_labels) -> flat hist."""



class FederatedRoundError(ComputeError):
    """A federated round did not release anything (protocol halted or too few parties)."""


class InsufficientPartiesError(FederatedRoundError):
    """Fewer parties than the configured minimum contributed: nothing is released."""


@dataclass
class PartyData:
    """One party's private records: unit-norm embeddings [m_l, d] and int label codes [m_l]
    (m_l may be 0: an empty party still adds its noise share)."""

    embeddings: np.ndarray
    labels: np.ndarray

    def __post_init__(self) -> None:
        emb = np.asarray(self.embeddings)
        lab = np.asarray(self.labels)
        if emb.ndim != 2:
            raise ValueError(f"PartyData.embeddings must be 2-D [m, d], got shape {emb.shape}")
        if lab.ndim != 1 or lab.shape[0] != emb.shape[0]:
            raise ValueError(
                f"PartyData.labels must be 1-D with {emb.shape[0]} entries, got shape {lab.shape}"
            )
        if not np.issubdtype(lab.dtype, np.integer):
            raise ValueError(f"PartyData.labels must be integer codes, got dtype {lab.dtype}")
        self.embeddings = emb.astype(np.float32, copy=False)
        self.labels = lab.astype(np.int64, copy=False)

    @property
    def size(self) -> int:
        return int(self.embeddings.shape[0])


@dataclass
class FederatedResult:
    """Outcome of one federated round: the released secure sum and how to account for it."""

    histogram: np.ndarray
    parties_present: int
    num_parties: int
    sigma: float
    effective_sigma: float
    clipping_range: float
    clip_probability_bound: float


def grid_top_q(top_q: int, step: float) -> int:
    """The Top-Q depth whose weights 2^-q (q < Q') all lie on SecAgg+'s grid of ``step``: Q
    itself when the grid is fine enough, else the weights below the step are left out (each
    record's vote vector only shrinks, so the sensitivity of Q still bounds it). Raises when
    not even weight 1 is on the grid (noise far beyond any vote)."""
    depth = min(int(top_q), 1 - int(math.log2(step)))
    if depth < 1:
        raise ValueError(f"SecAgg+'s grid step {step:g} is coarser than a whole vote: the noise "
                         "is too large for the secure sum's modulus; raise privacy.epsilon or "
                         "lower wasp.federated.max_records_per_party")
    return depth


def clip_probability_bound(plan: QuantisationPlan, sigma: float, num_parties: int,
                           dim: int) -> float:
    """P(any party's value leaves [-C, C]) <= 2 * P * dim * Phi(-(C - B) / (sigma / sqrt(P)))."""
    margin = plan.clipping_range - plan.vote_bound
    if margin <= 0:
        return 1.0
    if sigma == 0:
        return 0.0
    z = margin / (sigma / math.sqrt(num_parties))
    tail = 0.5 * math.erfc(z / math.sqrt(2.0))
    return min(1.0, 2.0 * num_parties * dim * tail)


def round_clip_delta(num_parties: int, dim: int,
                     noise_bound_sds: float = DEFAULT_NOISE_BOUND_SDS) -> float:
    """A bound on a round's clipping probability that holds for every sigma of a plan whose
    C was chosen by :func:`plan_quantisation` (C >= B + k sigma / sqrt(P)): 2 P dim Phi(-k),
    the delta a round adds beside its KLS accounting."""
    tail = 0.5 * math.erfc(noise_bound_sds / math.sqrt(2.0))
    return min(1.0, 2.0 * num_parties * dim * tail)


def party_seed(seed: int, party_index: int) -> int:
    """Independent per-party noise seed derived from the round seed (research mode only)."""
    state = np.random.SeedSequence([int(seed), 0x5EC466, int(party_index)]).generate_state(2)
    return int(state[0]) << 32 | int(state[1])


def party_source(noise_mode: str, seed: int | None, party_index: int) -> NoiseSource:
    """Party l's own noise source: seeded per party (research mode), or the OS
    CSPRNG; it draws the party's discrete Gaussian share."""
    from dpsynth.privacy.noise import make_noise_source

    if noise_mode == "seeded":
        pseed = None if seed is None else party_seed(seed, party_index)
        return make_noise_source("seeded", pseed)
    if noise_mode == "secure":
        return make_noise_source("secure", None)
    raise ValueError(f"noise_mode must be 'seeded' or 'secure', got {noise_mode!r}")


def clip_votes(hist: np.ndarray, vote_bound: float) -> np.ndarray:
    """clip_B(h): every coordinate into [0, B]; 1-Lipschitz per coordinate, so it never raises
    the L2 distance between neighbouring histograms (see the module docstring)."""
    return np.clip(np.asarray(hist, dtype=np.float64), 0.0, float(vote_bound))


def local_votes(party: PartyData, candidate_embeddings: np.ndarray,
                candidate_labels: np.ndarray, vote_fn: VoteFn, vote_bound: float) -> np.ndarray:
    """Party's local vote histogram clip_B(h_l): clipped to the public bound, never refused (a
    refusal would make the round's outcome depend on the party's data)."""
    hist = np.asarray(
        vote_fn(party.embeddings, party.labels, candidate_embeddings, candidate_labels),
        dtype=np.float64,
    )
    if hist.ndim != 1:
        raise ValueError(f"vote_fn must return a flat histogram, got shape {hist.shape}")
    if not np.all(np.isfinite(hist)):
        raise ValueError("vote_fn returned non-finite values")
    return clip_votes(hist, vote_bound)


def party_submission(party: PartyData, candidate_embeddings: np.ndarray,
                     candidate_labels: np.ndarray, vote_fn: VoteFn, *, sigma: float,
                     num_parties: int, vote_bound: float, clipping_range: float,
                     quantization_range: int, noise_mode: str, seed: int | None,
                     party_index: int) -> np.ndarray:
    """What party l hands to SecAgg+ (which masks it): clip_B(h_l) plus its discrete Gaussian
    share of std sigma / sqrt(P) on SecAgg+'s grid Delta Z (Kairouz, Liu & Steinke 2021;
    :func:`dpsynth.privacy.distributed.party_share`), clipped to [-C, C]. The votes must lie on
    the grid (``plan_quantisation(vote_grid=...)``); then SecAgg+'s quantisation is exact and
    the unmasked sum is the parties' integer sum times Delta."""
    from dpsynth.privacy.distributed import party_share, share_sigma

    step = 2.0 * clipping_range / quantization_range
    hist = local_votes(party, candidate_embeddings, candidate_labels, vote_fn, vote_bound)
    source = party_source(noise_mode, seed, party_index)
    steps = party_share(hist, step, share_sigma(sigma, num_parties), source)
    return np.clip(steps.astype(np.float64) * step, -clipping_range, clipping_range)


def effective_sigma(sigma: float, parties_present: int, num_parties: int) -> float:
    """Std of the total noise when only parties_present of P noise shares arrive."""
    return sigma * math.sqrt(parties_present / num_parties)


def validate_parties(parties: Sequence[PartyData]) -> int:
    """Check the party list; return the embedding dimension."""
    if len(parties) < 2:
        raise ValueError(f"federated voting needs >= 2 parties, got {len(parties)}")
    dims = set()
    for i, p in enumerate(parties):
        if not isinstance(p, PartyData):
            raise TypeError(f"parties[{i}] must be PartyData, got {type(p).__name__}")
        dims.add(int(p.embeddings.shape[1]))
    if len(dims) != 1:
        raise ValueError(f"parties disagree on the embedding dimension: {sorted(dims)}")
    return dims.pop()
