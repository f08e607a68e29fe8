"""The layers below the adapter, run once per record.

With ``lora_layers`` k the first L - k transformer layers carry no adapter and nothing below
them is trained, so the hidden state a record enters layer L - k with is the same at every
step. :class:`FrozenBelow` computes it once per record (one record a pass, no gradient, the
pass stopped at layer L - k) and each later pass of that record runs the top k layers only:
the decoder with its lower layers taken out, fed the stored state as ``inputs_embeds``
(transformers' decoders add no scaling or position there; the rotary positions and the causal
mask follow from the sequence alone, each layer's attention type from the config's list, cut
with the layers). Per record and epoch that saves the forward pass of the lower layers: a
full-batch run of E epochs pays it once instead of E times.

A record's state comes from its own pass, so the path stays rows-apart. It is used only where
a public probe (a fixed token sequence) gives the top-only pass the full pass's loss and
gradients bit for bit (the caller keeps the full pass otherwise)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: the stored states' memory cap: past it a record's state is computed again at each pass
#: (the same value: one record a pass, no gradient), so memory stays bounded on large sets
CACHE_BYTES = 2 << 30

#: the public probe: a fixed token sequence and the position its loss starts at
PROBE_IDS = tuple(range(1, 33))
PROBE_START = 16


class _Stop(Exception):
    """Raised by the hook on the first adapted layer: the lower pass stops there."""


def decoder_layers(model: Any) -> Any:
    """The module that holds the model's list of transformer layers (``.layers``, under
    peft's wrapper: the outermost such module), or None."""
    import torch

    for _, module in model.named_modules():
        layers = getattr(module, "layers", None)
        if isinstance(layers, torch.nn.ModuleList) and len(layers) > 0:
            return module
    return None


def first_adapted(model: Any) -> int | None:
    """The index of the lowest layer with a trainable parameter, when every trainable
    parameter lies in that layer or above it (nothing trained below, nor outside the
    layers); None otherwise (nothing to freeze)."""
    inner = decoder_layers(model)
    if inner is None:
        return None
    trained = [i for i, layer in enumerate(inner.layers)
               if any(p.requires_grad for p in layer.parameters())]
    inside = sum(p.numel() for layer in inner.layers for p in layer.parameters()
                 if p.requires_grad)
    every = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if not trained or trained[0] == 0 or inside != every:
        return None
    return trained[0]


class FrozenBelow:
    """Each record's hidden state entering layer ``first`` (its index among the decoder's
    layers), stored per record index up to ``cap`` bytes (:data:`CACHE_BYTES`), and the
    decoder cut to its layers from ``first`` on (:meth:`top_only`) to run from it."""

    def __init__(self, model: Any, first: int, cap: int = CACHE_BYTES) -> None:
        self.model = model
        self.cap = int(cap)
        self.inner = decoder_layers(model)
        self.first = int(first)
        self.states: dict[int, Any] = {}
        self.bytes = 0

    def hidden(self, ids: Any, attn: Any) -> Any:
        """The hidden state entering layer ``first`` of the pass over ``ids`` (no gradient;
        the pass stops there)."""
        import torch

        seen: list[Any] = []

        def stop(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            seen.append((args[0] if args else kwargs["hidden_states"]).detach())
            raise _Stop

        handle = self.inner.layers[self.first].register_forward_pre_hook(stop,
                                                                          with_kwargs=True)
        try:
            with torch.no_grad():
                self.model(input_ids=ids, attention_mask=attn, use_cache=False)
        except _Stop:
            pass
        finally:
            handle.remove()
        return seen[0]

    def state(self, index: int, ids: Any, attn: Any) -> Any:
        """Record ``index``'s stored state, computed on its first pass."""
        got = self.states.get(index)
        if got is None:
            got = self.hidden(ids, attn)
            size = got.numel() * got.element_size()
            if self.bytes + size <= self.cap:
                self.states[index] = got
                self.bytes += size
        return got

    @contextmanager
    def top_only(self) -> Iterator[None]:
        """The decoder with only its layers from ``first`` on, for the length of the block
        (with its config's per-layer attention types, where it has them, cut the same way:
        Gemma 3 picks each layer's mask and positions by its index)."""
        import torch

        layers = self.inner.layers
        config = getattr(self.inner, "config", None)
        types = getattr(config, "layer_types", None)
        self.inner.layers = torch.nn.ModuleList(list(layers)[self.first:])
        if types is not None:
            config.layer_types = list(types)[self.first:]
        try:
            yield
        finally:
            self.inner.layers = layers
            if types is not None:
                config.layer_types = types
