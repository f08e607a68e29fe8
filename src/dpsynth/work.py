"""What a run does, counted from its plan: pure arithmetic over public counts, no model.

Each method states its own work through the method seam (``planned_work``): texts generated,
records and texts embedded, voting rounds, and rows of its own (:class:`Stage`).
:mod:`dpsynth.estimate` turns the counts into seconds at the rates it measures on this
machine. Light on purpose: a method module imports it without loading a model library.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Stage:
    """One row of the estimate: its ``stage``, the ``work`` it does, its ``seconds`` (None:
    not estimated, ``note`` says why; 0 with ``note`` "negligible")."""

    stage: str
    work: str
    seconds: float | None
    note: str = ""

    @property
    def time_text(self) -> str:
        if self.seconds is None:
            return f"not estimated: {self.note}"
        return self.note if self.note else duration(self.seconds)


def duration(seconds: float) -> str:
    """``about 40 s``, ``about 3 min``, ``about 1 h 20 min``."""
    if seconds < 1:
        return "under 1 s"
    if seconds < 90:
        return f"about {seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 90:
        return f"about {minutes} min"
    return f"about {minutes // 60} h {minutes % 60:02d} min"


def split_evenly(n: int, parts: int) -> list[int]:
    """``n`` texts over ``parts`` generators, as even as can be."""
    return [n // parts + (1 if g < n % parts else 0) for g in range(parts)]


@dataclass(frozen=True)
class Work:
    """What a PE-family run does, from its plan: texts generated (``shares``: how many each
    generator writes, where the method says; empty: spread evenly), private records embedded
    (once), synthetic texts embedded (each new candidate once: the embedder's cache holds the
    others), voting rounds; ``vote``: the vote's name in the table; ``prompts``: what the
    prompts carry beyond a short instruction (their reading is not timed)."""

    generations: int
    private_records: int
    synthetic_embeds: int
    iterations: int
    shares: tuple[int, ...] = ()
    vote: str = "private vote and noise"
    prompts: str = ""


def pe_work(records: int, samples: int, candidates: int, population: int, iterations: int,
            lookahead: int = 0) -> Work:
    """Aug-PE's arithmetic: the initial pool (``max(samples, candidates)``, the zero-shot
    reference drawn from it), then each round but the last the ``candidates - population``
    variations of the kept samples, and after the last the release's top-up to ``samples``;
    ``lookahead`` variations of every candidate a round (generated and embedded). Each round
    embeds its candidates, of which only the new ones cost (the first round's pool, then the
    variations: the kept samples come from the embedding cache); the private records are
    embedded once when there is a vote."""
    generations = max(samples, candidates)
    embeds = 0
    if iterations:
        variations = (iterations - 1) * max(candidates - population, 0)
        looked = iterations * candidates * lookahead
        generations += variations + max(samples - population, 0) + looked
        embeds = candidates + variations + looked
    return Work(generations, records if iterations else 0, embeds, iterations)


def secpe_work(records: int, samples: int, pool_multiplier: int, iterations: int) -> Work:
    """SecPE's arithmetic (docs/methods.md §3): Aug-PE's selection and variation
    (:func:`pe_work`) with every label's quota kept a round (population = ``samples``,
    ``samples x L`` candidates), no lookahead; its vote goes through noisy cluster
    representatives."""
    work = pe_work(records, samples, samples * pool_multiplier, samples, iterations)
    return replace(work, vote="representative vote and noise")


def wasp_voted(samples: int, iterations: int) -> int:
    """The candidates WASP's last vote sees: every round of the T + 1 but the last, which is
    written after it (rounds split as :func:`split_evenly` splits them)."""
    return samples - split_evenly(samples, iterations + 1)[-1]


def wasp_work(records: int, samples: int, iterations: int, generators: int,
              demonstrations: int = 0) -> Work:
    """WASP's arithmetic (docs/methods.md §2): ``samples`` texts written over the T + 1
    rounds (as evenly as WASP splits each label's quota, the first rounds taking the
    remainder), each round's split over the ``generators`` by their weights: even at the
    start; later weights follow the votes, unknown before the run, so evenly here too. Rounds
    1..T are written from contrastive prompts of up to ``demonstrations`` texts (0: zero-shot
    prompts). Vote t embeds the pool of rounds 0..t, the earlier rounds from the embedding
    cache: rounds 0..T-1 are embedded once each; the private records once."""
    rounds = split_evenly(samples, iterations + 1)
    shares = [0] * generators
    for size in rounds:
        for g, n in enumerate(split_evenly(size, generators)):
            shares[g] += n
    prompts = (f"; {samples - rounds[0]} contrastive, up to {demonstrations} demonstrations "
               "a prompt (their reading not timed)" if iterations and demonstrations else "")
    return Work(samples, records if iterations else 0, wasp_voted(samples, iterations), iterations,
                tuple(shares), "Top-Q nearest and furthest histograms and noise", prompts)


def wasp_stages(parties: int, iterations: int) -> list[Stage]:
    """WASP's own stages: federated voting rounds (Flower's SecAgg+ over ``parties``
    simulated parties, a Ray start each round) when on, not estimated."""
    if not parties or not iterations:
        return []
    return [Stage("federated rounds", f"{iterations} round(s) of SecAgg+ over {parties} "
                  "parties", None, "Flower and Ray are not calibrated")]


def secpe_stages(records: int, clusters: int, detection_s: float | None,
                 iterations: int) -> list[Stage]:
    """SecPE's own stages: the secret detection over every record and the SecretNoise
    calibration, as long as they took when ``dpsynth plan`` ran them on the data
    (``detection_s``; None: not run), and the public KMeans (``clusters`` centres over the
    records without a secret, once) negligible."""
    stages = [Stage("secret detection and noise calibration",
                    f"{records} records (timed when this plan ran it on the data)", detection_s,
                    "" if detection_s is not None else "not run by this plan")]
    if iterations:
        stages.append(Stage("public clustering (KMeans)", f"{clusters} centres over the "
                            "records without a secret, once", 0.0, "negligible"))
    return stages


@dataclass(frozen=True)
class TuneWork:
    """What a dp_finetune run does: ``steps`` DP-SGD steps of ``batch`` expected units
    (records, or users: ``unit``) of up to ``max_tokens`` tokens, then ``samples`` texts of
    up to ``sample_tokens`` new tokens sampled from the tuned model; ``workers``: the
    processes its per-record gradients run in, one thread each."""

    steps: int
    batch: float
    max_tokens: int
    samples: int
    sample_tokens: int
    unit: str = "record"
    workers: int = 1


@runtime_checkable
class TuningMethod(Protocol):
    """A method that trains a model on the private records (dp_finetune): it counts its own
    training and sampling from its privacy plan and the number of ``units`` (records or
    users) that set its sampling rate."""

    def tune_work(self, config: Any, plan: Any, units: int) -> TuneWork: ...

    def training_key(self, config: Any) -> str | None:
        """What its per-gradient cost depends on (the cache key of its calibration), or
        None where it is not calibrated."""
        ...

    def training_probe(self, config: Any) -> Any:
        """What its calibration times (the model loaded, public records)."""
        ...

    def gradients_per_second(self, probe: Any) -> float:
        """Per-record gradients a second on one thread of ``probe``."""
        ...

    def plan_noisy_steps(self, config: Any, plan: Any
                         ) -> tuple[dict[str, float] | None, str | None]:
        """(the gradient noise over the largest mean gradient from public values, a step's
        and the run's, with the run's steps; the warning when it is too large); (None, None)
        where it would follow from the private count."""
        ...
