"""One YAML file describes a run: data, method, privacy target, generators, embedder, sizes.

The config is validated completely before any model is loaded: an unknown method, a label
column that does not exist, sizes that cannot be generated, or epsilon 0 with private voting
fail here with a message that says what to change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class ConfigError(ValueError):
    """A run configuration that cannot work, with a message that says what to change."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DataConfig(_Section):
    """Where the private records are and which columns hold text, labels and users.

    ``path: demo`` uses the built-in demo corpus (written into the run's private area).
    """

    path: str = "demo"
    text: str = "text"
    labels: list[str] = Field(default_factory=list)
    user: str | None = None
    max_chars: int = Field(20000, gt=0)
    limit: int | None = Field(None, gt=0, description="use only the first N rows")
    demo_rows: int = Field(600, gt=0)
    demo_seed: int = 0


class PrivacyConfig(_Section):
    """The privacy target and how noise is drawn (METHODS.md section 0)."""

    epsilon: float = Field(4.0, ge=0)
    delta: float = Field(1e-5, gt=0, lt=1)
    accountant: Literal["pld", "rdp", "zcdp", "gdp"] = "pld"
    noise: Literal["seeded", "secure"] = "seeded"
    seed: int = 0
    unit: Literal["record", "user"] = "record"
    total_epsilon: float | None = Field(None, gt=0, description="dataset budget in the ledger")
    total_delta: float | None = Field(None, gt=0, lt=1)
    ledger: str | None = None


class GeneratorConfig(_Section):
    """One generator: an offline model, a local directory or an OpenAI-compatible server."""

    model: str = "smollm2"
    backend: Literal["local", "openai"] = "local"
    base_url: str | None = None
    api_key_env: str | None = None
    chat: bool | None = None
    batch_size: int = Field(16, gt=0)
    max_concurrency: int = Field(4, gt=0)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int = Field(64, gt=0)

    @model_validator(mode="after")
    def _openai_needs_url(self) -> GeneratorConfig:
        if self.backend == "openai" and not self.base_url:
            raise ValueError("generators: backend 'openai' needs base_url")
        return self

    def spec(self) -> str | dict[str, Any]:
        """The spec that dpsynth.llm.load_generator takes."""
        if self.backend == "local":
            return self.model
        return {
            "backend": "openai",
            "base_url": self.base_url,
            "model": self.model,
            "api_key_env": self.api_key_env,
            "chat": True if self.chat is None else self.chat,
            "max_concurrency": self.max_concurrency,
        }

    @property
    def short_name(self) -> str:
        return Path(self.model).name if self.backend == "local" else self.model


class EmbedderConfig(_Section):
    model: str = "minilm"
    batch_size: int = Field(64, gt=0)


class PromptConfig(_Section):
    """What the synthetic texts are; `{column}` fields are filled with each label's value."""

    task: str = "a short text"
    label_template: str = ""
    styles: list[str] = Field(
        default_factory=lambda: [
            "casual", "formal", "brief", "detailed", "worried", "polite", "direct", "plain",
        ]
    )


class SynthesisConfig(_Section):
    """Sizes and switches of the shared evolution loop (METHODS.md section 1)."""

    samples: int = Field(60, gt=0, description="N: synthetic samples kept")
    iterations: int = Field(2, ge=0, description="T: private voting rounds")
    pool_multiplier: int = Field(3, ge=1, description="L: candidates per kept sample")
    k: int = Field(1, ge=1, description="nearest candidates each record votes for")
    threshold: float = Field(0.0, ge=0, description="theta, in units of the noise sigma")
    selection: Literal["rank", "sample"] = "rank"
    variation: Literal["rephrase", "fill_in", "mixed"] = "rephrase"
    mask_rate: float = Field(0.5, gt=0, lt=1)
    lookahead: int = Field(0, ge=0)
    min_chars: int = Field(12, ge=1)
    retries: int = Field(2, ge=0, description="extra tries for empty or refused generations")
    max_candidates: int = Field(200_000, gt=0)


class FederatedConfig(_Section):
    parties: int = Field(0, ge=0, description="0 = not federated")
    dirichlet_alpha: float = Field(1.0, gt=0)
    min_parties: int | None = None


class WaspConfig(_Section):
    """WASP (METHODS.md section 2)."""

    top_q: int = Field(8, ge=1)
    demonstrations: int = Field(8, ge=2)
    prompts_per_label: int = Field(4, ge=1)
    contrastive: bool = True
    weighting: bool = True
    weight_temperature: float = Field(1.0, gt=0)
    federated: FederatedConfig = Field(default_factory=FederatedConfig)


class SecPEConfig(_Section):
    """SecPE (METHODS.md section 3)."""

    secrets: list[dict[str, Any]] = Field(
        default_factory=lambda: [{"kind": "pii",
                                  "entities": ["PERSON", "PHONE_NUMBER", "EMAIL_ADDRESS"]}],
        description="secret definitions (dpsynth.secrets.SecretSpec)",
    )
    p: float = Field(1e-4, gt=0, lt=1)
    r_over_p: float = Field(10.0, gt=1)
    clusters: int = Field(50, gt=0)
    clip: float = Field(1.0, gt=0)


class RunConfig(_Section):
    method: str = "aug_pe"
    data: DataConfig = Field(default_factory=DataConfig)
    privacy: PrivacyConfig = Field(default_factory=PrivacyConfig)
    generators: list[GeneratorConfig] = Field(default_factory=lambda: [GeneratorConfig()])
    embedder: EmbedderConfig = Field(default_factory=EmbedderConfig)
    prompts: PromptConfig = Field(default_factory=PromptConfig)
    synthesis: SynthesisConfig = Field(default_factory=SynthesisConfig)
    wasp: WaspConfig = Field(default_factory=WaspConfig)
    secpe: SecPEConfig = Field(default_factory=SecPEConfig)
    synrag: dict[str, Any] = Field(default_factory=dict)
    llm_cache: str | None = Field(
        None, description="request cache shared across runs (default: the run's private area)"
    )

    @field_validator("generators")
    @classmethod
    def _some_generator(cls, value: list[GeneratorConfig]) -> list[GeneratorConfig]:
        if not value:
            raise ValueError("generators: give at least one generator")
        return value

    def resolve_paths(self, base: Path) -> RunConfig:
        """Make the data path absolute relative to the config file's folder."""
        if self.data.path != "demo" and not Path(self.data.path).is_absolute():
            self.data.path = str((base / self.data.path).resolve())
        return self


def _format_validation(err: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid configuration"]
    for item in err.errors():
        where = ".".join(str(p) for p in item["loc"]) or "(top level)"
        lines.append(f"  {where}: {item['msg']}")
    return "\n".join(lines)


def parse_config(raw: dict[str, Any], source: str = "config") -> RunConfig:
    """Validate a config mapping; errors name the field and what is wrong."""
    try:
        return RunConfig.model_validate(raw or {})
    except ValidationError as err:
        raise ConfigError(_format_validation(err, source)) from None


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read a YAML config; `overrides` maps dotted keys ("privacy.epsilon") to values."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: not valid YAML ({type(err).__name__})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    apply_overrides(raw, overrides or {})
    return parse_config(raw, str(path)).resolve_paths(path.parent)


def apply_overrides(raw: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Set dotted keys in a nested mapping, in place."""
    for dotted, value in overrides.items():
        node = raw
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value


def dump_config(config: RunConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
