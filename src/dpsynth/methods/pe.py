"""The base of the PE-family methods: plan, execute and state a run of the shared evolution
loop (docs/methods.md §0-1). A PE method adds its strategy and, where it differs, its
validation, planned releases, guarantee and privacy-statement extras."""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..compute.embeddings import PrivateEmbeddings
from ..config import ConfigError, RunConfig
from ..embed.shared import SharedEmbedder
from ..planning import VoteShape, plan_run
from ..privacy import DiscreteGaussianEvent, ReleasePlan, Scaled, calibrate_gaussian_sigma
from ..privacy.lattice import count_lattice
from ..run_folder import RunDir
from ..work import Stage, Work, pe_work
from .base import Guarantee, Job, Method, Outcome, PrivacyPlan, check_prompt_fields
from .loop import evolve

if TYPE_CHECKING:
    from ..context import PrivateView, Releaser, Rngs
    from ..data import Dataset
    from ..evolution.operators import Generation
    from ..evolution.strategy import Starter
    from ..planning import PlanInputs, RunPlan


def calibrate_sigma(config: RunConfig, releases: ReleasePlan, delta_used: float = 0.0) -> float:
    """The noise multiplier that meets the target (epsilon, delta) over the run's planned
    ``releases`` (a value: :class:`~dpsynth.privacy.ReleasePlan`, with any releases already
    spent, such as label-domain discovery's). ``delta_used``: delta already taken outside the
    accountant (discovery's threshold); the plan's own ``delta_outside`` is left out of the
    target too."""
    if math.isinf(config.privacy.epsilon) or releases.noised == 0:
        return 0.0
    return float(calibrate_gaussian_sigma(
        config.privacy.epsilon, config.privacy.delta - delta_used - releases.delta_outside,
        releases, kind=config.privacy.accountant))


def vote_release_plan(config: RunConfig, label_releases: int, rounds: int,
                      vote_shifts: tuple[int, ...] = ()) -> ReleasePlan:
    """The releases of a PE run at the multiplier still to be chosen (docs/methods.md §0):
    ``label_releases`` discrete Gaussian count releases (the label counts, or Aug-PE's sizes
    histogram in their place) and ``rounds`` votes, sensitivity 1, with the shift profiles
    they carry (``vote_shifts``: () when only the L2 bound is known, zCDP accounting)."""
    events: list[Scaled] = []
    if label_releases:
        events.append(Scaled(DiscreteGaussianEvent(
            sigma=1.0, sensitivity=1.0, count=label_releases, name="label_counts",
            shifts=count_lattice(config.privacy.unit == "user").shifts)))
    if rounds:
        events.append(Scaled(DiscreteGaussianEvent(sigma=1.0, sensitivity=1.0, count=rounds,
                                                   name="votes", shifts=vote_shifts)))
    return ReleasePlan(tuple(events))


def show_vote_plan(plan: RunPlan, run: RunDir) -> None:
    """What the noise will do to the votes (:mod:`dpsynth.planning`), before anything is
    spent: on the terminal, a warning when it swamps them, and in private/plan.json (it uses
    the exact record count: never log.txt or release/)."""
    from ..files import atomic_write_json
    from ..planning import WARN_VERDICTS
    from ..progress import note, warn

    atomic_write_json(run.private / "plan.json", plan.to_dict(), mode=0o600)
    for line in plan.lines()[:-1] if plan.message else plan.lines():
        note(line)
    if plan.verdict in WARN_VERDICTS:
        warn(plan.message)
    elif plan.message:
        note(plan.message)


def plan_pe(method: PEMethod, config: RunConfig, inputs: PlanInputs) -> PrivacyPlan:
    """The plan of a PE run, a pure function of the config and the facts it is computed from
    (no file, no model, no record): ``dpsynth plan`` and the run both make it here. With the
    label classes known it validates, fixes the noise multiplier (the method's own, else
    calibrated over the method's :meth:`~PEMethod.release_plan` after those already ``spent``
    to the (epsilon, delta) target) and plans the votes from its :meth:`~PEMethod.votes`;
    with a label column to discover both wait for that release (``sigma`` None), and the run
    plans again here once it is made. The method hands both down as values: nothing here
    calls back into it. The ledger's target leaves out the delta spent outside the
    accountant (discovery's threshold, the plan's ``delta_outside``)."""
    guarantee = method.guarantee(config)
    delta_used = config.data.label_domain_delta if inputs.discover else 0.0
    releases = method.release_plan(config, inputs.labels or 1)
    sigma, votes = None, None
    if inputs.labels is not None:
        method.validate(config, inputs.records, inputs.labels)
        sigma = inputs.sigma if inputs.sigma is not None else calibrate_sigma(
            config, releases.after(inputs.spent), delta_used)
        votes = plan_run(config, method.votes(config, inputs.labels), guarantee, inputs.records,
                         inputs.labels, sigma, inputs.words,
                         releases.at(sigma) if sigma else [])
    target = None
    if guarantee == "dp":
        target = (config.privacy.epsilon,
                  config.privacy.delta - delta_used - releases.delta_outside)
    return PrivacyPlan(guarantee, sigma, config.privacy.accountant, target,
                       ledger=method.ledger_details(config),
                       notes={"discover": list(inputs.discover), "delta_used": delta_used,
                              "delta_outside": releases.delta_outside, **inputs.notes},
                       votes=votes)


class PEMethod(Method):
    """A method of the PE family: its strategy runs in the shared evolution loop."""

    #: the method reads private records through noisy votes (False: zero-shot)
    private_votes: ClassVar[bool] = True
    #: the method sizes its voting population from the released record count
    #: (``synthesis.population``; :func:`dpsynth.planning.voting_population`)
    sizes_votes: ClassVar[bool] = False
    #: the method estimates the texts' length from the records (Aug-PE's sizes histogram:
    #: ``synthesis.max_words`` when unset; :func:`dpsynth.planning.plan_length`)
    estimates_length: ClassVar[bool] = False
    #: the release is drawn from the last vote's winners and their variations (Aug-PE), so
    #: a small voting population makes a release of few parents (the plan says so)
    releases_from_winners: ClassVar[bool] = False

    # -- validation and the privacy plan -------------------------------------------------
    def validate(self, config: RunConfig, n_records: int, n_labels: int) -> None:
        """Raise ConfigError, before any model is loaded, for a config that cannot work."""
        check_prompt_fields(config)
        syn = config.synthesis
        if self.guarantee(config) == "dp" and config.privacy.epsilon == 0:
            raise ConfigError(
                f"privacy.epsilon is 0, but method '{self.name}' spends budget on private "
                "votes: set privacy.epsilon > 0, or use method 'zero_shot' (no private data)"
            )
        if syn.samples < n_labels:
            raise ConfigError(
                f"synthesis.samples = {syn.samples} is fewer than the {n_labels} label classes "
                "in the data: raise synthesis.samples or use fewer label columns"
            )
        if syn.samples * syn.pool_multiplier > syn.max_candidates:
            raise ConfigError(
                f"synthesis.samples x pool_multiplier = {syn.samples * syn.pool_multiplier} "
                f"candidates exceeds synthesis.max_candidates = {syn.max_candidates}: lower "
                "samples or pool_multiplier, or raise max_candidates"
            )
        if n_records == 0:
            raise ConfigError("the private data has no records")

    def guarantee(self, config: RunConfig) -> Guarantee:
        """What the run states: (epsilon, delta)-DP, nothing (epsilon = inf) or public."""
        if not self.private_votes:
            return "public"
        return "none" if math.isinf(config.privacy.epsilon) else "dp"

    # -- the work, for `dpsynth plan`'s wall-time estimate ----------------------------------
    def planned_work(self, config: RunConfig, plan: RunPlan, detection_s: float | None
                     ) -> tuple[Work, list[Stage]]:
        """What this method's run does, from its plan, and rows of its own: Aug-PE's
        arithmetic (:func:`dpsynth.work.pe_work`); a method without private votes writes its
        samples once. ``detection_s``: seconds the plan's own pass over the data took (SecPE's
        secret detection), for a method that repeats it."""
        if not self.private_votes:
            return pe_work(plan.records, plan.samples, plan.samples, plan.samples, 0), []
        syn = config.synthesis
        return pe_work(plan.records, plan.samples, plan.candidates, plan.population,
                       syn.iterations, syn.lookahead), []

    # -- the method's two values for the planner ------------------------------------------
    def release_plan(self, config: RunConfig, n_labels: int) -> ReleasePlan:
        """Every release the run makes, at the noise multiplier still to be chosen, for the
        calibration, the ledger and the plan (:func:`vote_release_plan`): the label counts
        when there are several label classes, and the T votes. Its ``delta_outside`` does not
        depend on ``n_labels``."""
        return vote_release_plan(config, int(n_labels > 1), config.synthesis.iterations)

    def votes(self, config: RunConfig, n_labels: int) -> VoteShape:
        """What one vote is, for the planner (:class:`~dpsynth.planning.VoteShape`): Aug-PE's
        k votes of 1/sqrt(k) (mass sqrt(k)) over ``population x pool_multiplier``
        candidates, noise std the multiplier; sized from a released count when the method
        sizes its votes and the run releases one before them."""
        return VoteShape(
            private=self.private_votes, sizes=self.sizes_votes,
            counted=self.release_plan(config, n_labels).noised > config.synthesis.iterations,
            estimates_length=self.estimates_length,
            from_winners=self.releases_from_winners, mass=math.sqrt(config.synthesis.k),
            per_member=config.synthesis.pool_multiplier)

    def trains_on_votes(self, config: RunConfig) -> bool:
        """Whether the run trains its generators on the released votes (a stage the estimate
        names, uncalibrated)."""
        return False

    def ledger_details(self, config: RunConfig) -> dict[str, Any]:
        """Public details recorded in the ledger with a run that states no (epsilon, delta)."""
        return {"method": self.name}

    def plan_inputs(self, config: RunConfig, dataset: Dataset, run: RunDir) -> PlanInputs:
        """The facts of the data the plan needs (:class:`~dpsynth.planning.PlanInputs`),
        read before anything is spent: the record count, the label classes (or the columns
        to discover) and the records' length for a method that estimates it. A method that
        fixes its noise from the data (SecPE) adds it here (``sigma``), with what its run
        needs of that step (``notes``)."""
        from ..context import label_classes
        from ..planning import PlanInputs

        discover = _discovery_columns(config, dataset, self.guarantee(config) == "dp")
        return PlanInputs(len(dataset), None if discover else len(label_classes(dataset)),
                          words=_exact_words(self, config, dataset), discover=tuple(discover))

    def plan(self, config: RunConfig, dataset: Dataset, run: RunDir) -> PrivacyPlan:
        """:func:`plan_pe` on :meth:`plan_inputs`, before any model loads; the vote plan is
        shown, and kept in private/plan.json, when the votes are noised."""
        return self._shown(config, self.plan_inputs(config, dataset, run), run)

    def _shown(self, config: RunConfig, inputs: PlanInputs, run: RunDir) -> PrivacyPlan:
        """:func:`plan_pe`, its vote plan shown and kept when the votes are noised."""
        plan = plan_pe(self, config, inputs)
        if plan.sigma and plan.votes is not None:
            show_vote_plan(plan.votes, run)
        return plan

    def plan_after_discovery(self, config: RunConfig, dataset: Dataset, run: RunDir,
                             spent: Sequence[Any], discover: Sequence[str]) -> float:
        """The plan once the label domain is released (``spent``: its events): the same
        :func:`plan_pe` on the kept records and the released classes; its vote plan is shown
        and kept as before the run. Returns the noise multiplier."""
        from ..context import label_classes
        from ..planning import PlanInputs

        inputs = PlanInputs(len(dataset), len(label_classes(dataset)),
                            words=_exact_words(self, config, dataset),
                            discover=tuple(discover), spent=tuple(spent))
        sigma = self._shown(config, inputs, run).sigma
        assert sigma is not None
        return sigma

    # -- the work --------------------------------------------------------------------------
    @abstractmethod
    def strategy(self, config: RunConfig, view: PrivateView, releaser: Releaser,
                 gen: Generation, rngs: Rngs, plan: PrivacyPlan) -> Starter:
        """The method's parts for the loop, handed exactly the collaborators they use and
        the run's plan (``plan.notes`` holds what the method's ``plan_inputs`` read)."""

    def execute(self, job: Job) -> Outcome:
        """Discover the label domain if asked, then run the loop; writes release/*.jsonl."""
        from ..context import PrivateView, Releaser, Rngs
        from ..diagnostics import append_diagnostic
        from ..evolution.operators import Generation
        from ..privacy import run_seed
        from ..run_dataset import run_engine

        cfg, run, dataset = job.config, job.run, job.dataset
        sigma, domain = job.plan.sigma, None
        if job.plan.notes.get("discover"):  # the label domain found privately, then the plan
            dataset, domain = _discover_domain(cfg, dataset, job.session)
            sigma = self.plan_after_discovery(cfg, dataset, run, domain.events,
                                              job.plan.notes["discover"])
            if not job.resume:
                run.update_meta(sigma=sigma)
        assert sigma is not None
        # the run's private seed (private/seed, drawn once when the config gives none): drives
        # post-processing and LLM sampling, so a resumed run makes the same choices
        rngs = Rngs(run_seed(run.private, cfg.privacy.seed))
        # one embedder, loaded on first use, for the generation and the engine over the run's
        # private records; both are handed it (and the engine the embeddings it streams)
        embedder = SharedEmbedder(cfg.embedder, run.private / "embed-cache", given=job.embedder,
                                  log=run.log)
        embeddings = PrivateEmbeddings(embedder, dataset, run.private / "private-embeddings.npy",
                                       run.log)
        compute = run_engine(cfg, run, dataset, embeddings=embeddings,
                             given_embedder=job.embedder, shard_actor=job.hooks.shard_actor)
        view = PrivateView(cfg, run, dataset, compute, embeddings=embeddings,
                           progress=job.progress)
        job.cleanup.callback(view.close)
        gen = Generation(
            cfg, view.label_dict, rngs.seed, _llm_cache_path(cfg, run), embedder, rng=rngs,
            log=run.log, progress=job.progress, generators=job.generators,
            trainer=job.hooks.preference_trainer, label_domain=view.label_domain)
        job.paid_calls = lambda: gen.counts().get("llm_calls", 0)
        releaser = Releaser(job.session, sigma, private=not math.isinf(cfg.privacy.epsilon))
        # the exact record count is a fact about the private data: diagnostics only
        append_diagnostic(run, {"kind": "dataset", "records": len(dataset),
                                "noise_multiplier": sigma})
        run.log(f"method {self.name}: {view.n_labels} label classes")
        final = evolve(self.strategy(cfg, view, releaser, gen, rngs, job.plan), gen, run, rngs,
                       cfg.synthesis.iterations if self.private_votes else 0)
        summary = {"samples": len(final), "epsilon": None, "delta": None, **gen.counts(),
                   # calls paid by earlier attempts (a killed process cannot report its own;
                   # its finished calls sit in the request cache and are not paid again)
                   "llm_calls_earlier_attempts": int(job.meta.get("llm_calls_paid", 0)),
                   "attempts": int(job.meta.get("attempts", 1))}
        return Outcome(summary, facts={"domain": domain, "sigma": sigma},
                       message=f"{len(final)} samples")

    # -- the statement ---------------------------------------------------------------------
    def guarantee_statement(self, job: Job, outcome: Outcome) -> dict[str, Any]:
        """The guarantee part of privacy.json: (epsilon, delta) from the accountant, or a
        NOT PRIVATE statement for epsilon = inf."""
        cfg = job.config
        if math.isinf(cfg.privacy.epsilon):
            return {"epsilon": "inf", "delta": 1.0, "target_epsilon": "inf",
                    "target_delta": cfg.privacy.delta, "unit": cfg.privacy.unit,
                    "accountant": cfg.privacy.accountant, "noise": "none", "mechanisms": [],
                    "note": "NOT PRIVATE: epsilon = inf releases noise-free votes"}
        domain = outcome.facts.get("domain")
        extra_delta = (domain.extra_delta if domain is not None else 0.0) \
            + float(job.plan.notes.get("delta_outside", 0.0))
        statement = job.session.statement(cfg.privacy.unit,
                                          (cfg.privacy.epsilon, cfg.privacy.delta - extra_delta))
        if extra_delta:  # (eps, delta_acc) from the accountant plus the discovery threshold
            statement["delta"] = statement["delta"] + extra_delta
            statement["target_delta"] = cfg.privacy.delta
        return statement

    def statement_extras(self, job: Job, outcome: Outcome) -> dict[str, Any]:
        """Method-specific keys for release/privacy.json."""
        return {}

    def statement(self, job: Job, outcome: Outcome) -> dict[str, Any]:
        """release/privacy.json (schema in the README): the method's guarantee, the label
        domain, the noise note and the method's extras."""
        from ..label_domain import declared_statement
        from ..privacy import noise_note

        statement = self.guarantee_statement(job, outcome)
        domain = outcome.facts.get("domain")
        statement["label_domain"] = (domain.statement() if domain is not None
                                     else declared_statement(list(job.config.data.labels)))
        statement.setdefault("noise_note", noise_note(statement["noise"]))
        statement["method"] = self.name
        statement["noise_multiplier"] = outcome.facts.get("sigma")
        statement.update(self.statement_extras(job, outcome))
        return statement


def _exact_words(method: PEMethod, config: RunConfig, dataset: Any) -> int | None:
    """The records' length as the plan shows it (exact: terminal and private/plan.json only),
    for a method that estimates it; None when the data is not in this process."""
    from ..evolution.lengths import exact_max_words  # the compute engine: lazy

    if not method.estimates_length or config.synthesis.max_words is not None:
        return None
    texts = getattr(dataset, "texts", None)
    return None if texts is None else exact_max_words(texts)


def _llm_cache_path(cfg: RunConfig, run: RunDir) -> Path:
    return Path(cfg.llm_cache) if cfg.llm_cache else run.private / "llm-cache.sqlite"


def _discovery_columns(cfg: RunConfig, dataset: Dataset, private: bool) -> list[str]:
    """Label columns whose domain is to be found privately (``data.label_domain:
    discover``); refused for a run without an (epsilon, delta) budget to pay for it."""
    from ..label_domain import undeclared_columns

    cols = undeclared_columns(dataset)
    if cols and not private:
        raise ConfigError(
            f"data.label_domain 'discover' needs a run with a finite (epsilon, delta) budget "
            f"(method {cfg.method!r}, epsilon {cfg.privacy.epsilon}): declare "
            f"data.label_values for {', '.join(cols)}")
    return cols


def _discover_domain(cfg: RunConfig, dataset: Dataset, session: Any) -> tuple[Any, Any]:
    """Release the noisy value counts of the undeclared label columns through the session
    (replayed on resume) and keep the records of the values that passed (docs/methods.md §0)."""
    from ..label_domain import apply_discovery, discovery_lattice

    sigma_d = cfg.data.label_domain_sigma
    user_level = cfg.privacy.unit == "user"
    lattice = discovery_lattice(user_level)
    return apply_discovery(
        dataset, cfg.data,
        lambda key, counts: session.noisy_counts(key, counts, sigma_d, name="label_domain",
                                                 lattice=lattice),
        user_level=user_level)
