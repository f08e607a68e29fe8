"""How far a local sampling engine's next-token distribution is from the float32 model's
(CTranslate2 int8, :mod:`dpsynth.llm.ct2`; OpenVINO bf16, :mod:`dpsynth.llm.ov_generate`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def compare_with_float(
    gen: Any, pairs: Sequence[tuple[str, str]], max_tokens: int = 96
) -> dict[str, float]:
    """Mean and max KL(float32 || engine) in nats, and top-1 agreement, over the positions
    that predict continuation tokens of ``pairs`` ((prompt, continuation) texts).

    ``gen`` is a :class:`~dpsynth.llm.local.LocalGenerator` on the ctranslate2 or openvino
    engine (its :attr:`~dpsynth.llm.local.LocalGenerator.sampling_engine`)."""
    import torch

    engine = gen.sampling_engine
    if engine is None:
        raise ValueError("compare_with_float needs a generator on the ctranslate2 or openvino "
                         "engine")
    kls: list[float] = []
    agree: list[bool] = []
    for prompt, cont in pairs:
        head = gen.encode_prompt(prompt)
        ids = (head + gen.encode(cont))[:max_tokens]
        if len(ids) <= len(head):
            continue
        with torch.inference_mode():
            ref = torch.log_softmax(gen.model(torch.tensor([ids])).logits[0].float(), -1)
        ref_lp = ref.numpy()[len(head) - 1 : -1]
        lp = np.asarray(engine.continuation_log_probs(head, ids[len(head):]))
        lp = lp[:, : ref_lp.shape[1]]
        p = np.exp(ref_lp)
        kls.extend((p * (ref_lp - lp)).sum(-1).tolist())
        agree.extend((ref_lp.argmax(-1) == lp.argmax(-1)).tolist())
    if not kls:
        raise ValueError("compare_with_float: no continuation tokens to compare")
    return {
        "mean_kl": round(float(np.mean(kls)), 4),
        "max_kl": round(float(np.max(kls)), 4),
        "top1_agreement": round(float(np.mean(agree)), 4),
        "positions": len(kls),
    }
