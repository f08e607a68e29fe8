"""One YAML file describes a run: data, method, privacy target, generators, embedder, sizes.

The config is validated completely before any model is loaded: an unknown method, a label
column that does not exist, sizes that cannot be generated, or epsilon 0 with private voting
fail here with a message that says what to change.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import ConfigError as ConfigError  # re-exported; the class lives in dpsynth.errors


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


DEMO_VALUES = "demo"  # label_values keyword: the demo corpus's public values of the column


def _value_to_str(value: Any) -> Any:
    """A declared label value as the loader reads it (``4`` and ``4.0`` become ``"4"``)."""
    if isinstance(value, bool):
        raise ValueError(f"label value {value!r} is a YAML boolean: quote it (e.g. \"yes\")")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return value


def _how_to_declare(missing: list[str], labels: list[str]) -> str:
    col = missing[0]
    return (
        f"data.labels names {', '.join(map(repr, missing))} without declared values. The label "
        "domain is public input (a schema, never read from the private records): declare it, "
        "e.g.\n"
        "    data:\n"
        f"      labels: [{', '.join(labels)}]\n"
        "      label_values:\n"
        f"        {col}: [value1, value2, value3]\n"
        f"        # or {col}: {col}-values.txt  (one value per line, UTF-8, relative to the "
        "config's folder)\n"
        "Records with another value are an error. A data owner can list the values in their "
        f"own file with `dpsynth data check FILE --text TEXT --label {col}`. To find the domain "
        "privately instead (noisy counts and a threshold, charging extra delta), set "
        "data.label_domain: discover."
    )


class DataConfig(_Section):
    """Where the private records are and which columns hold text, labels and users.

    ``path: demo`` uses the built-in demo corpus (written into the run's private area).
    The label domain is public input (docs/methods.md §0): ``label_values`` maps each label
    column to its values (a list, a file with one value per line, or ``demo`` for the demo
    corpus's public departments and urgencies); the joint classes are their product in
    declared order. Values declared for a column not in ``labels`` are unused (so an override
    of ``labels`` to fewer columns keeps working). ``label_domain: discover`` finds undeclared
    domains privately instead (dpsynth.label_domain), charging a Gaussian release of scale
    ``label_domain_sigma`` and an extra ``label_domain_delta``.
    """

    path: str = "demo"
    text: str = "text"
    labels: list[str] = Field(default_factory=list)
    label_values: dict[str, list[str] | str] = Field(
        default_factory=dict, description="public label domain: column -> values, file or demo"
    )
    label_domain: Literal["declared", "discover"] = "declared"
    label_domain_sigma: float = Field(
        5.0, gt=0, description="discover: noise sigma of the per-column value counts"
    )
    label_domain_delta: float = Field(
        1e-7, gt=0, lt=1,
        description="discover: extra delta charged (chance a one-record value is kept)",
    )
    user: str | None = None
    max_chars: int = Field(20000, gt=0)
    limit: int | None = Field(None, gt=0, description="use only the first N rows")
    demo_rows: int = Field(600, gt=0)
    demo_seed: int = 0

    @field_validator("label_values", mode="before")
    @classmethod
    def _values_as_strings(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        return {col: [_value_to_str(v) for v in vals] if isinstance(vals, list) else vals
                for col, vals in value.items()}

    @model_validator(mode="after")
    def _declared_domain(self) -> DataConfig:
        for col, vals in self.label_values.items():
            if isinstance(vals, str):
                if not vals.strip():
                    raise ValueError(f"label_values.{col}: give a list of values or a file path")
                if vals == DEMO_VALUES:
                    _demo_values(col)
                continue
            _check_values(vals, f"label_values.{col}")
        if self.label_domain == "declared":
            missing = [c for c in self.labels if c not in self.label_values]
            if missing:
                raise ValueError(_how_to_declare(missing, self.labels))
        return self

    def declared_label_values(self) -> dict[str, list[str]]:
        """The declared values of each label column (files and ``demo`` read now), in
        declared order; columns left to ``label_domain: discover`` are absent."""
        out: dict[str, list[str]] = {}
        for col in self.labels:
            vals = self.label_values.get(col)
            if vals is None:
                continue
            if isinstance(vals, list):
                out[col] = list(vals)
            elif vals == DEMO_VALUES:
                out[col] = _demo_values(col)
            else:
                out[col] = read_label_values_file(Path(vals), col)
        return out


def _check_values(values: list[str], where: str) -> None:
    if not values:
        raise ValueError(f"{where}: declare at least one value")
    seen: set[str] = set()
    for i, v in enumerate(values, start=1):
        if not v.strip():
            raise ValueError(f"{where}: value {i} is empty")
        if v in seen:
            raise ValueError(f"{where}: value {v!r} is declared twice")
        seen.add(v)


def _demo_values(column: str) -> list[str]:
    from .demo_corpus import demo_label_values

    known = demo_label_values()
    if column not in known:
        raise ValueError(
            f"label_values.{column}: 'demo' declares the demo corpus's public values, which exist "
            f"only for {', '.join(map(repr, known))}"
        )
    return known[column]


def read_label_values_file(path: Path, column: str) -> list[str]:
    """One value per line (UTF-8, optional BOM); blank lines are skipped."""
    where = f"label_values.{column} ({path})"
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise ConfigError(f"{where}: file not found") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{where}: not valid UTF-8 (byte {err.start})") from None
    except OSError as err:
        raise ConfigError(f"{where}: cannot read ({type(err).__name__})") from None
    values: list[str] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if line != line.strip():
            raise ConfigError(f"{where}, line {lineno}: leading or trailing whitespace")
        if line in seen:
            raise ConfigError(f"{where}, line {lineno}: value {line!r} repeats line {seen[line]}")
        seen[line] = lineno
        values.append(line)
    if not values:
        raise ConfigError(f"{where}: no values (one value per line)")
    return values


class PrivacyConfig(_Section):
    """The privacy target and how noise is drawn (docs/methods.md §0).

    ``noise: secure`` (the default) draws from the OS CSPRNG. ``noise: seeded`` is a research
    mode: the guarantee holds only while the seed stays secret. ``seed: null`` (the default)
    draws a random seed per run, kept in the run's private/ folder; it also drives
    post-processing randomness. The ledger refuses one (dataset, seed) pair twice.
    """

    epsilon: float = Field(4.0, ge=0)
    delta: float = Field(1e-5, gt=0, lt=1)
    accountant: Literal["pld", "rdp", "zcdp", "gdp"] = "pld"
    noise: Literal["seeded", "secure"] = "secure"
    seed: int | None = Field(None, ge=0, description="null: drawn at random, kept in private/")
    unit: Literal["record", "user"] = "record"
    total_epsilon: float | None = Field(None, gt=0, description="dataset budget in the ledger")
    total_delta: float | None = Field(None, gt=0, lt=1)
    ledger: str | None = None


#: Candidate sampling of the PE methods, chosen on the Yelp validation split with SmolLM2
#: (BENCHMARKS.md, "Readable defaults"): a truncated support is post-processing here (the
#: candidates are public outputs), unlike DP-SynRAG's private tokens, which never use these.
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 1.0
DEFAULT_TOP_K = 50


class GeneratorConfig(_Section):
    """One generator: an offline model, a local directory or an OpenAI-compatible server."""

    model: str = "smollm2"
    backend: Literal["local", "openai"] = "local"
    base_url: str | None = None
    base_urls: list[str] | None = Field(
        None, min_length=1,
        description="openai: several endpoints (replicas of the model) sharing the requests, "
                    "instead of base_url"
    )
    endpoint_cooldown_s: float = Field(
        5.0, ge=0, description="openai: a failed endpoint gets no requests this long at first "
                               "(doubling while it keeps failing, at most 60 s)"
    )
    api_key_env: str | None = None
    chat: bool | None = None
    batch_size: int | None = Field(
        None, gt=0, description="local: requests per batch; None picks it for the engine"
    )
    engine: Literal["auto", "transformers", "ctranslate2"] = Field(
        "auto", description="local: ctranslate2 int8 when installed (auto), or transformers"
    )
    threads: int | None = Field(
        None, gt=0, description="local: CPU threads; None = the idle cores (never more)"
    )
    max_concurrency: int = Field(4, gt=0, description="openai: requests in flight per endpoint")
    temperature: float = Field(
        DEFAULT_TEMPERATURE, ge=0,
        description="candidate sampling (PE methods only; DP-SynRAG's private tokens never "
                    "read it); the default was measured on Yelp validation (BENCHMARKS.md)")
    top_p: float = Field(DEFAULT_TOP_P, gt=0, le=1)
    top_k: int | None = Field(
        None, ge=0,
        description="sample among the k most likely tokens (0 = the whole vocabulary); None "
                    f"= {DEFAULT_TOP_K} on the local engines, and nothing sent to an openai "
                    "server (its own default; top_k is not an OpenAI field)")
    max_new_tokens: int = Field(64, gt=0)
    timeout_s: float = Field(120.0, gt=0, description="openai: seconds per HTTP attempt")
    retry_budget_s: float = Field(
        600.0, gt=0, description="openai: total seconds per request across its retries"
    )
    max_attempts: int | None = Field(None, ge=1, description="openai: optional attempt cap")
    outage_patience_s: float = Field(
        300.0, ge=0, description="openai: wait out a server outage this long, then stop cleanly"
    )

    @model_validator(mode="after")
    def _openai_needs_url(self) -> GeneratorConfig:
        if self.backend == "openai" and not (self.base_url or self.base_urls):
            raise ValueError("generators: backend 'openai' needs base_url or base_urls")
        if self.base_url and self.base_urls:
            raise ValueError("generators: give base_url or base_urls, not both")
        if self.base_urls and len(set(self.base_urls)) != len(self.base_urls):
            raise ValueError("generators: base_urls lists an endpoint twice")
        return self

    def spec(self) -> str | dict[str, Any]:
        """The spec that dpsynth.llm.load_generator takes."""
        if self.backend == "local":
            if self.engine == "auto" and self.threads is None:
                return self.model
            return {"backend": "local", "model": self.model, "engine": self.engine,
                    "num_threads": self.threads}
        return {
            "backend": "openai",
            **({"base_urls": list(self.base_urls)} if self.base_urls
               else {"base_url": self.base_url}),
            "endpoint_cooldown_s": self.endpoint_cooldown_s,
            "model": self.model,
            "api_key_env": self.api_key_env,
            "chat": True if self.chat is None else self.chat,
            "max_concurrency": self.max_concurrency,
            "timeout": self.timeout_s,
            "retry_budget_s": self.retry_budget_s,
            "max_attempts": self.max_attempts,
            "outage_patience_s": self.outage_patience_s,
        }

    @property
    def short_name(self) -> str:
        return Path(self.model).name if self.backend == "local" else self.model

    @property
    def sampling_top_k(self) -> int:
        """The top-k the requests carry: ``top_k`` when set; unset, the local default
        (:data:`DEFAULT_TOP_K`) or 0 for an openai server (then no ``top_k`` is sent)."""
        if self.top_k is not None:
            return self.top_k
        return DEFAULT_TOP_K if self.backend == "local" else 0


class EmbedderConfig(_Section):
    """Sentence embedder; fast engines must match torch to cosine 0.999 (see dpsynth.embed)."""

    model: str = "minilm"
    batch_size: int = Field(64, gt=0)
    engine: Literal["auto", "torch", "onnx", "openvino"] = Field(
        "auto", description="auto: openvino, else onnx, else torch (first that is installed "
        "and agrees with torch)")
    threads: int | None = Field(None, gt=0, description="CPU threads (default: all cores)")


class PromptConfig(_Section):
    """What the synthetic texts are; `{column}` fields are filled with each label's value."""

    task: str = "a short text"
    label_template: str = ""
    label_descriptions: dict[str, dict[str, str]] | str = Field(
        default_factory=dict,
        description="public: per label column, what each declared value means, shown to the "
                    "generator in its place (for codes a model cannot read: 'ENTY', '3'); or "
                    "a YAML/JSON file of that mapping, relative to the config's folder")

    def descriptions(self) -> dict[str, dict[str, str]]:
        """``label_descriptions`` as a mapping (a file is read here; ConfigError names it)."""
        if isinstance(self.label_descriptions, dict):
            return self.label_descriptions
        return _descriptions_file(str(Path(self.label_descriptions).resolve()))
    styles: list[str] = Field(
        default_factory=lambda: [
            "casual", "formal", "brief", "detailed", "worried", "polite", "direct", "plain",
        ]
    )


class SynthesisConfig(_Section):
    """Sizes and switches of the shared evolution loop (docs/methods.md §1)."""

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
    strip_echoes: bool = Field(
        False, description="remove from each generation the sentences of its instruction's "
                           "request line it repeats (the label sentence, 'Write ...')")
    drop_off_task: bool = Field(
        False, description="drop, and retry, generations that comment on the prompt (its good "
                           "and bad examples, the rephrasing asked for) instead of being a sample")
    retries: int = Field(2, ge=0, description="extra tries for empty or refused generations")
    max_candidates: int = Field(200_000, gt=0)
    voting: Literal["exact", "pq", "ivf", "hnsw"] = Field(
        "exact", description="nearest-candidate search of the private vote: exact, or faiss "
                             "PQ fast-scan + exact re-rank / IVF / HNSW built on the candidates "
                             "only (docs/methods.md §1); small labels are searched exactly")
    voting_rerank: int = Field(16, ge=1, description="pq: candidates re-scored exactly per "
                                                     "neighbour")
    voting_nlist: int | None = Field(None, ge=1, description="IVF lists per label "
                                                             "(default sqrt(candidates))")
    voting_nprobe: int = Field(8, ge=1, description="IVF lists searched per record")
    voting_ef_search: int = Field(64, ge=1, description="HNSW efSearch")


def _ray_address(value: str, field: str) -> str:
    """A Ray address setting: 'local', 'auto', 'ray://HOST:PORT' or 'HOST:PORT'."""
    if value in {"auto", "local"} or value.startswith("ray://") or ":" in value:
        return value
    raise ValueError(f"{field} {value!r}: use local, auto, ray://HOST:PORT or HOST:PORT")


class FederatedConfig(_Section):
    """Federated WASP (docs/methods.md §2): votes summed by Flower SecAgg+ across parties."""

    parties: int = Field(0, ge=0, description="0 = not federated")
    dirichlet_alpha: float = Field(1.0, gt=0)
    min_parties: int | None = Field(
        None, ge=2,
        description="fewest parties whose sum may be released (default: all); also the SecAgg+ "
                    "reconstruction threshold, and each round is charged at the noise of this "
                    "many parties",
    )
    ray_address: str = Field(
        "local", description="where Flower's simulation engine runs the parties: 'local' "
                             "(start a one-machine Ray for each round and stop it after), or "
                             "the address of a running Ray cluster ('auto', HOST:PORT, "
                             "'ray://HOST:PORT') that every round joins, with one CPU per party "
                             "actor; the simulated parties' records travel to that cluster's "
                             "nodes, as shards do with compute.engine: ray",
    )

    @field_validator("ray_address")
    @classmethod
    def _ray_address_form(cls, value: str) -> str:
        return _ray_address(value, "wasp.federated.ray_address")


class WaspConfig(_Section):
    """WASP (docs/methods.md §2)."""

    top_q: int = Field(8, ge=1)
    demonstrations: int = Field(8, ge=2)
    prompts_per_label: int = Field(4, ge=1)
    contrastive: bool = True
    weighting: bool = True
    weight_temperature: float = Field(1.0, gt=0)
    federated: FederatedConfig = Field(default_factory=FederatedConfig)


class SecPEConfig(_Section):
    """SecPE (docs/methods.md §3)."""

    secrets: list[dict[str, Any]] = Field(
        default_factory=lambda: [{"kind": "pii",
                                  "entities": ["PERSON", "PHONE_NUMBER", "EMAIL_ADDRESS"]}],
        description="secret definitions (dpsynth.secrets.SecretSpec)",
    )
    p: float = Field(1e-4, gt=0, lt=1)
    r_over_p: float = Field(10.0, gt=1)
    clusters: int = Field(50, gt=0)
    clip: float = Field(
        1.0, gt=0,
        description="R: private embeddings are clipped to norm R; a centre's noise scale is "
                    "(R + max(1, R)) / n_k, so R < 1 still pays (1 + R) / n_k",
    )
    discretization: float = Field(
        3e-3, gt=0, le=0.05,
        description="the privacy-loss grid of SecretNoise's accountant (dp_accounting's "
                    "value_discretization_interval): pessimistic at any grid, so the (p, r) "
                    "bound holds either way; a coarser grid calibrates faster and asks for a "
                    "little more noise",
    )


class ComputeConfig(_Section):
    """Where the private statistics are computed (docs/methods.md §0): ``local`` (this process,
    the default) or ``ray`` (sharded by user over Ray workers; the driver sees only summed
    partial statistics and adds the noise once)."""

    engine: Literal["local", "ray"] = "local"
    address: str = Field(
        "auto", description="ray: 'auto' (a running cluster), 'ray://HOST:PORT', HOST:PORT "
                            "or 'local' (start a one-machine Ray in this process)",
    )
    shards: int = Field(2, ge=1, le=64, description="ray: shard actors holding private rows "
                                                 "(whole user buckets, 64 at most)")
    timeout_s: float | None = Field(
        3600.0, gt=0,
        description="ray: the longest the driver waits for one call to the workers (a vote, "
                    "an embedding pass, a token step); past it the run fails with a "
                    "ComputeError and can be resumed (nothing released is lost). null: wait "
                    "as long as it takes",
    )

    @field_validator("address")
    @classmethod
    def _address_form(cls, value: str) -> str:
        return _ray_address(value, "compute.address")


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
    compute: ComputeConfig = Field(default_factory=ComputeConfig)
    llm_cache: str | None = Field(
        None, description="request cache shared across runs (default: the run's private area)"
    )

    @field_validator("generators")
    @classmethod
    def _some_generator(cls, value: list[GeneratorConfig]) -> list[GeneratorConfig]:
        if not value:
            raise ValueError("generators: give at least one generator")
        return value

    @model_validator(mode="after")
    def _discovery_fits_delta(self) -> RunConfig:
        data = self.data
        undeclared = [c for c in data.labels if c not in data.label_values]
        if undeclared and data.label_domain_delta >= self.privacy.delta:
            raise ValueError(
                f"data.label_domain_delta = {data.label_domain_delta:g} must be below "
                f"privacy.delta = {self.privacy.delta:g}: label discovery is charged to it"
            )
        return self

    def resolve_paths(self, base: Path) -> RunConfig:
        """Make the data path and label-value files absolute relative to the config's folder."""
        if self.data.path != "demo" and not Path(self.data.path).is_absolute():
            self.data.path = str((base / self.data.path).resolve())
        for col, vals in self.data.label_values.items():  # files of label values
            if isinstance(vals, str) and vals != DEMO_VALUES and not Path(vals).is_absolute():
                self.data.label_values[col] = str((base / vals).resolve())
        if isinstance(self.prompts.label_descriptions, str):  # read now: the run keeps it inline
            self.prompts.label_descriptions = load_label_descriptions(
                base / self.prompts.label_descriptions)
        return self


@functools.lru_cache(maxsize=8)
def _descriptions_file(path: str) -> dict[str, dict[str, str]]:
    """A descriptions file given by a config built in code (one read per process)."""
    return load_label_descriptions(Path(path))


def load_label_descriptions(path: Path) -> dict[str, dict[str, str]]:
    """A YAML/JSON file {column: {value: description}} (public input); ConfigError names the
    file and what is wrong."""
    where = f"prompts.label_descriptions file {path}"
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(f"{where}: cannot be read ({err.strerror or err})") from None
    except (UnicodeDecodeError, yaml.YAMLError) as err:
        raise ConfigError(f"{where}: not valid UTF-8 YAML/JSON ({type(err).__name__})") from None
    if not isinstance(raw, dict) or not all(
            isinstance(v, dict) and all(isinstance(t, str) for t in v.values())
            for v in raw.values()):
        raise ConfigError(f"{where}: expected a mapping {{column: {{value: description}}}}")
    return {str(col): {str(k): v for k, v in vals.items()} for col, vals in raw.items()}


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
