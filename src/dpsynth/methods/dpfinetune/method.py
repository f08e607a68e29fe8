"""``method: dp_finetune`` (issue 45): DP-SGD on a LoRA adapter of the local generator, then the
release sampled from the tuned model (Yue et al., ACL 2023, "Synthetic Text Generation with
Differential Privacy"; label-conditioned prompts so the release follows the DP label counts).

Releases: the noisy label counts (discrete Gaussian, std ``label_count_sigma``, when there is
more than one label class and ``label_split: noisy_counts``) and T DP-SGD steps (Poisson rate
q, noise multiplier sigma, clip C), composed by the run's accountant (PLD or RDP). The plan
solves sigma from (epsilon, delta, epochs, batch size, records) before any model loads; the
session charges all T steps once, before step 0 (a resumed run pays nothing again).

``privacy.unit: user``: the unit is a user throughout. The label counts are each user's count
vector scaled to L2 norm <= 1 (as Aug-PE's, :func:`dpsynth.voting.user_label_counts`);
DP-SGD samples users with probability q = batch_size / ``users`` (a public count, like
``records``) and clips each sampled user's gradient (the mean over at most
``max_records_per_user`` of their records) to C as one (:mod:`.train`); the same events then
hold for add/remove one user."""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from typing import Any

import numpy as np
import psutil

from ...config import ConfigError, RunConfig
from ...context import Rngs, label_classes
from ...embed.shared import configured_embedder
from ...evolution.label_check import LabelCheck
from ...evolution.operators import described_value
from ...evolution.prompts import (
    clean_generation,
    describe_labels,
    instruction_sentences,
    trim_to_sentence,
    with_writer,
    zero_shot_instruction,
)
from ...files import SHARED_MODE, atomic_write_json, write_jsonl
from ...label_domain import declared_statement, undeclared_columns
from ...llm.local import LocalGenerator
from ...llm.models import quiet_transformers
from ...llm.runtime import available_cores, stepper_threads, torch_threads
from ...privacy import run_seed
from ...privacy.lattice import count_lattice
from ...progress import note, warn
from ...run_folder import RunDir
from ...voting import user_label_counts
from ...work import TuneWork
from ..base import Job, Method, Outcome, PrivacyPlan, check_prompt_fields
from ..loop import MOSTLY_FILTERED, warn_if_mostly_cut
from . import accounting
from .calibrate import calibration_key, gradients_per_second, trainer_for
from .config import DPFineTuneConfig
from .prompts import label_heads, label_prompts
from .sample import engine_draw, quota, sample_texts, tuned_generator
from .train import (
    DPSGD,
    StepSettings,
    adapter_coordinates,
    attach_lora,
    make_examples,
    step_logger,
    text_start,
    trainable,
)
from .workers import default_workers

#: the folder of the method's private state under private/
FOLDER = "dp-finetune"
#: the tuned model (the adapter merged into the weights) the release is sampled from and its
#: engine's conversion, under FOLDER; removed once the release is written (the adapter stays)
TUNED = "tuned-model"

#: the run warns above this ratio of the gradient noise to the largest mean clipped gradient
#: over the run (:func:`accounting.noise_over_run`: each step's
#: :func:`accounting.noise_to_signal` / sqrt(T)). Measured on Banking77 with the defaults
#: (batch 32, every layer): on 500 records (16 steps) at epsilon 8 and 1, 3.1 and 8.0 over
#: the run, the training loss showed no trend (benchmarks/results/side_by_side_eps*.md);
#: on 2000 records (63 steps) at epsilon 8, 4 and 1, 1.3, 1.7 and 2.7, it fell (3.17 -> 2.64,
#: 3.15 -> 2.87, 3.12 -> 2.77; benchmarks/results/side_by_side_2000*.md). The threshold
#: sits between the two groups: a guide from six runs, not a bound. A falling loss is not a
#: better release: compare it with a zero-shot set.
NOISY_RUN = 3.0


class DPFineTune(Method):
    """DP fine-tuning of the configured local generator (one ``Method``, its own section)."""

    name = "dp_finetune"
    section, config_model = "dp_finetune", DPFineTuneConfig
    #: the training loop reads every record's text in this process
    sharded_data = False
    #: DP-SGD's per-sample gradients: one record per pass by default (``clipping: loop``)
    private_passes = ("train",)

    def tune_work(self, config: RunConfig, plan: PrivacyPlan, units: int) -> TuneWork:
        """Its T steps of an expected batch of q x the units that set q (the declared count,
        else the data's ``units``), then its release's samples (``dpsynth plan``'s
        estimate)."""
        s = self.settings(config)
        q, steps = float(plan.notes["q"]), int(plan.notes["steps"])
        threads = config.generators[0].threads or available_cores()
        return TuneWork(steps, q * float(self.declared_units(config) or units), s.max_tokens,
                        s.samples, s.max_new_tokens, config.privacy.unit,
                        workers=(s.workers or threads) if s.clipping == "loop" else 1)

    def training_key(self, config: RunConfig) -> str | None:
        """The cache key of the DP-SGD calibration (:mod:`.calibrate`); None off the loop
        path (hooks and ghost are not calibrated)."""
        s = self.settings(config)
        return None if s.clipping != "loop" else calibration_key(config, s)

    def training_probe(self, config: RunConfig) -> Any:
        """The loop path's trainer on public records of the run's longest shape."""
        return trainer_for(config, self.settings(config))

    @staticmethod
    def gradients_per_second(probe: Any) -> float:
        return gradients_per_second(probe)

    @classmethod
    def extras(cls, config: RunConfig) -> list[tuple[str, str, str]]:
        return [("peft", "finetune", "method dp_finetune (the LoRA adapter)"),
                ("opacus", "finetune", "method dp_finetune (per-sample gradients)")]

    # -- checks and the plan -------------------------------------------------------------
    def check(self, config: RunConfig) -> None:
        s = self.settings(config)
        check_prompt_fields(config)
        p = config.privacy
        accounting.check_accountant(p.accountant)
        if math.isinf(p.epsilon) or p.epsilon <= 0:
            raise ConfigError(f"method dp_finetune needs a finite privacy.epsilon > 0, got "
                              f"{p.epsilon}")
        if p.unit == "user":
            self._check_user_level(config, s)
        elif s.users is not None or s.max_records_per_user is not None:
            raise ConfigError("dp_finetune.users and dp_finetune.max_records_per_user are for "
                              "privacy.unit: user; at record level give dp_finetune.records")
        if s.records is None and p.unit == "record" and p.noise != "seeded":  # fail closed
            raise ConfigError(
                "dp_finetune.records: give the number of records (public: it sets the "
                "sampling rate q = batch_size / records and the step count; each record is "
                "still sampled with probability q, so the guarantee holds whatever the true "
                "count). Without it q and T would follow from the private count: that is "
                "research mode only (privacy.noise: seeded)")
        if s.secure_mode and p.noise != "secure":
            raise ConfigError("dp_finetune.secure_mode needs privacy.noise: secure; set "
                              "dp_finetune.secure_mode: false for seeded (research) noise")
        gen = config.generators[0]
        if gen.backend != "local":
            raise ConfigError("method dp_finetune trains the weights of a local generator: "
                              "generators[0] must have backend 'local'")
        if gen.device != "cpu":
            raise ConfigError("method dp_finetune runs on the CPU for now (generators[0]."
                              "device: cpu)")

    @staticmethod
    def _check_user_level(config: RunConfig, s: DPFineTuneConfig) -> None:
        """What user-level DP-SGD needs: a user column, the loop path (the one that clips a
        user's gradient as one) and, outside research mode, the public user count."""
        if not config.data.user:
            raise ConfigError("privacy.unit is 'user' but data.user names no user column")
        if s.clipping != "loop":
            raise ConfigError(
                f"method dp_finetune with privacy.unit: user needs dp_finetune.clipping: loop, "
                f"not {s.clipping!r}: a user's gradient (the mean over their records) is "
                "clipped as one from one-record passes; Opacus's hooks and ghost clipping "
                "clip per record and are not implemented per user")
        if s.records is not None:
            raise ConfigError("dp_finetune.records counts records; with privacy.unit: user "
                              "give the public number of users as dp_finetune.users")
        if s.users is None and config.privacy.noise != "seeded":  # fail closed
            raise ConfigError(
                "dp_finetune.users: give the number of users (public: with privacy.unit: "
                "user it sets the sampling rate q = batch_size / users and the step count; "
                "each user is still sampled with probability q, so the guarantee holds "
                "whatever the true count). Without it q and T would follow from the private "
                "user count: that is research mode only (privacy.noise: seeded)")

    @staticmethod
    def user_level(config: RunConfig) -> bool:
        return config.privacy.unit == "user"

    def declared_units(self, config: RunConfig) -> int | None:
        """The public count of units (``users`` at user level, else ``records``), or None."""
        s = self.settings(config)
        return s.users if self.user_level(config) else s.records

    def schedule(self, config: RunConfig, units: int) -> tuple[float, int]:
        """(q, T) from the public count of units (records, or users at user level) when
        given, else from ``units``, the data's (private) count."""
        s = self.settings(config)
        return accounting.schedule(self.declared_units(config) or units, s.batch_size,
                                   s.epochs)

    def label_sigma(self, config: RunConfig, n_labels: int) -> float | None:
        s = self.settings(config)
        if s.label_split != "noisy_counts" or n_labels < 2:
            return None
        return float(s.label_count_sigma)

    def plan(self, config: RunConfig, dataset: Any, run: RunDir) -> PrivacyPlan:
        """Solve the noise multiplier before anything is trained; q, T and sigma (functions
        of the private record count unless ``records`` is given) go to private/plan.json."""

        self.check(config)
        if undeclared_columns(dataset):
            raise ConfigError("method dp_finetune needs a declared label domain "
                              "(data.label_values): discovery is not supported")
        if len(dataset) == 0:
            raise ConfigError("the private data has no records")
        p = config.privacy
        user_level = self.user_level(config)
        n_labels = len(label_classes(dataset))
        units = len(user_groups(dataset.users, None)) if user_level else len(dataset)
        q, steps = self.schedule(config, units)
        label_sigma = self.label_sigma(config, n_labels)
        sigma = accounting.solve_noise_multiplier(p.epsilon, p.delta, q, steps, p.accountant,
                                                  label_sigma, user_level)
        atomic_write_json(run.private / "plan.json",
                          {"method": self.name, "unit": p.unit, "sampling_rate": q,
                           "steps": steps, "noise_multiplier": sigma,
                           "expected_batch": q * units, "label_count_sigma": label_sigma,
                           "records": len(dataset), **({"users": units} if user_level else {})},
                          mode=0o600)
        what = "user" if user_level else "record"
        if self.declared_units(config) is not None:
            note(f"dp_finetune: noise multiplier {sigma:.4g} for {steps} steps at q = {q:.4g} "
                 f"({what}-level)")
        else:
            note(f"dp_finetune: noise multiplier solved; it, the steps and q follow from the "
                 f"private {what} count (private/plan.json; set dp_finetune.{what}s to make "
                 "them public)")
        return PrivacyPlan("dp", sigma, p.accountant, (p.epsilon, p.delta),
                           ledger={"method": self.name},
                           notes={"q": q, "steps": steps, "label_sigma": label_sigma})

    # -- the work --------------------------------------------------------------------------
    def execute(self, job: Job) -> Outcome:
        """Load the model, release the label counts, charge the T steps, train (from the last
        checkpoint on resume), sample the release."""
        import torch


        cfg, run, dataset = job.config, job.run, job.dataset
        s = self.settings(cfg)
        rngs = Rngs(run_seed(run.private, cfg.privacy.seed))
        codes = np.asarray(dataset.joint_label_codes()[0], dtype=np.int64)
        classes = label_classes(dataset)
        columns = list(dataset.label_columns)
        sentences = [describe_labels(dict(zip(columns, c, strict=True)), cfg.prompts)
                     for c in classes]
        # the model first (no release yet: a model that cannot load spends nothing)
        model, gen = _load_model(cfg, job)
        tok, eos_ids, pad_id = gen.tokenizer, list(gen.eos_token_ids), int(gen.pad_token_id)
        prompt_texts = label_prompts(gen, sentences, cfg.prompts, s.prompt)
        heads = label_heads(gen, sentences, cfg.prompts, s.prompt)
        torch.manual_seed(rngs.seed_for("dp_finetune/lora_init") % 2**63)  # public randomness
        model = attach_lora(model, s.lora_rank, s.lora_alpha, s.target_modules, s.lora_layers)
        examples = make_examples(tok, [heads[int(y)] for y in codes], dataset.texts,
                                 s.max_tokens, eos_ids[0])
        groups = (user_groups(dataset.users, s.max_records_per_user)
                  if self.user_level(cfg) else None)
        self._warn_noisy_steps(job, model)  # before any noise is drawn
        # on the configured threads, else every core: never the cores idle at the start of a
        # training that runs for minutes (the one-minute load just after another job left one)
        threads = stepper_threads(gen)
        # the earliest a record's text can start: after the shortest label prompt (public)
        trainer = self._trainer(job, model, examples, pad_id, groups,
                                first_target=min(text_start(h) for h in heads),
                                workers=_pass_workers(s, threads, model, run))
        try:
            trainer.start_workers()  # one that cannot start fails the run before any spend
            noisy = self._releases(job, codes, len(classes))
            with torch_threads(threads):
                seconds = self._train(job, trainer)
        finally:
            trainer.close()
        check = _label_check(job, [dict(zip(columns, c, strict=True)) for c in classes])
        tuned = tuned_generator(model, gen, run.private / FOLDER / TUNED,
                                engine=cfg.generators[0].engine, batch_size=s.sample_batch,
                                threads=gen.configured_threads, device=gen.device)
        run.log(f"dp_finetune: sampling the release from the tuned model on {tuned.engine}")
        rows, refused = self._sample(job, tuned, prompt_texts, heads, sentences, noisy, rngs,
                                     check)
        shutil.rmtree(run.private / FOLDER / TUNED, ignore_errors=True)  # the adapter stays
        name = f"dp_finetune:{gen.model_id}"
        release = [{"text": text, "labels": dict(zip(columns, classes[y], strict=True)),
                    "generator": name} for y, text in rows]
        return self._write(job, release, seconds, refused)

    def _warn_noisy_steps(self, job: Job, model: Any) -> None:
        """Warn when each step's noise outweighs the largest gradient the records can give
        (:meth:`noisy_steps`), on stderr and in log.txt. Public values only: the
        solved noise multiplier, the expected batch from the declared count and the loaded
        adapter's size (with a schedule from the private count, nothing is said)."""
        coordinates = sum(int(p.numel()) for _, p in trainable(model))
        message = self.noisy_steps(job.config, job.plan, coordinates)[1]
        if message is not None:
            warn(message)
            job.run.log(f"warning: {message}")

    def noisy_steps(self, config: RunConfig, plan: PrivacyPlan, coordinates: int
                    ) -> tuple[dict[str, float] | None, str | None]:
        """({"noise_to_signal": each step's ratio, :func:`accounting.noise_to_signal`, from the
        plan's sigma and q, the declared count and the adapter's ``coordinates``;
        "noise_over_run": the same over the run's T steps, :func:`accounting.noise_over_run`;
        "steps": T; "warn_above": :data:`NOISY_RUN`}, the warning when the ratio over the run
        is above it).
        (None, None) with a schedule from the private count: the ratio would follow from
        it."""
        declared = self.declared_units(config)
        if declared is None:
            return None, None
        sigma, q = float(plan.sigma or 0.0), float(plan.notes["q"])
        steps = int(plan.notes["steps"])
        ratio = accounting.noise_to_signal(sigma, q * declared, coordinates)
        over_run = accounting.noise_over_run(ratio, steps)
        ratios = {"noise_to_signal": ratio, "noise_over_run": over_run, "steps": steps,
                  "warn_above": NOISY_RUN}
        if over_run <= NOISY_RUN:
            return ratios, None
        what = "users" if self.user_level(config) else "records"
        return ratios, (
            f"dp_finetune: each step's gradient noise is {ratio:.1f}x the largest mean "
            f"gradient the {what} can give (noise multiplier {sigma:.3g} x the square root of "
            f"{coordinates} adapter coordinates / a batch of {q * declared:g}), {over_run:.2g}x "
            f"over the run's {steps} steps (/ sqrt(steps)), so the training loss may not "
            f"move: train on more {what} (more steps at the same noise), raise "
            f"dp_finetune.batch_size toward dp_finetune.{what} (the noise is divided by it), "
            f"or set dp_finetune.lora_layers (fewer coordinates) (docs/which-method.md)")

    def plan_noisy_steps(self, config: RunConfig, plan: PrivacyPlan
                         ) -> tuple[dict[str, float] | None, str | None]:
        """:meth:`noisy_steps` before any model loads (``dpsynth plan``): the adapter's size
        counted from the generator's architecture alone (:func:`adapter_coordinates`)."""
        if self.declared_units(config) is None:
            return None, None
        s = self.settings(config)
        gen = LocalGenerator(config.generators[0].model, engine="transformers", device="cpu")
        return self.noisy_steps(config, plan, adapter_coordinates(
            gen.model_dir, s.lora_rank, s.lora_alpha, s.target_modules, s.lora_layers))

    def _releases(self, job: Job, codes: np.ndarray, n_labels: int) -> np.ndarray | None:
        """Release 1, the noisy label counts (None: not released); release 2, all T steps,
        charged once before step 0 (both stored: a resume pays nothing again)."""
        plan = job.plan
        noisy = None
        if plan.notes["label_sigma"] is not None:
            user_level = self.user_level(job.config)
            if user_level:  # each user's count vector scaled to L2 norm <= 1, on the grid
                counts = user_label_counts(codes, n_labels, user_codes(job.dataset.users))
            else:
                counts = np.bincount(codes, minlength=n_labels).astype(np.int64)
            noisy = np.asarray(job.session.noisy_counts(
                "label_counts", counts, plan.notes["label_sigma"], name="label_counts",
                lattice=count_lattice(user_level)))
        job.session.record("dp_sgd", accounting.dp_sgd_event(
            float(plan.sigma or 0.0), float(plan.notes["q"]), int(plan.notes["steps"])),
            {"charged": "all steps"})
        return noisy

    def _trainer(self, job: Job, model: Any, examples: list[Any], pad_id: int,
                 groups: list[np.ndarray] | None = None, first_target: int = 1,
                 workers: int = 1) -> DPSGD:
        """The DP-SGD loop of the plan (nothing run yet). Per step the private log gets the
        batch size, the loss and the accountant's epsilon; log.txt a share of the steps done
        (never T). ``groups``: each user's records (user level); ``first_target``: the
        shortest label prompt's length; ``workers``: the processes of the loop path's passes
        (:class:`DPSGD`)."""

        cfg, run, plan = job.config, job.run, job.plan
        s, p = self.settings(cfg), cfg.privacy
        sigma, label_sigma = float(plan.sigma or 0.0), plan.notes["label_sigma"]
        q, steps = float(plan.notes["q"]), int(plan.notes["steps"])
        user_level = groups is not None
        units = len(groups) if groups is not None else len(examples)
        folder = run.private / FOLDER
        settings = StepSettings(
            # q x the count of units that set q (public with dp_finetune.records / users): B
            # when q < 1
            noise_multiplier=sigma, q=q, steps=steps,
            expected_batch=q * float(self.declared_units(cfg) or units), clip=s.max_grad_norm,
            learning_rate=s.learning_rate, clipping=s.clipping, micro_batch=s.micro_batch,
            checkpoint_every=s.checkpoint_every, secure=s.secure_mode,
            unit="user" if user_level else "record",
            max_records_per_user=s.max_records_per_user if user_level else None)
        log = step_logger(folder / "steps.jsonl", lambda t: accounting.run_epsilon(
            sigma, q, t, p.delta, p.accountant, label_sigma, user_level))
        last = [0]

        def on_step(t: int, facts: dict[str, Any]) -> None:
            log(t, facts)
            pct = int(100 * t / steps)
            if pct >= last[0] + 10 or t == steps:  # public progress: a share, never T
                last[0] = pct
                run.log(f"dp_finetune: training {pct}% done")

        return DPSGD(model, examples, settings, folder, job.session.noise_for, pad_id,
                     on_step=on_step, on_checkpoint=job.hooks.on_checkpoint, groups=groups,
                     first_target=first_target, workers=workers)

    def _train(self, job: Job, trainer: DPSGD) -> float:
        """Run ``trainer`` from the last checkpoint; the adapter saved in private/."""
        run, steps = job.run, trainer.s.steps
        facts = trainer.run(resume=True)
        if facts.get("resumed_at") is not None and facts["resumed_at"] >= steps:
            run.log("dp_finetune: resumed after the last step; nothing trained again")
        elif facts.get("resumed_at") is not None and job.config.privacy.noise == "secure":
            # not silent: a step after the last checkpoint was computed again, with fresh
            # coins and noise; its first draw never left the process (nothing was saved or
            # released from it) and the budget was charged once for all T steps
            run.log(f"dp_finetune: resumed at step {facts['resumed_at']}; any step the "
                    "stopped run had begun after its last checkpoint was drawn again with "
                    "fresh secure noise (its first draw was never saved or released)")
        trainer.model.save_pretrained(str(run.private / FOLDER / "adapter"))
        return float(facts["seconds"])

    def _sample(self, job: Job, tuned: LocalGenerator, prompt_texts: list[str],
                heads: list[list[int]], sentences: list[str], noisy: np.ndarray | None,
                rngs: Any, check: Callable[[list[int], list[str]], np.ndarray] | None
                ) -> tuple[list[tuple[int, str]], dict[str, int]]:
        """(label, text) of the release, drawn by the sampling engine on the tuned model
        (:func:`tuned_generator`): N_y per label from the noisy counts (or even), each
        text through the PE methods' public filters (:func:`_text_filter`) and label check
        (:func:`_label_check`), a refused one drawn again up to ``synthesis.retries`` times;
        and the counts refused, off-label and dropped."""

        s, cfg = self.settings(job.config), job.config
        label_sigma = job.plan.notes["label_sigma"] or 0.0
        per_label = quota(s.samples, noisy, len(heads), float(label_sigma) ** 2)
        draw = engine_draw(tuned, prompt_texts, heads, max_new_tokens=s.max_new_tokens,
                           temperature=s.temperature, top_p=s.top_p, top_k=s.top_k)
        return sample_texts(draw, len(heads), per_label.tolist(),
                            seed_for=lambda y, i, *a: rngs.seed_for("dp_finetune/sample", y,
                                                                     i, *a),
                            clean=_text_filter(cfg, sentences), check=check,
                            retries=cfg.synthesis.retries)

    def _write(self, job: Job, release: list[dict[str, Any]], seconds: float,
               refused: dict[str, int]) -> Outcome:
        """release/synthetic.jsonl and the outcome (the training time stays in facts; the
        counts of synthetic texts the filters refused and dropped go to the summary)."""

        run, plan = job.run, job.plan
        write_jsonl(run.release / "synthetic.jsonl", release, mode=SHARED_MODE)
        run.log(f"release: {len(release)} synthetic samples in "
                f"{run.release / 'synthetic.jsonl'} ({refused['refused']} drawn again after "
                f"the text filters refused them, {refused['dropped']} left out)")
        warn_if_mostly_cut(run, [r["text"] for r in release],
                           "a larger dp_finetune.max_tokens (training keeps a record's first "
                           "max_tokens tokens, so the tuned model stops where they stopped) and "
                           "dp_finetune.max_new_tokens")
        drawn = len(release) + refused["refused"]
        if drawn and refused["refused"] / drawn > MOSTLY_FILTERED:
            chat = "" if self.settings(job.config).prompt == "chat" else \
                "dp_finetune.prompt: chat, "
            message = (f"{refused['refused'] / drawn:.0%} of the tuned model's samples were "
                       "refused by the filters (assistant chatter, echoes of the prompt, "
                       "placeholders, answers): try prompts.writer and prompts.task in the words "
                       f"of the texts' writers, {chat}or a larger generator")
            warn(message)
            run.log(f"warning: {message}")
        summary = {"samples": len(release), "epsilon": None, "delta": None,
                   "rejected": refused["refused"], "off_label": refused["off_label"],
                   "dropped": refused["dropped"],
                   "attempts": int(job.meta.get("attempts", 1))}
        return Outcome(summary, facts={"sigma": plan.sigma, "q": plan.notes["q"],
                                       "steps": plan.notes["steps"], "train_seconds": seconds},
                       message=f"{len(release)} samples")

    # -- the statement ---------------------------------------------------------------------
    def statement(self, job: Job, outcome: Outcome) -> dict[str, Any]:
        """privacy.json: (epsilon, delta) from the accountant over both releases. With a
        private schedule (``records`` unset) the sampling rate, step count and noise multiplier
        are functions of the exact record count: left out (private/plan.json holds them)."""

        cfg = job.config
        s = self.settings(cfg)
        user_level = self.user_level(cfg)
        what = "user" if user_level else "record"
        st = job.session.statement(cfg.privacy.unit, (cfg.privacy.epsilon, cfg.privacy.delta))
        public = self.declared_units(cfg) is not None
        if not public:
            for row in st["mechanisms"]:
                if row.get("name") == "dp_sgd":
                    for key in ("sigma", "sampling_rate", "count", "mu"):
                        row[key] = f"private: set from the {what} count"
        st["noise_note"] += (" The DP-SGD gradient noise is a continuous Gaussian in floating "
                             "point (training.gradient_noise).")
        st["method"] = self.name
        st["noise_multiplier"] = outcome.facts.get("sigma") if public else None
        st["label_domain"] = declared_statement(list(cfg.data.labels))
        st["training"] = {
            "algorithm": "DP-SGD (Abadi et al. 2016) on a LoRA adapter, AdamW on the noisy "
                         "gradients",
            "privacy_unit": what,
            "sampling": "Poisson, each user" if user_level else "Poisson, each record",
            "clip": s.max_grad_norm, "epochs": s.epochs,
            "expected_batch": s.batch_size, "per_sample_gradients": s.clipping,
            "schedule": f"public (dp_finetune.{what}s)" if public else
                        f"from the private {what} count (the usual DP-SGD convention)",
            "gradient_noise": "continuous Gaussian (floating point) from the run's noise "
                              "source" + ("; each draw the sum of 4 divided by 2 "
                                          "(secure_mode)" if s.secure_mode else ""),
        }
        if user_level:
            which = ("all their records" if s.max_records_per_user is None else
                     f"the first {s.max_records_per_user} of their records in file order")
            st["training"]["per_user_gradient"] = (
                "user-level DP: a sampled user's gradient is the mean of the per-record "
                f"gradients of {which}, clipped to clip as one")
            st["training"]["max_records_per_user"] = s.max_records_per_user
        return st


def _pass_workers(s: DPFineTuneConfig, threads: int, model: Any, run: RunDir) -> int:
    """The loop path's pass workers: ``dp_finetune.workers``, else one per thread as far as
    the memory available holds them (:func:`default_workers`); 1 on hooks and ghost. Said in
    log.txt (a machine fact, nothing of the data)."""
    if s.clipping != "loop":
        return 1
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    workers = s.workers or default_workers(threads, model_bytes,
                                           psutil.virtual_memory().available)
    how = "dp_finetune.workers" if s.workers else f"{threads} threads and the free memory"
    run.log(f"dp_finetune: one-record passes in {workers} process(es), one thread each "
            f"({how})")
    return workers


def user_codes(users: Any) -> np.ndarray:
    """Each record's user as an index into the sorted distinct user ids."""
    if users is None:
        raise ConfigError("privacy.unit is 'user' but the data has no user column")
    return np.unique(np.asarray(list(users), dtype=object).astype(str),
                     return_inverse=True)[1].astype(np.int64).ravel()


def user_groups(users: Any, cap: int | None) -> list[np.ndarray]:
    """The record indices of each user (users in sorted id order, the records in file order),
    the first ``cap`` of them when given: a function of that user's records alone."""
    codes = user_codes(users)
    order = np.argsort(codes, kind="stable")
    bounds = np.flatnonzero(np.diff(codes[order])) + 1
    groups = np.split(order, bounds) if len(order) else []
    return [g[:cap] if cap is not None else g for g in groups]


def _load_model(cfg: RunConfig, job: Job) -> tuple[Any, LocalGenerator]:
    """A fresh float32 copy of the configured local generator's weights (never the caller's
    model object: the adapter is injected in place), and the generator (its tokenizer, chat
    template, id, end and pad ids)."""

    given = next((g for g in job.generators or () if isinstance(g, LocalGenerator)), None)
    if given is not None:
        import torch
        from transformers import AutoModelForCausalLM


        with quiet_transformers():
            model = AutoModelForCausalLM.from_pretrained(str(given.model_dir),
                                                         dtype=torch.float32)
        gen = given
    else:
        g = cfg.generators[0]
        gen = LocalGenerator(g.model, engine="transformers", num_threads=g.threads,
                             device="cpu")
        model = gen.model
    return model, gen


def _text_filter(cfg: RunConfig, sentences: list[str]) -> Callable[[str], str | None]:
    """The PE methods' public filters on one sampled text (:func:`dpsynth.evolution.prompts.
    clean_generation`: chat preambles stripped; refusals, commentary on the request, the
    assistant's voice, placeholders and texts shorter than ``synthesis.min_chars`` refused),
    with the label sentences and the request's sentences as the echoes to strip
    (``synthesis.strip_echoes``); a kept text that stops mid-sentence is trimmed back to its
    last full sentence when that keeps at least half of it (:func:`trim_to_sentence`): the
    model learned records cut at ``max_tokens`` and then ended, so it ends texts mid-sentence
    too (81 % of a Yelp release did)."""
    syn, prompts = cfg.synthesis, cfg.prompts
    echoes: list[str] = []
    if syn.strip_echoes:
        for sentence in sentences:
            echoes += instruction_sentences(with_writer(
                zero_shot_instruction(prompts.task, sentence), prompts.writer))
    echoes = sorted(set(echoes), key=len, reverse=True)

    def clean(raw: str) -> str | None:
        text = clean_generation(raw, syn.min_chars, echoes=echoes,
                                drop_off_task=syn.drop_off_task, writer=prompts.writer)
        return None if text is None else trim_to_sentence(text)

    return clean


def _label_check(job: Job, labels: list[dict[str, str]]
                 ) -> Callable[[list[int], list[str]], np.ndarray] | None:
    """The PE methods' label check on the release's samples (``synthesis.label_check``;
    :class:`dpsynth.evolution.label_check.LabelCheck`): a text whose own label value is not
    among the nearest of its column's values (their public descriptions or names, embedded by
    the run's embedder) is refused, where the embedder separates the column's values on the
    first attempt's samples (the gate). ``labels[y]``: class y's value per column. Public
    inputs only; None when the check is off or no column has two values."""
    cfg = job.config
    domain = {col: list(vals) for col, vals in (job.dataset.label_domain or {}).items()
              if col in labels[0] and len(vals) > 1} if labels else {}
    if not cfg.synthesis.label_check or not domain:
        return None
    embedder = (job.embedder if job.embedder is not None
                else configured_embedder(cfg.embedder, job.run.private / "embed-cache"))
    check = LabelCheck(domain, described_value(cfg.prompts), embedder)

    def refused(classes: list[int], texts: list[str]) -> np.ndarray:
        undecided = check.gate is None
        mask = check.refused(texts, [labels[y] for y in classes])
        if undecided and check.gate is not None:
            job.run.log(f"dp_finetune: label check {check.gate} (kappa {check.kappas})")
        return mask

    return refused
