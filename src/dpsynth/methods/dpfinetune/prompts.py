"""The prompt each record's text follows when the generator is fine-tuned, and each sample's
when the release is drawn from the tuned model (one per label class; public: the config's
task, writer and label descriptions only).

* ``chat``: the request the PE methods' zero-shot candidates answer (the task, the label
  sentence, the writer as the system message), in the model's chat template with the
  assistant's turn opened. Training starts from what the model already writes for that
  request, and the noisy gradient steps move it toward the records (the instruction-tuned
  model is fine-tuned on its own instruction format, as CTCL and Yue et al. condition on the
  label with a prompt the model reads).
* ``plain``: the label sentence and a newline, no template (Yue et al.'s format): the model
  has to learn the format from the records.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from ...config import PromptConfig
from ...evolution.prompts import render, zero_shot_instruction
from ...llm.base import GenerationRequest

PromptFormat = Literal["chat", "plain"]


def label_prompts(gen: Any, sentences: Sequence[str], prompts: PromptConfig,
                  form: PromptFormat) -> list[str]:
    """Each label's prompt as text (``sentences[y]``: the label sentence of class y,
    :func:`dpsynth.evolution.prompts.describe_labels`): what a training example's text follows
    and, as a plain completion prompt, what the release's samples are drawn after."""
    if form == "plain":
        return [sentence + "\n" for sentence in sentences]
    texts = []
    for sentence in sentences:
        request = render(zero_shot_instruction(prompts.task, sentence), gen.supports_chat,
                         prompts.writer)
        text, _, _ = gen.render(GenerationRequest(prompt=request))
        texts.append(text)
    return texts


def label_heads(gen: Any, sentences: Sequence[str], prompts: PromptConfig,
                form: PromptFormat) -> list[list[int]]:
    """The token ids of each label's prompt (:func:`label_prompts`)."""
    return [gen.encode_prompt(text) for text in label_prompts(gen, sentences, prompts, form)]
