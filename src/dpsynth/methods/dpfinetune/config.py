"""The ``dp_finetune:`` section of a run config: standard DP-SGD hyperparameters (Abadi et al.
2016; Opacus's names) with safe defaults, the LoRA adapter, and how the release is sampled.
The unit sampled and clipped is ``privacy.unit``: a record, or a user (``users``,
``max_records_per_user``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ...config import DEFAULT_TOP_K, Section


class DPFineTuneConfig(Section):
    """DP-SGD on a LoRA adapter of the configured local generator (docs: issue 45)."""

    lora_rank: int = Field(8, ge=1, le=256, description="rank r of the LoRA adapter")
    lora_alpha: float = Field(16.0, gt=0, description="LoRA scaling alpha (update x alpha / r)")
    target_modules: list[str] = Field(
        ["q_proj", "v_proj"], min_length=1,  # pydantic copies a list default per instance
        description="the linear layers that get an adapter (names in the model)")
    lora_layers: int | None = Field(
        None, ge=1, description="adapters on the last k transformer layers only (the backward "
                                "pass stops below them: faster); None = every layer")
    epochs: float = Field(1.0, gt=0, le=1000,
                          description="passes over the data (over the users at privacy.unit "
                                      "user): steps T = ceil(epochs / q)")
    batch_size: int = Field(32, ge=1, description="expected Poisson batch B, in records (q = B "
                                                  "/ records), or in users at privacy.unit "
                                                  "user (q = B / users)")
    records: int | None = Field(
        None, ge=1,
        description="public record count that sets q = B / records and T (required; "
                    "Poisson sampling's guarantee holds whatever the true count). None: the "
                    "private count, research mode only (privacy.noise: seeded; q and T then "
                    "stay in private/)")
    users: int | None = Field(
        None, ge=1,
        description="privacy.unit user: the public user count that sets q = batch_size / users "
                    "and T (required; each user is sampled with probability q, so the "
                    "guarantee holds whatever the true count). None: the private user count, "
                    "research mode only (privacy.noise: seeded)")
    max_records_per_user: int | None = Field(
        None, ge=1,
        description="privacy.unit user: at most this many of a user's records (the first in "
                    "file order) make the user's gradient, the mean of their per-record "
                    "gradients clipped to max_grad_norm as one; None = all of them. A public "
                    "bound on the work per user, not on the sensitivity (the clip bounds it)")
    micro_batch: int = Field(8, ge=1, description="rows of a pass with hooks (fixed: filler "
                                                   "rows fill a pass) / ghost")
    learning_rate: float = Field(1e-3, gt=0, le=1.0, description="AdamW learning rate")
    max_grad_norm: float = Field(1.0, gt=0, description="per-sample clip C (L2); per user at "
                                                        "privacy.unit user")
    max_tokens: int = Field(64, ge=8, le=4096,
                            description="tokens of a record's text a training example keeps "
                                        "(after its prompt)")
    prompt: Literal["chat", "plain"] = Field(
        "chat", description="the prompt a record's text follows in training and a sample's "
                             "in the release: chat (the PE methods' zero-shot request in the "
                             "model's chat template) or plain (the label sentence and a "
                             "newline); dpsynth.methods.dpfinetune.prompts")
    clipping: Literal["loop", "hooks", "ghost"] = Field(
        "loop", description="per-sample gradients: one record per forward and backward pass "
                            "(loop), or Opacus's hooks on passes of a fixed shape (micro_batch "
                            "rows, each record at a width set by its own length): on both a "
                            "record's clipped gradient is bit-identical whatever else is in "
                            "the batch; or ghost clipping (norms only, two backward passes; "
                            "the micro-batch's clipped gradients summed in floating point, "
                            "equal to the others' up to rounding only). "
                            "benchmarks/results/dp_finetune.md measures them. privacy.unit "
                            "user needs loop")
    workers: int | None = Field(
        None, ge=1, description="processes that run the loop path's one-record passes side by "
                                "side, each pass on one thread (the step's sum is the same bit "
                                "for bit whatever their number: a resume may change it); "
                                "None: one per thread (the generator's threads, else every "
                                "core) as far as half the memory available holds them. A "
                                "worker holds about 0.5 GB of its own with SmolLM2-135M (the "
                                "weights are shared); log.txt says how many ran")
    checkpoint_every: int = Field(1, ge=1, description="steps between checkpoints")
    secure_mode: bool = Field(
        True, description="noise from the OS CSPRNG (needs privacy.noise: secure), each "
                          "Gaussian as the sum of 4 draws / 2 against floating-point attacks "
                          "(Holohan & Braghin 2021, section 5.1; Opacus's secure_mode)")
    label_split: Literal["noisy_counts", "uniform"] = Field(
        "noisy_counts", description="samples per label: from DP noisy label counts, or even")
    label_count_sigma: float = Field(
        20.0, gt=0, description="std of the discrete Gaussian on the label counts")
    samples: int = Field(100, ge=1, description="synthetic texts to release")
    temperature: float = Field(1.0, gt=0, description="sampling temperature of the release")
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int | None = Field(
        DEFAULT_TOP_K, ge=1, description="sample the release from the k likeliest tokens (the "
                                         "PE methods' default; post-processing of the tuned "
                                         "model); null: the whole vocabulary")
    max_new_tokens: int = Field(64, ge=1, le=4096)
    sample_batch: int | None = Field(
        None, ge=1, description="prompts per batch of the sampling engine the release is drawn "
                                "with; None: the engine's own (64 on openvino)")
