"""``method: dp_finetune`` (issue 45): DP-SGD on a LoRA adapter of the local generator, then the
release sampled from the tuned model (Yue et al., ACL 2023, "Synthetic Text Generation with
Differential Privacy"; label-conditioned prompts so the release follows the DP label counts).

Releases: the noisy label counts (discrete Gaussian, std ``label_count_sigma``, when there is
more than one label class and ``label_split: noisy_counts``) and T DP-SGD steps (Poisson rate
q, noise multiplier sigma, clip C), composed by the run's accountant (PLD or RDP). The plan
solves sigma from (epsilon, delta, epochs, batch size, records) before any model loads; the
session charges all T steps once, before step 0 (a resumed run pays nothing again)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...config import ConfigError, RunConfig
from ...context import Rngs, label_classes
from ...evolution.prompts import describe_labels
from ...files import SHARED_MODE, atomic_write_json, write_jsonl
from ...label_domain import declared_statement, undeclared_columns
from ...llm.local import LocalGenerator
from ...llm.models import quiet_transformers
from ...privacy import run_seed
from ...progress import note
from ...run_folder import RunDir
from ..base import Job, Method, Outcome, PrivacyPlan, check_prompt_fields
from . import accounting
from .config import DPFineTuneConfig
from .sample import quota, sample_texts
from .train import DPSGD, StepSettings, attach_lora, make_examples, step_logger

#: the folder of the method's private state under private/
FOLDER = "dp-finetune"


class DPFineTune(Method):
    """DP fine-tuning of the configured local generator (one ``Method``, its own section)."""

    name = "dp_finetune"
    section, config_model = "dp_finetune", DPFineTuneConfig
    #: the training loop reads every record's text in this process
    sharded_data = False
    #: DP-SGD's per-sample gradients: one record per pass by default (``clipping: loop``)
    private_passes = ("train",)

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
        if p.unit != "record":
            raise ConfigError("method dp_finetune states record-level DP only for now: "
                              "privacy.unit 'user' (a user's records sampled and clipped "
                              "together) is not implemented")
        if s.records is None and p.noise != "seeded":  # fail closed: a public schedule
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

    def schedule(self, config: RunConfig, records: int) -> tuple[float, int]:
        """(q, T) from the public ``records`` when given, else the data's count."""
        s = self.settings(config)
        return accounting.schedule(s.records or records, s.batch_size, s.epochs)

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
        s = self.settings(config)
        p = config.privacy
        n_labels = len(label_classes(dataset))
        q, steps = self.schedule(config, len(dataset))
        label_sigma = self.label_sigma(config, n_labels)
        sigma = accounting.solve_noise_multiplier(p.epsilon, p.delta, q, steps, p.accountant,
                                                  label_sigma)
        atomic_write_json(run.private / "plan.json",
                          {"method": self.name, "sampling_rate": q, "steps": steps,
                           "noise_multiplier": sigma, "expected_batch": q * len(dataset),
                           "label_count_sigma": label_sigma, "records": len(dataset)},
                          mode=0o600)
        if s.records is not None:
            note(f"dp_finetune: noise multiplier {sigma:.4g} for {steps} steps at q = {q:.4g}")
        else:
            note("dp_finetune: noise multiplier solved; it, the steps and q follow from the "
                 "private record count (private/plan.json; set dp_finetune.records to make "
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
        model, tok, model_id, eos_ids, pad_id = _load_model(cfg, job)
        torch.manual_seed(rngs.seed_for("dp_finetune/lora_init") % 2**63)  # public randomness
        model = attach_lora(model, s.lora_rank, s.lora_alpha, s.target_modules, s.lora_layers)
        examples = make_examples(tok, [sentences[int(y)] for y in codes], dataset.texts,
                                 s.max_tokens, eos_ids[0])
        noisy = self._releases(job, codes, len(classes))
        seconds = self._train(job, model, examples, pad_id)
        rows = self._sample(job, model, tok, sentences, noisy, rngs, eos_ids, pad_id)
        name = f"dp_finetune:{model_id}"
        release = [{"text": text, "labels": dict(zip(columns, classes[y], strict=True)),
                    "generator": name} for y, text in rows]
        return self._write(job, release, seconds)

    def _releases(self, job: Job, codes: np.ndarray, n_labels: int) -> np.ndarray | None:
        """Release 1, the noisy label counts (None: not released); release 2, all T steps,
        charged once before step 0 (both stored: a resume pays nothing again)."""
        plan = job.plan
        noisy = None
        if plan.notes["label_sigma"] is not None:
            counts = np.bincount(codes, minlength=n_labels).astype(np.int64)
            noisy = np.asarray(job.session.noisy_counts(
                "label_counts", counts, plan.notes["label_sigma"], name="label_counts"))
        job.session.record("dp_sgd", accounting.dp_sgd_event(
            float(plan.sigma or 0.0), float(plan.notes["q"]), int(plan.notes["steps"])),
            {"charged": "all steps"})
        return noisy

    def _train(self, job: Job, model: Any, examples: list[Any], pad_id: int) -> float:
        """The DP-SGD loop from the last checkpoint; the adapter saved in private/. Per step
        the private log gets the batch size, the loss and the accountant's epsilon; log.txt a
        share of the steps done (never T)."""

        cfg, run, plan = job.config, job.run, job.plan
        s, p = self.settings(cfg), cfg.privacy
        sigma, label_sigma = float(plan.sigma or 0.0), plan.notes["label_sigma"]
        q, steps = float(plan.notes["q"]), int(plan.notes["steps"])
        folder = run.private / FOLDER
        settings = StepSettings(
            # q x the record count that set q (public with dp_finetune.records): B when q < 1
            noise_multiplier=sigma, q=q, steps=steps,
            expected_batch=q * float(s.records or len(examples)), clip=s.max_grad_norm,
            learning_rate=s.learning_rate, clipping=s.clipping, micro_batch=s.micro_batch,
            checkpoint_every=s.checkpoint_every, secure=s.secure_mode)
        log = step_logger(folder / "steps.jsonl", lambda t: accounting.run_epsilon(
            sigma, q, t, p.delta, p.accountant, label_sigma))
        last = [0]

        def on_step(t: int, facts: dict[str, Any]) -> None:
            log(t, facts)
            pct = int(100 * t / steps)
            if pct >= last[0] + 10 or t == steps:  # public progress: a share, never T
                last[0] = pct
                run.log(f"dp_finetune: training {pct}% done")

        trainer = DPSGD(model, examples, settings, folder, job.session.noise_for, pad_id,
                        on_step=on_step, on_checkpoint=job.hooks.on_checkpoint)
        facts = trainer.run(resume=True)
        if facts.get("resumed_at") is not None and cfg.privacy.noise == "secure":
            # not silent: a step after the last checkpoint was computed again, with fresh
            # coins and noise; its first draw never left the process (nothing was saved or
            # released from it) and the budget was charged once for all T steps
            run.log(f"dp_finetune: resumed at step {facts['resumed_at']}; any step the "
                    "stopped run had begun after its last checkpoint was drawn again with "
                    "fresh secure noise (its first draw was never saved or released)")
        model.save_pretrained(str(folder / "adapter"))
        return float(facts["seconds"])

    def _sample(self, job: Job, model: Any, tok: Any, sentences: list[str],
                noisy: np.ndarray | None, rngs: Any, eos_ids: list[int],
                pad_id: int) -> list[tuple[int, str]]:
        """(label, text) of the release: N_y per label from the noisy counts (or even)."""

        s = self.settings(job.config)
        per_label = quota(s.samples, noisy, len(sentences))
        return sample_texts(model, tok, sentences, per_label.tolist(),
                            seed_for=lambda y, lo: rngs.seed_for("dp_finetune/sample", y, lo),
                            max_new_tokens=s.max_new_tokens, temperature=s.temperature,
                            top_p=s.top_p, batch=s.sample_batch, eos_ids=eos_ids,
                            pad_id=pad_id)

    def _write(self, job: Job, release: list[dict[str, Any]], seconds: float) -> Outcome:
        """release/synthetic.jsonl and the outcome (the training time stays in facts)."""

        run, plan = job.run, job.plan
        write_jsonl(run.release / "synthetic.jsonl", release, mode=SHARED_MODE)
        run.log(f"release: {len(release)} synthetic samples in "
                f"{run.release / 'synthetic.jsonl'}")
        summary = {"samples": len(release), "epsilon": None, "delta": None,
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
        st = job.session.statement(cfg.privacy.unit, (cfg.privacy.epsilon, cfg.privacy.delta))
        public = s.records is not None
        if not public:
            for row in st["mechanisms"]:
                if row.get("name") == "dp_sgd":
                    for key in ("sigma", "sampling_rate", "count", "mu"):
                        row[key] = "private: set from the record count"
        st["noise_note"] += (" The DP-SGD gradient noise is a continuous Gaussian in floating "
                             "point (training.gradient_noise).")
        st["method"] = self.name
        st["noise_multiplier"] = outcome.facts.get("sigma") if public else None
        st["label_domain"] = declared_statement(list(cfg.data.labels))
        st["training"] = {
            "algorithm": "DP-SGD (Abadi et al. 2016) on a LoRA adapter, AdamW on the noisy "
                         "gradients",
            "sampling": "Poisson", "clip": s.max_grad_norm, "epochs": s.epochs,
            "expected_batch": s.batch_size, "per_sample_gradients": s.clipping,
            "schedule": "public (dp_finetune.records)" if public else
                        "from the private record count (the usual DP-SGD convention)",
            "gradient_noise": "continuous Gaussian (floating point) from the run's noise "
                              "source" + ("; each draw the sum of 4 divided by 2 "
                                          "(secure_mode)" if s.secure_mode else ""),
        }
        return st


def _load_model(cfg: RunConfig, job: Job) -> tuple[Any, Any, str, list[int], int]:
    """A fresh float32 copy of the configured local generator's weights (never the caller's
    model object: the adapter is injected in place), its tokenizer, id, end and pad ids."""

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
    return model, gen.tokenizer, gen.model_id, list(gen.eos_token_ids), int(gen.pad_token_id)
