"""What a method is: validation before any model loads, its privacy plan, and its strategy
for the shared evolution loop."""

from __future__ import annotations

import string
from typing import TYPE_CHECKING, Any, ClassVar

from ..config import ConfigError, RunConfig

if TYPE_CHECKING:
    from ..context import RunContext
    from ..evolution.loop import Strategy


def check_prompt_fields(config: RunConfig) -> None:
    """prompts.label_template may only name the configured label columns."""
    fields = {name for _, name, _, _ in string.Formatter().parse(config.prompts.label_template)
              if name}
    unknown = sorted(fields - set(config.data.labels))
    if unknown:
        raise ConfigError(
            f"prompts.label_template names {', '.join(map(repr, unknown))}, which "
            f"{'is' if len(unknown) == 1 else 'are'} not among data.labels "
            f"{config.data.labels}: use only label columns in the template"
        )


class Method:
    """Base class of the PE-family methods; subclasses fill in the parts."""

    name: ClassVar[str] = ""
    private_votes: ClassVar[bool] = True
    dp_guarantee: ClassVar[bool] = True  # False: the method states another guarantee (SecPE)

    def prepare(self, config: RunConfig, dataset: Any) -> float | None:
        """Method-specific set-up before any model loads; may return the noise multiplier
        (None: calibrate it from the (epsilon, delta) target over planned_events)."""
        return None

    def validate(self, config: RunConfig, n_records: int, n_labels: int) -> None:
        """Raise ConfigError, before any model is loaded, for a config that cannot work."""
        check_prompt_fields(config)
        syn = config.synthesis
        if self.private_votes and self.dp_guarantee and config.privacy.epsilon == 0:
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

    def vote_releases(self, config: RunConfig, n_labels: int) -> int:
        """How many Gaussian releases (all with one noise multiplier) the run makes."""
        label_release = 1 if n_labels > 1 else 0
        return label_release + (config.synthesis.iterations if self.private_votes else 0)

    def planned_events(self, config: RunConfig, n_labels: int, sigma: float) -> list[Any]:
        """The run's planned releases as privacy events, for calibration and the ledger."""
        from ..privacy import GaussianEvent

        steps = self.vote_releases(config, n_labels)
        return [GaussianEvent(sigma=sigma, sensitivity=1.0, count=steps)] if steps else []

    def strategy(self, ctx: RunContext) -> Strategy:
        raise NotImplementedError

    def iterations(self, config: RunConfig) -> int:
        return config.synthesis.iterations

    def statement_extras(self, ctx: RunContext) -> dict[str, Any]:
        """Method-specific keys for release/privacy.json."""
        return {}
