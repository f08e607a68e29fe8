"""A run's releases, planned before their noise multiplier is chosen (docs/methods.md §0).

A method hands the calibration and the planner a :class:`ReleasePlan`: a value, built once
from the config, that gives the run's privacy events at any trial multiplier. The calibration
evaluates it here, on the privacy floor, so nothing calls back into the method that made it
(docs/architecture.md, "Floors")."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from .distributed import plan_quantisation, share_sigma
from .events import DistributedDiscreteGaussianEvent, Event


@dataclass(frozen=True)
class Scaled:
    """A release whose noise is the chosen multiplier times ``factor``: ``event`` (a Gaussian,
    discrete Gaussian or distributed discrete Gaussian event at any sigma) with its ``sigma``
    replaced."""

    event: Event
    factor: float = 1.0

    def at(self, sigma: float) -> Event:
        return dataclasses.replace(self.event, sigma=sigma * self.factor)


def secagg_rounds_event(noise: float, sensitivity: float, parties: int, charged: int,
                        dimension: int, count: int, vote_bound: float, vote_grid: float,
                        name: str = "topq_votes") -> DistributedDiscreteGaussianEvent:
    """The charge of ``count`` secure-sum rounds of total noise std ``noise`` (docs/methods.md
    §2): each of ``parties`` adds a discrete Gaussian share of std noise / sqrt(P) on SecAgg+'s
    grid, planned from the vote bound, that noise and P only (:func:`plan_quantisation`), and a
    round is charged at the fewest shares that can be in the sum, ``charged`` (Kairouz, Liu &
    Steinke 2021)."""
    grid = plan_quantisation(vote_bound=vote_bound, sigma=noise, num_parties=parties,
                             vote_grid=vote_grid).step
    return DistributedDiscreteGaussianEvent(
        sigma=share_sigma(noise, parties), sensitivity=sensitivity, parties=charged,
        dimension=dimension, grid=grid, count=count, name=name)


@dataclass(frozen=True)
class SecAggRounds:
    """Federated rounds whose total noise is the chosen multiplier times ``sensitivity``
    (:func:`secagg_rounds_event`: the grid follows the noise)."""

    sensitivity: float
    parties: int
    charged: int
    dimension: int
    count: int
    vote_bound: float
    vote_grid: float
    name: str = "topq_votes"

    def at(self, sigma: float) -> Event:
        return secagg_rounds_event(sigma * self.sensitivity, self.sensitivity, self.parties,
                                   self.charged, self.dimension, self.count, self.vote_bound,
                                   self.vote_grid, self.name)


#: one planned release: an event whose noise is fixed, or one that follows the multiplier
Planned = Event | Scaled | SecAggRounds


@dataclass(frozen=True)
class ReleasePlan:
    """Every release of a run, as a value: ``releases`` (fixed events, such as releases
    already made, and releases at the multiplier still to be chosen) and ``delta_outside``,
    delta taken by events the accountant does not model (federated WASP's clipping at
    SecAgg+'s range), left out of the accountant's target and added to the stated delta."""

    releases: tuple[Planned, ...] = ()
    delta_outside: float = 0.0

    def at(self, sigma: float) -> list[Event]:
        """The run's privacy events at noise multiplier ``sigma``."""
        return [r.at(sigma) if isinstance(r, Scaled | SecAggRounds) else r
                for r in self.releases]

    @property
    def noised(self) -> int:
        """How many releases follow the multiplier (0: nothing to calibrate)."""
        return sum(r.count if isinstance(r, SecAggRounds) else int(getattr(r.event, "count", 1))
                   for r in self.releases if isinstance(r, Scaled | SecAggRounds))

    def after(self, spent: Sequence[Event]) -> ReleasePlan:
        """This plan after the releases ``spent`` (label-domain discovery), composed with it."""
        return ReleasePlan((*spent, *self.releases), self.delta_outside)
