"""What a PE-family run's noise will do to its votes, before it spends anything
(``dpsynth plan CONFIG``; also shown by every run before the budget is reserved).

A candidate is selected by its noisy vote count. Per label, the M_y private records spread a
vote mass of m per record over the N_y L candidates of that label, so a candidate gets
``expected = m M / (N L)`` votes on average (m = sqrt(k) for Aug-PE's k nearest at weight
1/sqrt(k); sum_{q<Q} 2^-q for WASP's Top-Q near histogram; 1 for SecPE's representatives,
whose noisy counts carry the records' mass). The noise on each candidate's count has the
standard deviation ``sigma_vote`` of the vote release. When it is well above the expected
votes, the candidates kept are chosen by the noise, not by the data.

The plan is for the operator: it uses the exact record count (the operator's own knowledge of
the data), so it is printed to the terminal and kept in ``private/plan.json`` only, never in
release/, stats.jsonl or log.txt. ``dpsynth plan --records N`` works from a count the user
states, without the data.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from .evolution.lengths import tokens_for, words_within

if TYPE_CHECKING:
    from .config import RunConfig

#: noise / expected votes above which the selection is random, and above which it is mostly
#: noise
RANDOM_ABOVE = 3.0
NOISY_ABOVE = 1.0
#: expected votes per candidate over the noise on its count that the automatic voting
#: population aims for (and below which a population the user sets is warned about). At 2, a
#: candidate with its expected votes outranks one with none with probability
#: Phi(2 / sqrt(2)) = 0.92 under the noise of both counts; at 1 (the old default's regime)
#: only 0.76. Measured on a held-back question set (issue 44): 1.33 expected votes against
#: noise 1.88 added 5.8 accuracy points over zero-shot, 4.4 against 1.88 added 14.2.
VOTE_MARGIN = 2.0
#: the verdicts a run and ``dpsynth plan`` warn about
WARN_VERDICTS = ("thin", "noisy", "random")
#: texts released per member of the voting population above which the plan says the release
#: is drawn from few winners. Measured on Banking77's 10 intents, 500 records, N = 200
#: (docs/which-method.md): 30 voted for 200 texts (epsilon 1) scored 6.2 points under
#: zero-shot; about 3.5 texts a member (epsilon 4) and fewer (epsilon 8) were level with it.
FEW_WINNERS = 5
#: released texts per value of a label column below which the plan says the release's size
#: holds back a classifier trained on it. Measured on Banking77's 77 intents
#: (benchmarks/results/release_size_ceiling.json, side_by_side_release_size.md): 500 real
#: records (6.5 an intent) scored 0.508 and 2000 scored 0.809; 500 zero-shot texts 0.419 and
#: 2000 zero-shot texts 0.603. Yelp's 10 categories at 50 texts a value: 500 real reviews close
#: about 68 % of the zero-shot -> real gap. (A release far larger than the voting population
#: is drawn from few winners: FEW_WINNERS' note says to compare it with zero-shot.)
FEW_TEXTS_A_VALUE = 20


@dataclass(frozen=True)
class PlanInputs:
    """What a PE run's plan is computed from besides the config: the facts of the data it
    needs, read before anything is spent (``PEMethod.plan_inputs`` on the data, or stated by
    the user: ``dpsynth plan --records N --labels L``). With them the plan is a pure function
    (``dpsynth.methods.pe.plan_pe``) that ``dpsynth plan`` and the run share.

    ``records``: the record count (exact: the operator's plan only). ``labels``: the joint
    label classes (None: a label column is discovered by the run, a DP release, before it can
    calibrate; ``discover`` names those columns). ``words``: the records' exact length in
    words, for a method that estimates it (the plan shows it; the run uses its noisy
    estimate). ``sigma``: a noise multiplier the method fixed from the data (SecPE's, from
    its secrets), else None: calibrated from (epsilon, delta). ``spent``: releases already
    made (the label-domain discovery's, when the run plans again after it), composed with the
    plan's own. ``notes``: what the method's run needs from this step (handed on in
    ``PrivacyPlan.notes``)."""

    records: int
    labels: int | None
    words: int | None = None
    sigma: float | None = None
    discover: tuple[str, ...] = ()
    spent: tuple[Any, ...] = ()
    notes: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class VoteShape:
    """What one of a PE method's votes is, as the planner needs it: a value the method makes
    from its config (``PEMethod.votes``), so that planning never calls back into the method.

    ``private``: the method reads private records through noisy votes (False: zero-shot).
    ``sizes``: it sizes its voting population from a released count, which the run releases
    before its votes when ``counted``. ``estimates_length``: it estimates the texts' length
    from the records (Aug-PE's sizes histogram). ``from_winners``: its release is drawn from
    the last vote's winners and their variations (Aug-PE). ``mass``: the vote mass one record
    spreads over its label's candidates; ``noise``: the std of the noise on one candidate's
    votes per unit of the noise multiplier. ``per_member``: candidates voted on per member of
    the voting population (Aug-PE's pool_multiplier); ``pool``: where set, the most candidates
    a vote is on (WASP: the pool the last vote sees), told as ``whole`` when a vote is on all
    of it and as drawn from ``drawn`` when on a sample."""

    private: bool = True
    sizes: bool = False
    counted: bool = True
    estimates_length: bool = False
    from_winners: bool = False
    mass: float = 1.0
    noise: float = 1.0
    per_member: int = 1
    pool: int | None = None
    whole: str = ""
    drawn: str = ""


def voted_candidates(shape: VoteShape, population: int) -> tuple[int, str | None]:
    """The most candidates one vote is on, and how they are counted (None: the plan's usual
    words): ``population x per_member``, at most the shape's ``pool``."""
    candidates = population * shape.per_member
    if shape.pool is None:
        return candidates, None
    if candidates < shape.pool:
        return candidates, (f"{candidates} samples drawn from {shape.drawn} for each vote "
                            "(the voting population)")
    return shape.pool, f"about {shape.pool} samples: {shape.whole}"


@dataclass
class PlannedRelease:
    """One planned release: its name, count, L2 sensitivity and noise standard deviation."""

    name: str
    count: int
    sensitivity: float
    sigma: float


@dataclass
class RunPlan:
    """The planned releases of a run and what their noise does to the votes."""

    method: str
    epsilon: float
    delta: float
    records: int
    labels: int
    candidates: int  # per iteration, all labels
    noise_multiplier: float | None
    population: int = 0  # samples kept per voting round (candidates / pool_multiplier)
    samples: int = 0  # texts released
    releases: list[PlannedRelease] = field(default_factory=list)
    max_words: int | None = None  # the texts' length, where known before the run
    length_source: str = ""  # where the length comes from
    short_end: str = ""  # the short end of the length band, in words
    cap_note: str = ""  # generators whose own max_new_tokens cuts the texts shorter
    vote_noise: float | None = None  # std of the noise on one candidate's votes
    expected_votes: float | None = None  # per candidate, on average
    verdict: str = "ok"  # ok | noisy | random | none
    release_note: str = ""  # when the release is drawn from few winners
    size_note: str = ""  # when the release has few texts a label value
    message: str = ""

    @property
    def ratio(self) -> float | None:
        """Noise over expected votes per candidate."""
        if self.vote_noise is None or not self.expected_votes:
            return None
        return self.vote_noise / self.expected_votes

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio}

    def lines(self) -> list[str]:
        """The plan as the terminal shows it."""
        kept = (f" ({self.population} kept a round)" if self.population != self.candidates
                else "")
        out = [f"{self.method}: epsilon {self.epsilon:.3g}, delta {self.delta:.3g}; "
               f"{self.records} records, {self.labels} label classes, {self.candidates} "
               f"candidates per iteration{kept}, {self.samples} texts released"]
        if self.noise_multiplier is not None:
            out.append(f"  noise multiplier {self.noise_multiplier:.4g}")
        for r in self.releases:
            out.append(f"  {r.name}: {r.count} release{'s' if r.count != 1 else ''}, noise "
                       f"sigma {r.sigma / r.sensitivity:.4g} per unit of sensitivity")
        if self.length_source:
            words = (f"texts up to {self.max_words} words (max_new_tokens "
                     f"{tokens_for(self.max_words)}), " if self.max_words else "texts' length ")
            out.append(f"  {words}{self.length_source}")
            out.append(f"  {self.short_end}")
        if self.cap_note:
            out.append(f"  {self.cap_note}")
        if self.vote_noise is not None and self.expected_votes is not None:
            out.append(f"  votes per candidate: {self.expected_votes:.3g} expected, noise "
                       f"sigma {self.vote_noise:.3g}")
        if self.release_note:
            out.append(f"  {self.release_note}")
        if self.size_note:
            out.append(f"  {self.size_note}")
        if self.message:  # the last line: the callers print it apart when it is a warning
            out.append(f"  {self.message}")
        return out


#: the methods whose whole DP budget goes to votes: where their votes sit under the margin
#: (thin, noisy or random), the verdict also names DP fine-tuning, measured there (the
#: epsilon 1 Banking77 runs were thin: noise 0.75x the expected votes; issue 45)
VOTE_ONLY_METHODS = ("aug_pe", "wasp")


def verdict(config: RunConfig, noise: float, expected: float, mass: float,
            population: int | None = None, candidates: str | None = None) -> tuple[str, str]:
    """(ok | thin | noisy | random, the sentence the operator reads); ``population``: the
    samples kept per round (``synthesis.samples`` when None); ``candidates``: how the voted
    candidates are counted, when the method counts them otherwise (WASP's rounds)."""
    population = config.synthesis.samples if population is None else population
    syn = config.synthesis
    ratio = noise / expected if expected > 0 else math.inf
    counted = candidates or (f"population {population} x pool_multiplier "
                             f"{syn.pool_multiplier}")
    head = (f"at epsilon {config.privacy.epsilon:.3g} the noise on each candidate's votes "
            f"(sigma {noise:.3g}) is {ratio:.3g}x the expected votes per candidate "
            f"({expected:.3g} = records x {mass:.3g} / ({counted})"
            + ("; at user level each user's votes are scaled to norm 1, so fewer" if
               config.privacy.unit == "user" else "") + ")")
    fix = ("raise privacy.epsilon, or lower synthesis.population (Aug-PE, WASP; "
           "synthesis.samples elsewhere), synthesis.pool_multiplier or synthesis.iterations, "
           "or bring more records")
    if config.method in VOTE_ONLY_METHODS:  # the measured alternative where votes drown
        fix += ("; or run method dp_finetune, which spends the budget on training the "
                "generator instead of votes (docs/which-method.md: at epsilon 1 on 2000 "
                "Banking77 records it beat Aug-PE in both runs)")
    if ratio > RANDOM_ABOVE:
        return "random", f"{head}: the selection will be random; {fix}"
    if ratio > NOISY_ABOVE:
        return "noisy", f"{head}: the selection will be mostly noise; {fix}"
    if ratio > 1.0 / VOTE_MARGIN:
        return "thin", (f"{head}: below the margin of {VOTE_MARGIN:g}x the noise, the votes "
                        f"stand out only weakly; {fix}")
    return "ok", f"{head}: the votes stand out from the noise"


def auto_population(config: RunConfig, shape: VoteShape, records: float, labels: int,
                    sigma: float) -> int:
    """The voting population that gives a candidate :data:`VOTE_MARGIN` x the noise in
    expected votes: ``floor(records m / (L margin sigma_vote))`` (m: one record's vote mass,
    L: the candidates voted on per member of the population: Aug-PE's pool_multiplier,
    WASP's 1), at least one sample per label class and at most ``synthesis.samples``.
    ``records`` is a released noisy count in a run (the plan shows it from the exact one)."""
    syn = config.synthesis
    if not sigma or sigma <= 0 or not syn.iterations:
        return syn.samples
    noise = sigma * shape.noise
    per = max(1, int(voted_candidates(shape, 1)[0]))
    fit = math.floor(max(records, 0.0) * float(shape.mass) / (per * VOTE_MARGIN * noise))
    return int(min(syn.samples, max(fit, labels)))


def voting_population(config: RunConfig, shape: VoteShape, records: float, labels: int,
                      sigma: float | None) -> int:
    """The voting population: ``synthesis.population`` when set (at most ``samples``), else
    :func:`auto_population` for a method that sizes its votes from a released count, else
    ``synthesis.samples``. A run that releases no count before its votes (WASP on one label
    class) has none to size from and votes on every candidate."""
    syn = config.synthesis
    if not shape.sizes:
        return syn.samples
    if syn.population is not None:
        return min(syn.population, syn.samples)
    if not shape.counted:
        return syn.samples
    return auto_population(config, shape, records, labels, sigma or 0.0)


def plan_length(config: RunConfig, shape: VoteShape, exact_words: int | None
                ) -> tuple[int | None, str]:
    """(words, where they come from) of the texts a method that estimates their length
    writes: ``synthesis.max_words`` when declared, else the run's DP estimate, shown from the
    exact lengths (``exact_words``, the operator's plan only) when the data is at hand."""
    if not shape.estimates_length:
        return None, ""
    if config.synthesis.max_words is not None:
        return config.synthesis.max_words, "declared (synthesis.max_words)"
    if exact_words is not None:
        return exact_words, ("from the records' lengths; the run uses its noisy estimate, "
                             "released with the label counts")
    return None, "from the records: estimated by the run, released with the label counts"


def generator_caps(config: RunConfig, words: int | None) -> str:
    """What the plan says of generators whose own ``max_new_tokens`` holds fewer words than
    the texts' length (``words``; None: not known before the run, nothing said): their texts
    stop there whatever the length, trimmed back to a full sentence ("" when none)."""
    if words is None:
        return ""
    capped = [(g.short_name, g.max_new_tokens) for g in config.generators
              if g.max_new_tokens and words_within(g.max_new_tokens) < words]
    if not capped:
        return ""
    each = ", ".join(f"{name} at {cap} tokens (about {words_within(cap)} words)"
                     for name, cap in capped)
    return (f"generators' own max_new_tokens cut the texts shorter: {each}; raise or unset it "
            "to write at the records' length")


def plan_run(config: RunConfig, shape: VoteShape, guarantee: str, records: int, labels: int,
             sigma: float | None, exact_words: int | None = None,
             releases: Sequence[Any] = ()) -> RunPlan:
    """The plan of a PE-family run on ``records`` records in ``labels`` label classes at noise
    multiplier ``sigma`` (the run's: calibrated from the config, or SecPE's from its secrets;
    None when nothing is noised), from values the method hands down: what one vote is
    (``shape``), the run's ``guarantee`` and its ``releases`` at ``sigma`` (privacy events)."""
    syn = config.synthesis
    population = voting_population(config, shape, records, labels, sigma)
    candidates, counted = voted_candidates(shape, population)
    # a population above the candidates a vote is on (WASP's pool, smaller early on) is that
    plan = RunPlan(config.method, config.privacy.epsilon, config.privacy.delta, records, labels,
                   candidates, None, population=min(population, candidates),
                   samples=syn.samples)
    plan.size_note = few_texts_note(config, syn.samples, labels)
    plan.max_words, plan.length_source = plan_length(config, shape, exact_words)
    if plan.length_source:
        least = config.synthesis.min_words
        reach = " where a request's token cap can reach that length"
        if least:
            plan.short_end = (f"texts under {least} words are regenerated "
                              f"(synthesis.min_words){reach}")
        elif config.synthesis.max_words is None:
            plan.short_end = ("texts shorter than the 10th percentile's length bin of the run's "
                              f"noisy length estimate are regenerated{reach}")
        else:
            plan.short_end = "no short end: declare synthesis.min_words to set one"
        plan.cap_note = generator_caps(config, plan.max_words)
    if not sigma or not shape.private or guarantee not in ("dp", "secret-protection"):
        plan.verdict = "none"
        plan.message = ("no private votes: nothing is noised" if not shape.private else
                        "epsilon is infinite: the votes are not noised (no DP guarantee)")
        return plan
    plan.noise_multiplier = float(sigma)
    for event in releases:
        plan.releases.append(PlannedRelease(
            getattr(event, "name", None) or "votes", int(getattr(event, "count", 1)),
            float(event.sensitivity), float(event.sigma)))
    if syn.iterations:
        plan.vote_noise = float(sigma * shape.noise)
        plan.expected_votes = records * shape.mass / candidates
        plan.verdict, plan.message = verdict(config, plan.vote_noise, plan.expected_votes,
                                             shape.mass, population, counted)
        if shape.from_winners:
            plan.release_note = few_winners_note(syn.samples, plan.population)
    return plan


def few_winners_note(samples: int, population: int) -> str:
    """What the plan says when ``samples`` texts are released from a voting population of
    ``population`` (more than :data:`FEW_WINNERS` texts a member): '' otherwise."""
    if population <= 0 or samples <= FEW_WINNERS * population:
        return ""
    return (f"the release is {samples} texts drawn from the {population} winners of the last "
            f"vote and their variations ({samples / population:.3g} a winner), less varied "
            f"than {samples} zero-shot texts: at this epsilon and record count run a zero_shot "
            "set beside it and release the one its evaluation prefers (docs/which-method.md)")


def few_texts_note(config: RunConfig, samples: int, labels: int) -> str:
    """What the plan says when ``samples`` texts are fewer than :data:`FEW_TEXTS_A_VALUE`
    a value of some label column (its declared values; with one column and none declared,
    the run's ``labels`` classes): '' otherwise."""
    values = {c: len(v) for c, v in config.data.declared_label_values().items()}
    if not values and len(config.data.labels) == 1 and labels:
        values = {config.data.labels[0]: int(labels)}
    if not values:
        return ""
    column, most = max(values.items(), key=lambda kv: kv[1])
    if most < 2 or samples >= FEW_TEXTS_A_VALUE * most:
        return ""
    return (f"{samples} texts over {most} values of {column!r} is {samples / most:.3g} a "
            "value: a classifier trained on the release is held back by its size whatever "
            "the texts (Banking77's 77 intents: 500 real records scored 0.508, 2000 scored "
            "0.809; 500 zero-shot texts 0.419, 2000 scored 0.603); a larger release "
            "(synthesis.samples) costs no budget, only generation time")


def declared_labels(config: RunConfig) -> int | None:
    """The number of joint label classes the config declares (None: some are discovered)."""
    cols = config.data.labels
    values = config.data.declared_label_values()
    if any(c not in values for c in cols):
        return None
    return math.prod(len(values[c]) for c in cols) if cols else 1
