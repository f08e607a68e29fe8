"""One YAML file describes a run: data, method, privacy target, generators, embedder, sizes.

The config is validated completely before any model is loaded: an unknown method, a label
column that does not exist, sizes that cannot be generated, or epsilon 0 with private voting
fail here with a message that says what to change.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails

from .errors import ConfigError as ConfigError  # re-exported; the class lives in dpsynth.errors


class Section(BaseModel):
    """A config section: every key is a declared field (a typo is an error naming it)."""

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


class DataConfig(Section):
    """Where the private records are and which columns hold text, labels and users.

    ``path: demo`` uses the built-in demo corpus (written into the run's private area).
    The label domain is public input (docs/methods.md §0): ``label_values`` maps each label
    column to its values (a list, a file with one value per line, or ``demo`` for the demo
    corpus's public departments and urgencies); the joint classes are their product in
    declared order. Values declared for a column not in ``labels`` are unused (so an override
    of ``labels`` to fewer columns keeps working). ``label_domain: discover`` finds undeclared
    domains privately instead (dpsynth.label_domain), charging a Gaussian release of scale
    ``label_domain_sigma`` and an extra ``label_domain_delta``. At user level each user counts
    towards at most ``label_domain_max_values_per_user`` values per column (default 4: a user
    with up to 4 values counts towards all of them, 1/sqrt(m) each, and the union bound over 4
    values raises the threshold by 3% over k = 1 at the default noise; docs/methods.md §0).
    ``deduplicate`` drops rows that repeat an earlier row (a 1-stable step: adding or removing
    one record changes the deduplicated records by at most one; at user level only within a
    user).
    """

    path: str = "demo"
    source: str | None = Field(
        None, min_length=1,
        description="the data source the budget ledger charges (default: the file's resolved "
                    "path; 'demo' for the demo corpus): every run on any subset, column, unit "
                    "or version of one source shares its budget")
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
        description="discover: extra delta charged (chance a value held by one record or "
                    "user alone is kept)",
    )
    label_domain_max_values_per_user: int = Field(
        4, ge=1,
        description="discover, privacy.unit user: the most values of each label column one "
                    "user counts towards (their most frequent; ties: smaller value)",
    )
    user: str | None = None
    deduplicate: bool = Field(
        False, description="drop rows repeating an earlier row's text and labels (at "
                           "privacy.unit user: and user id); false keeps them, with a warning")
    max_chars: int = Field(20000, gt=0)
    limit: int | None = Field(None, gt=0, description="use only the first N rows")
    demo_rows: int = Field(600, gt=0)
    demo_seed: int = 0
    # records given in memory (dpsynth.generate with a DataFrame): a pyarrow Table written to
    # ``path`` in the run's private area when the run starts; never part of config.yaml
    _staged_records: Any = PrivateAttr(default=None)

    def stage_records(self, table: Any) -> None:
        """Keep records given in memory for the run to write into its private area."""
        self._staged_records = table

    @property
    def staged_records(self) -> Any:
        """The records given in memory (a pyarrow Table), or None."""
        return self._staged_records

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


class PrivacyConfig(Section):
    """The privacy target and how noise is drawn (docs/methods.md §0).

    ``noise: secure`` (the default) draws from the OS CSPRNG. ``noise: seeded`` is a research
    mode: the guarantee holds only while the seed stays secret. ``seed: null`` (the default)
    draws a random seed per run, kept in the run's private/ folder; it also drives
    post-processing randomness. The ledger refuses one (dataset, seed) pair twice.
    """

    epsilon: float = Field(4.0, ge=0)
    delta: float = Field(1e-5, gt=0, lt=1)
    accountant: Literal["pld", "rdp", "zcdp"] = Field(
        "pld", description="pld, rdp or zcdp; the Gaussian-DP closed form ('gdp' of `dpsynth "
                           "privacy`) holds for continuous noise only, and every release of a "
                           "run is a discrete Gaussian (docs/methods.md §0)")
    noise: Literal["seeded", "secure"] = "secure"
    seed: int | None = Field(None, ge=0, description="null: drawn at random, kept in private/")
    unit: Literal["record", "user"] = "record"
    total_epsilon: float | None = Field(None, gt=0, description="dataset budget in the ledger")
    total_delta: float | None = Field(None, gt=0, lt=1)
    no_cap: bool = Field(
        False, description="run past the default epsilon cap (10) of a source that has no cap "
                           "of its own (`generate --no-cap`); a cap set on the source, or "
                           "total_epsilon here, still applies")
    ledger: str | None = None


#: Candidate sampling of the PE methods, chosen on the Yelp validation split with SmolLM2
#: (benchmarks/results/sampling_val.md): a truncated support is post-processing here (the
#: candidates are public outputs), unlike DP-SynRAG's private tokens, which never use these.
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 1.0
DEFAULT_TOP_K = 50


class GeneratorConfig(Section):
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
    engine: Literal["auto", "transformers", "ctranslate2", "openvino"] = Field(
        "auto", description="local: auto = openvino bf16 where the CPU has native bf16 and two "
                            "threads, else ctranslate2 int8 when installed, else transformers"
    )
    threads: int | None = Field(
        None, gt=0, description="local: CPU threads; None = the idle cores (never more)"
    )
    device: str = Field(
        "cpu", pattern=r"^(cpu|auto|cuda(:[0-9]+)?)$",
        description="local: where the model runs: cpu, cuda, cuda:N, or auto (a GPU when torch "
                    "sees one); on a GPU the transformers engine runs there (docs/gpu.md)")
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
    max_new_tokens: int | None = Field(
        None, gt=0, description="tokens a generation may take; null: from the texts' length "
                                "(synthesis.max_words, or Aug-PE's DP estimate of the records' "
                                "length), 64 where there is none")
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
        if self.backend == "local" and (self.base_url or self.base_urls):
            raise ValueError("generators: base_url / base_urls are for backend 'openai' (a "
                             "server); set backend: openai too, or drop the URL for the local "
                             "model")
        if self.backend == "openai" and self.device != "cpu":
            raise ValueError("generators: device is for backend 'local'; a server chooses "
                             "its own GPU")
        return self

    def spec(self) -> str | dict[str, Any]:
        """The model this entry names, as dpsynth.llm.load_generator takes it (what a release
        records of its generator: no batch size; loading uses :meth:`load_spec`)."""
        if self.backend == "local":
            if self.engine == "auto" and self.threads is None and self.device == "cpu":
                return self.model
            return {"backend": "local", "model": self.model, "engine": self.engine,
                    "num_threads": self.threads,
                    **({"device": self.device} if self.device != "cpu" else {})}
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

    def load_spec(self) -> str | dict[str, Any]:
        """:meth:`spec` with everything loading it takes (a local model's batch size)."""
        spec = self.spec()
        if self.backend != "local" or self.batch_size is None:
            return spec
        base = {"backend": "local", "model": spec} if isinstance(spec, str) else spec
        return {**base, "batch_size": self.batch_size}

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


class EmbedderConfig(Section):
    """Sentence embedder; fast engines must match torch to cosine 0.999 (see dpsynth.embed)."""

    model: str = "minilm"
    batch_size: int = Field(16, gt=0, description="rows a pass of the fixed-shape "
                            "embedding (dpsynth.embed.engines)")
    engine: Literal["auto", "torch", "onnx", "openvino"] = Field(
        "auto", description="auto: openvino, else onnx, else torch (first that is installed "
        "and agrees with torch)")
    threads: int | None = Field(None, gt=0, description="CPU threads (default: all cores)")
    device: str = Field(
        "cpu", pattern=r"^(cpu|auto|cuda(:[0-9]+)?)$",
        description="cpu, cuda, cuda:N or auto (a GPU when torch sees one); off the CPU the "
                    "torch engine runs (engine auto or torch)")

    @model_validator(mode="after")
    def _graph_engines_run_on_the_cpu(self) -> EmbedderConfig:
        if self.device != "cpu" and self.engine in ("onnx", "openvino"):
            raise ValueError(f"embedder: engine {self.engine!r} runs on the CPU; with device "
                             f"{self.device!r} use engine auto or torch")
        return self


class PromptConfig(Section):
    """What the synthetic texts are; `{column}` fields are filled with each label's value."""

    task: str = "a short text"
    label_template: str = ""
    writer: str = Field(
        "", description="public: who writes the texts (e.g. 'a customer of an online bank'); "
                        "when set, every prompt says 'You are {writer}.' (a chat model's "
                        "system message, in place of its template's default assistant one; a "
                        "plain model's first sentence), so that a small model writes as that "
                        "person rather than about them or as an assistant "
                        "(benchmarks/results/readable_defaults.md)")
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


class PreferenceConfig(Section):
    """Aug-PE: a local generator that learns from the released votes (POPri's idea; no
    budget: the votes are released; docs/methods.md §1). Opt-in: ``enabled``."""

    enabled: bool = False
    pairs: int = Field(64, ge=1, description="preference pairs trained on after each vote")
    rank: int = Field(8, ge=1, description="LoRA rank")
    beta: float = Field(0.1, gt=0, description="DPO's beta")
    learning_rate: float = Field(5e-5, gt=0)
    epochs: int = Field(1, ge=1)
    batch_size: int = Field(8, ge=1)
    max_length: int = Field(256, ge=16, description="prompt + answer tokens per pair")
    precision: Literal["auto", "float32", "bf16"] = Field(
        "auto", description="the trainer's arithmetic: float32 weights, with 'bf16' under "
                            "bf16 autocast; 'auto': bf16 where the CPU multiplies bf16 natively "
                            "(AVX512-BF16, AMX), float32 elsewhere (post-processing either way)")


class SynthesisConfig(Section):
    """Sizes and switches of the shared evolution loop (docs/methods.md §1)."""

    samples: int = Field(60, gt=0, description="N: synthetic samples released")
    population: int | None = Field(
        None, gt=0, description="Aug-PE: samples kept per voting round (the voting population, "
                                "N_vote x pool_multiplier candidates are voted on); null: "
                                "chosen from the released record count so that a candidate's "
                                "expected votes are at least planning.VOTE_MARGIN x the noise "
                                "(at most samples). The release is drawn from the last round's "
                                "winners and their variations")
    max_words: int | None = Field(
        None, gt=0, description="the longest text to write, in words (public); null: Aug-PE "
                                "estimates it from the records' length histogram, released "
                                "with the label counts (no extra release)")
    min_words: int | None = Field(
        None, gt=0, description="the shortest text kept, in words (public): a shorter one is "
                                "refused and regenerated; null: Aug-PE takes the short end of "
                                "its DP length estimate (none without it)")
    lengths: Literal["drawn", "longest"] = Field(
        "drawn", description="Aug-PE with an estimated length: 'drawn' caps each zero-shot "
                             "request at a length drawn from the released length distribution "
                             "(its bins up to max_words) and each variation at its parent's "
                             "length bin, so the texts' lengths follow the records'; "
                             "'longest' caps every text at max_words")
    iterations: int = Field(2, ge=0, description="T: private voting rounds")
    label_split: Literal["noisy_counts", "uniform"] = Field(
        "noisy_counts", description="Aug-PE, WASP and SecPE: the release and the votes split "
                                    "over the label classes by the DP label counts (James-"
                                    "Stein-shrunk by their noise; SecPE: its public records' "
                                    "counts), or evenly (the counts are still released where "
                                    "the run sizes its votes or lengths from them). "
                                    "uniform suits labels about balanced, or a balanced test "
                                    "set (docs/which-method.md)")
    pool_multiplier: int = Field(3, ge=1, description="L: candidates per kept sample")
    k: int = Field(1, ge=1, description="nearest candidates each record votes for")
    threshold: float = Field(0.0, ge=0, description="theta, in units of the noise sigma")
    selection: Literal["rank", "sample"] = "rank"
    variation: Literal["rephrase", "fill_in", "mixed"] = "rephrase"
    mask_rate: float = Field(0.5, gt=0, lt=1)
    lookahead: int = Field(0, ge=0)
    min_chars: int = Field(12, ge=1)
    strip_echoes: bool = Field(
        True, description="remove from each generation the sentences of its instruction's "
                           "request line it repeats (the label sentence, 'Write ...')")
    drop_off_task: bool = Field(
        True, description="drop, and retry, generations that comment on the prompt (its good "
                          "and bad examples, the rephrasing asked for), answer in the "
                          "assistant's voice ('How can I help you?', '[Your Name]'), hold a "
                          "placeholder ('[...]', '{name}'), answer instead of writing the "
                          "record ('The answer to this question ...') or, with prompts.writer "
                          "set, speak about the writer ('This customer wants ...') or repeat "
                          "its description, instead of being a sample. On the real records of "
                          "Banking77 and Yelp it refuses 0 % and 0.5 %")
    label_check: bool = Field(
        True, description="refuse, and retry, a generation whose own label value is not among "
                          "the nearest to it of its column's values (their descriptions or "
                          "names, embedded): another label's text. Public inputs only, no "
                          "budget. A column whose values the embedder does not separate on "
                          "the candidates (kappa below 0.3, e.g. star ratings) is not checked. "
                          "On SmolLM2's zero-shot Banking77 messages it raised the share "
                          "matching their intent from 0.60 to 0.79 "
                          "(benchmarks/results/label_check.md)")
    retries: int = Field(2, ge=0, description="extra tries for empty or refused generations")
    preference: PreferenceConfig = Field(default_factory=PreferenceConfig)
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


def ray_address_form(value: str, field: str) -> str:
    """A Ray address setting: 'local', 'auto', 'ray://HOST:PORT' or 'HOST:PORT'."""
    if value in {"auto", "local"} or value.startswith("ray://") or ":" in value:
        return value
    raise ValueError(f"{field} {value!r}: use local, auto, ray://HOST:PORT or HOST:PORT")


class ComputeConfig(Section):
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
        return ray_address_form(value, "compute.address")


class RunConfig(BaseModel):
    """A run: the sections every method reads, plus method sections (``wasp:``, ``secpe:``,
    ``synrag:``): each owned by its method (a registered method's name), validated by that
    method's config model through the registry (:func:`dpsynth.methods.section_model`) and
    kept as that model, so it is dumped (config.yaml, the resume digest) like the rest. The
    run's own method's section is filled with its defaults when absent. Any other key is an
    error naming it. A method reads its section with ``Method.settings(config)``."""

    model_config = ConfigDict(extra="allow")

    method: str = "aug_pe"
    data: DataConfig = Field(default_factory=DataConfig)
    privacy: PrivacyConfig = Field(default_factory=PrivacyConfig)
    generators: list[GeneratorConfig] = Field(default_factory=lambda: [GeneratorConfig()])
    embedder: EmbedderConfig = Field(default_factory=EmbedderConfig)
    prompts: PromptConfig = Field(default_factory=PromptConfig)
    synthesis: SynthesisConfig = Field(default_factory=SynthesisConfig)
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
    def _method_sections(self) -> RunConfig:
        from .methods import canonical_name, section_model

        extra = self.__pydantic_extra__
        if extra is None:  # built without validation (model_construct)
            return self
        errors: list[InitErrorDetails] = []
        for key, value in list(extra.items()):
            model = section_model(key)
            if model is None:
                errors.append(InitErrorDetails(type="extra_forbidden", loc=(key,), input=value))
            elif not isinstance(value, model):
                try:
                    extra[key] = model.model_validate({} if value is None else value)
                except ValidationError as err:
                    errors.extend(InitErrorDetails(type=e["type"], loc=(key, *e["loc"]),
                                                   input=e["input"], ctx=e.get("ctx", {}))
                                  for e in err.errors())
        if errors:
            raise ValidationError.from_exception_data(type(self).__name__, errors)
        own = canonical_name(self.method, warn=False)
        model = section_model(own)
        if model is not None and own not in extra:
            extra[own] = model()
        return self

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
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not valid YAML (not UTF-8 text)") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or type(err).__name__
        raise ConfigError(f"{path}{where}: not valid YAML ({problem})") from None
    if raw is None or raw == {}:
        raise ConfigError(f"{path}: the config is empty; it must name at least the data "
                          "(data.path) or the method: an empty file is not run as the demo "
                          "(examples/demo.yaml is the demo's config)")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    apply_overrides(raw, overrides or {})
    return parse_config(raw, str(path)).resolve_paths(path.parent)


def apply_overrides(raw: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Set dotted keys in a nested mapping, in place (``privacy.epsilon``,
    ``generators.0.temperature``: a number indexes a list; the index one past the end appends).

    A section the mapping does not hold yet starts from its default (so ``generators.0.x``
    works on a config without ``generators``). A key that cannot be followed (into a number,
    a list index that is not one, past the end of a list) is a :class:`ConfigError` naming
    the key, never a traceback."""
    from .methods import section_model

    defaults = RunConfig().model_dump(mode="json")
    for dotted in overrides:  # a method section starts from its model's defaults too
        head = str(dotted).split(".", 1)[0]
        model = None if head in defaults else section_model(head)
        if model is not None:
            defaults[head] = model().model_dump(mode="json")
    for dotted, value in overrides.items():
        _set_dotted(raw, str(dotted), value, defaults)


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a true/false value"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return f"a {type(value).__name__}"


def _list_index(node: list[Any], key: str, dotted: str, where: str) -> int:
    """The index ``key`` names in ``node`` (``len(node)`` appends); ConfigError otherwise."""
    if not key.isdigit():
        raise ConfigError(f"--set {dotted}: {where} is a list; give an index after it, e.g. "
                          f"{where}.0" + (f".{key}" if key else ""))
    index = int(key)
    if index > len(node):
        raise ConfigError(f"--set {dotted}: {where} has {len(node)} entr"
                          f"{'y' if len(node) == 1 else 'ies'} (indexes 0 to {len(node) - 1}; "
                          f"{len(node)} adds one)")
    return index


def _set_dotted(raw: dict[str, Any], dotted: str, value: Any, defaults: Any) -> None:
    parts = dotted.split(".")
    if any(not p.strip() for p in parts):
        raise ConfigError(f"--set {dotted!r}: a key part is empty; use dotted keys such as "
                          "privacy.epsilon or generators.0.temperature")
    node: Any = raw
    default: Any = defaults
    for depth, key in enumerate(parts[:-1]):
        where = ".".join(parts[:depth + 1])
        if isinstance(node, list):
            index = _list_index(node, key, dotted, ".".join(parts[:depth]))
            default = default[index] if isinstance(default, list) and index < len(default) \
                else {}
            if index == len(node):
                node.append({})
            elif node[index] is None:
                node[index] = {}
            child = node[index]
        else:
            default = default.get(key) if isinstance(default, dict) else None
            if node.get(key) is None:
                node[key] = copy.deepcopy(default) if isinstance(default, dict | list) else {}
            child = node[key]
        if not isinstance(child, dict | list):
            raise ConfigError(f"--set {dotted}: {where} is {_kind(child)}, not a section with "
                              f"keys under it (set it as --set {where}=VALUE)")
        node = child
    leaf = parts[-1]
    if isinstance(node, list):
        index = _list_index(node, leaf, dotted, ".".join(parts[:-1]))
        if index == len(node):
            node.append(value)
        else:
            node[index] = value
    else:
        node[leaf] = value


def dump_config(config: RunConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
