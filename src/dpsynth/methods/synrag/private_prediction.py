"""Step 4 of DP-SynRAG: private prediction of one synthetic document per cluster.

Each d in S_r gets the prompt p_d = "<instruction> Document: d". For token n,
z_n = sum_{d in S_r} clip_c(logits(p_d, y_<n)) and y_n ~ softmax(z_n / tau) over a candidate
set S_n built from public inputs and released values only (:mod:`.support`; or the whole
vocabulary with ``synrag.support: full``), never top-k / top-p of the private logits: an
exponential mechanism with per-coordinate sensitivity c, rho = (1/2) (c / tau)^2 per token
(docs/methods.md §4; the sampling and its accounting are
:meth:`dpsynth.privacy.PrivacySession.private_token`). clip_c is applied to each document's
logits over S_n (a row over S_n with sup-norm <= c).

Speed: one forward pass per token for ALL documents of the cluster (a KV-cached
:class:`~dpsynth.llm.local.Stepper`), the shared instruction prefix computed once.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .clipping import clip_logits
from .config import STEPPER_ROWS, SynRAGConfig, max_private_tokens, stepper_rows
from .support import Support, support_logits

log = logging.getLogger("dpsynth.rag")

#: Where the document goes in a per-document prompt (split off by :func:`split_prompt`).
DOC_MARK = "\u0000DOC\u0000"


def _no_bar(n: int = 1) -> None:
    """The ``advance`` of a prediction without a progress bar."""


class _Steps:
    """The token steps of one text reported to a progress bar's ``advance`` (a count, never a
    token): :meth:`finish` adds the steps an early end of the text left out."""

    def __init__(self, advance: Callable[..., None]) -> None:
        self.advance = advance
        self.count = 0

    def __call__(self, n: int = 1) -> None:
        self.count += n
        self.advance(n)

    def finish(self, total: int) -> None:
        if total > self.count:
            self.advance(total - self.count)


def split_prompt(gen: Any, user: str, plain_tail: str,
                 system: str | None = None) -> tuple[str, str]:
    """(prefix, suffix) of a per-document prompt: ``user`` holds :data:`DOC_MARK` where the
    document goes; a chat model gets the chat template (with ``system``, if given), any other
    ``user`` + ``plain_tail``."""
    if getattr(gen, "supports_chat", False):
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": user}]
        text = str(gen.tokenizer.apply_chat_template(messages, tokenize=False,
                                                     add_generation_prompt=True))
    else:
        text = user + plain_tail
    prefix, suffix = text.split(DOC_MARK)
    return prefix, suffix


def prompt_parts(gen: Any, instruction: str, lead: str = "") -> tuple[str, str]:
    """(shared prefix, per-document suffix) of the rephrase prompt: the prompt of document d
    is prefix + d + suffix, and the suffix ends with ``lead``, the opening of the rephrased
    text. The prefix ends with a newline (a token boundary)."""
    prefix, suffix = split_prompt(gen, f"{instruction}\nDocument:\n{DOC_MARK}",
                                  "\n\nRephrased document:\n")
    return prefix, suffix + lead


#: Where a rephrase prompt names its cluster's released keyword.
KEYWORD_MARK = "{keyword}"


@dataclass(frozen=True)
class Rephrase:
    """The public rephrase prompt of one text (docs/methods.md §4, step 4): ``instruction``
    goes before the document, ``lead`` opens the rephrased text (the released text starts with
    it; the private tokens continue it), ``closing`` follows the private tokens in the released
    text only (no model sees it). All are public; :data:`KEYWORD_MARK` in any stands for the
    cluster's released keyword, so the prompt and the text are post-processing of a release."""

    instruction: str
    lead: str = ""
    closing: str = ""

    @classmethod
    def of(cls, prompt: str | Rephrase) -> Rephrase:
        return prompt if isinstance(prompt, Rephrase) else cls(prompt)

    def for_keyword(self, keyword: str | None) -> Rephrase:
        """The prompt of the cluster seeded by ``keyword`` (its released seed term)."""
        kw = "" if keyword is None else str(keyword)
        return Rephrase(self.instruction.replace(KEYWORD_MARK, kw),
                        self.lead.replace(KEYWORD_MARK, kw),
                        self.closing.replace(KEYWORD_MARK, kw))

    def parts(self, gen: Any) -> tuple[str, str]:
        """(prefix, suffix) as :func:`prompt_parts`, the lead at the end of the suffix."""
        return prompt_parts(gen, self.instruction, self.lead)

    def text(self, gen: Any, token_ids: Sequence[int], clean: bool = True) -> str:
        """The released text: the lead, the decoded private tokens and the closing."""
        text = self.lead + gen.decode(list(token_ids))
        text = clean_text(text) if clean else text
        return join_closing(text, self.closing)


def truncate_documents(gen: Any, docs: Sequence[str], max_tokens: int) -> tuple[list[str], int]:
    """Documents cut to at most ``max_tokens`` tokens, and how many were cut (never dropped)."""
    out: list[str] = []
    cut = 0
    for d in docs:
        ids = gen.encode(d)
        if len(ids) > max_tokens:
            cut += 1
            out.append(gen.decode(ids[:max_tokens]))
        else:
            out.append(d)
    return out, cut


#: Tokens a row may take beyond ``max_doc_tokens`` + the suffix's own (a cut document
#: re-encoded with the suffix may merge or split a token at the seam).
SEAM_TOKENS = 4


def document_width(gen: Any, suffix: str, max_doc_tokens: int) -> int:
    """The public width of a document row: ``max_doc_tokens`` + the suffix's tokens + the
    seam's; no row is longer (:func:`open_documents` cuts one that would be)."""
    return max_doc_tokens + len(gen.encode(suffix)) + SEAM_TOKENS


def open_documents(gen: Any, documents: Sequence[str], prefix: str, suffix: str,
                   max_doc_tokens: int, rows: int = STEPPER_ROWS) -> tuple[Any | None, int]:
    """(the stepper over one cluster's documents, how many were cut to ``max_doc_tokens``
    tokens); None without documents.

    Each document's logits are a function of that document alone ("Rows apart", docs/methods.md
    §4): a batched stepper pads every row to the longest and picks its kernels by the batch
    size, so one document's presence would move every other row's numbers and the sum's
    sensitivity would exceed c. Here each row is prefilled alone and decoded ``rows`` at a time
    at the public :func:`document_width` (:func:`dpsynth.llm.stepper.open_rows_apart`)."""
    from ...llm.stepper import open_rows_apart

    docs, cut = truncate_documents(gen, documents, max_doc_tokens)
    if not docs:
        return None, cut
    width = document_width(gen, suffix, max_doc_tokens)
    rows_text = []
    for d in docs:
        row = d + suffix
        if len(gen.encode(row)) > width:  # the seam took more than SEAM_TOKENS
            cut += 1
            while len(gen.encode(row)) > width:
                d = gen.decode(gen.encode(d)[:-SEAM_TOKENS])
                row = d + suffix
        rows_text.append(row)
    return open_rows_apart(gen, rows_text, prefix, width=width, rows=rows), cut


_LABEL = re.compile(r"^\s*(?:rephrased\s+)?(?:document|text)\s*:\s*", re.I)


def clean_text(text: str) -> str:
    """Drop a leading "Document:" label the model tends to echo (post-processing)."""
    return _LABEL.sub("", text, count=1).strip()


def join_closing(text: str, closing: str) -> str:
    """``text`` followed by the public ``closing``, one space between them (none when the
    closing is empty or starts with a space)."""
    if not closing:
        return text
    sep = "" if not text or closing[0].isspace() or text[-1].isspace() else " "
    return text + sep + closing


def clipped_sum(logits: np.ndarray, clip: float) -> np.ndarray:
    """z = sum over rows of clip_c(logits) (docs/methods.md §4)."""
    return np.asarray(clip_logits(np.asarray(logits, dtype=np.float64), clip)).sum(axis=0)


@dataclass(frozen=True)
class Prediction:
    """One synthetic document from private prediction."""

    text: str
    token_ids: list[int]
    steps: int  # private tokens drawn (<= T; EOS stops early)
    truncated: int  # documents truncated to max_doc_tokens


class PublicSide:
    """The public model's side of one text: a stepper over the rephrase prompt with NO
    document (batch of its own), advanced by the released tokens; its next-token logits give
    the public top tokens of the candidate set (and the shortcut's public row)."""

    def __init__(self, gen: Any, instruction: str | Rephrase, support: Support | None,
                 need_logits: bool = False) -> None:
        self.support = support
        self.stepper = None
        if need_logits or (support is not None and support.top > 0):
            prefix, suffix = Rephrase.of(instruction).parts(gen)
            self.stepper = gen.open_stepper([prefix + suffix])

    def logits(self) -> np.ndarray | None:
        """The public next-token logit row (None without a public stepper)."""
        return None if self.stepper is None else np.asarray(self.stepper.logits())[0]

    def ids(self) -> np.ndarray | None:
        """S_n for the next token (None: the whole vocabulary)."""
        if self.support is None:
            return None
        return self.support.at(self.logits())

    def advance(self, tok: int) -> None:
        if self.stepper is not None:
            self.stepper.advance(int(tok))

    def close(self) -> None:
        if self.stepper is not None:
            self.stepper.close()


def private_predict(
    session: Any,
    key: str,
    gen: Any,
    documents: Sequence[str],
    *,
    instruction: str | Rephrase,
    tokens: int,
    clip: float,
    temperature: float,
    max_doc_tokens: int,
    parts: tuple[str, str] | None = None,
    support: Support | None = None,
    rows: int = STEPPER_ROWS,
    advance: Callable[..., None] = _no_bar,
) -> Prediction:
    """Private prediction over ``documents`` (one cluster's S_r). Every token is a keyed
    release ``{key}/tok{n}`` in ``session`` (a resumed build replays stored tokens), drawn
    over the public candidate set of ``support`` (:mod:`.support`; None: the whole
    vocabulary).

    With no documents z = 0: the tokens are uniform over the candidates (the same mechanism
    run on an empty set; its release is still made and charged). ``parts`` = (prefix, suffix)
    overrides the rephrase prompt (document i reads prefix + d_i + suffix); ``instruction``
    may be a :class:`Rephrase` with a lead the text starts with; ``rows``: documents per
    decode pass (:func:`open_documents`); ``advance()``: called after each token (a bar)."""
    eos = set(getattr(gen, "eos_token_ids", (gen.eos_token_id,)))
    out: list[int] = []
    prompt = Rephrase.of(instruction)
    prefix, suffix = parts if parts is not None else prompt.parts(gen)
    public = PublicSide(gen, prompt, support)
    try:  # callers log ``cut``
        stepper, cut = open_documents(gen, documents, prefix, suffix, max_doc_tokens, rows)
    except BaseException:
        public.close()
        raise
    steps = 0
    try:
        for n in range(tokens):
            ids = public.ids()
            if stepper is not None:
                z = clipped_sum(support_logits(stepper, ids), clip)
            else:
                z = np.zeros(int(gen.vocab_size) if ids is None else ids.size)
            tok = session.private_token(f"{key}/tok{n:04d}", z, clip, temperature,
                                        **({"support": ids} if ids is not None else {}))
            steps = n + 1
            advance()
            if tok in eos:
                break
            out.append(int(tok))
            if n + 1 < tokens:
                if stepper is not None:
                    stepper.advance(int(tok))
                public.advance(int(tok))
    finally:
        public.close()
        if stepper is not None:
            stepper.close()
    return Prediction(prompt.text(gen, out, clean=stepper is not None), out, steps, cut)


# ----------------------------------------------------------------------- public shortcut


@dataclass(frozen=True)
class Shortcut:
    """Sparse-vector public-token shortcut (after Amin et al. 2024), opt-in.

    At each step the public model (the rephrase prompt with an EMPTY document) proposes
    logits p; the query q_n = || sum_{d in S} (clip_c(l_d) - clip_c(p)) ||_inf measures how far
    the documents are from it (adding or removing one document moves q by at most 2c: Delta =
    2c). AboveThreshold (Dwork & Roth 2014, Alg. 1) with Laplace noise: rho_hat = theta +
    Lap(2 Delta / eps), and at each step nu = Lap(4 Delta / eps); q + nu >= rho_hat means "the
    documents disagree": a PRIVATE token is drawn (softmax(z / tau), charged) and a new
    AboveThreshold instance starts; otherwise the token is sampled from the public
    distribution (free: public prompt, released tokens, public randomness). At most ``m``
    private tokens; after the m-th, the rest of the text is public. Each instance is eps-DP
    (pure, so eps^2 / 2-zCDP), so one synthetic text costs at most
    m (eps^2 / 2 + (c / tau)^2 / 2) in zCDP instead of T (c / tau)^2 / 2.
    ``threshold`` theta is in the units of q (sums of clipped logits).
    """

    epsilon: float
    max_private: int
    threshold: float


def _laplace(u: np.ndarray, scale: float) -> np.ndarray:
    """Laplace(0, scale) by the inverse CDF of uniforms in (0, 1)."""
    v = np.asarray(u, dtype=np.float64) - 0.5
    return -scale * np.sign(v) * np.log1p(-2.0 * np.abs(v))


def shortcut_stats(logits: np.ndarray, pub_clip: np.ndarray,
                   clip: float) -> tuple[np.ndarray, float]:
    """(z, q) of the documents' next-token logit rows: z = sum_d clip_c(l_d) and the SVT query
    q = || sum_d (clip_c(l_d) - clip_c(p)) ||_inf (``pub_clip`` = clip_c(p), the public row)."""
    rows = np.asarray(clip_logits(np.asarray(logits, dtype=np.float64), clip))
    return rows.sum(axis=0), float(np.abs((rows - pub_clip).sum(axis=0)).max())


class ShortcutText:
    """One synthetic text with the public-token :class:`Shortcut`, on the side of the privacy
    session: the SVT noise (drawn once and stored under ``{key}/svt`` with its cost, eps^2/2 per
    instance, m instances, so a resumed build reuses it), the public stepper and the tokens
    released so far. Each :meth:`release` takes the documents' (z, q) for the next token
    (:func:`shortcut_stats`, computed wherever the documents are) and releases one token."""

    def __init__(self, session: Any, key: str, gen: Any, *, instruction: str | Rephrase,
                 tokens: int,
                 clip: float, temperature: float, shortcut: Shortcut,
                 support: Support | None = None) -> None:
        from ...privacy import ZCDPEvent

        self.session, self.key, self.gen = session, key, gen
        self.tokens, self.clip, self.temperature, self.sc = tokens, clip, temperature, shortcut
        self.eos = set(getattr(gen, "eos_token_ids", (gen.eos_token_id,)))
        self.delta_q = 2.0 * clip
        sc = shortcut
        # admitted against the budget before the noise is drawn; a stored key is replayed
        noise = session.release_external(
            f"{key}/svt",
            ZCDPEvent(0.5 * sc.epsilon**2, sc.max_private, "svt"),
            lambda: _svt_noise(session, key, tokens, sc.max_private + 1),
        )
        self.thr_u = np.asarray(noise["threshold"], dtype=np.float64)
        self.q_u = np.asarray(noise["query"], dtype=np.float64)
        self.rho_hat = sc.threshold + float(_laplace(self.thr_u[0],
                                                     2 * self.delta_q / sc.epsilon))
        self.rng = np.random.default_rng(
            int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big"))
        self.prompt = Rephrase.of(instruction)
        self.public = PublicSide(gen, self.prompt, support, need_logits=True)
        self.ids: np.ndarray | None = None  # S_n of the next token (None: whole vocabulary)
        self.out: list[int] = []
        self.private = 0  # private tokens drawn
        self.steps = 0
        self.done = tokens <= 0
        self._p_row: np.ndarray | None = None

    def public_clip(self) -> np.ndarray:
        """clip_c of the public next-token logits over S_n (what the documents' side compares
        with; :attr:`ids` is S_n, None for the whole vocabulary)."""
        row = self.public.logits()
        assert row is not None
        self._p_row = np.asarray(row, dtype=np.float64)
        self.ids = self.public.ids()
        sub = self._p_row if self.ids is None else self._p_row[self.ids]
        return np.asarray(clip_logits(sub, self.clip))

    def release(self, z: np.ndarray, q: float) -> int:
        """Token n (after :meth:`public_clip`): a private token drawn from softmax(z / tau) when
        the documents disagree with the public model (AboveThreshold), else a public one."""
        sc, n = self.sc, self.steps
        assert self._p_row is not None
        above = self.private < sc.max_private and (
            q + float(_laplace(self.q_u[n], 4 * self.delta_q / sc.epsilon)) >= self.rho_hat)
        if above:
            extra = {"support": self.ids} if self.ids is not None else {}
            tok = int(self.session.private_token(f"{self.key}/tok{n:04d}", z, self.clip,
                                                 self.temperature, **extra))
            self.private += 1
            if self.private < len(self.thr_u):
                self.rho_hat = sc.threshold + float(
                    _laplace(self.thr_u[self.private], 2 * self.delta_q / sc.epsilon))
        else:  # public token: softmax of the public logits, public randomness
            w = self._p_row / self.temperature
            w = np.exp(w - w.max())
            tok = int(self.rng.choice(w.size, p=w / w.sum()))
        self.steps = n + 1
        if tok in self.eos or self.steps >= self.tokens:
            self.done = True
        if tok not in self.eos:
            self.out.append(tok)
            if not self.done:
                self.public.advance(tok)
        return tok

    def prediction(self, cut: int) -> Prediction:
        return Prediction(self.prompt.text(self.gen, self.out), self.out, self.steps, cut)

    def close(self) -> None:
        self.public.close()


def private_predict_shortcut(
    session: Any,
    key: str,
    gen: Any,
    documents: Sequence[str],
    *,
    instruction: str | Rephrase,
    tokens: int,
    clip: float,
    temperature: float,
    max_doc_tokens: int,
    shortcut: Shortcut,
    support: Support | None = None,
    rows: int = STEPPER_ROWS,
    advance: Callable[..., None] = _no_bar,
) -> tuple[Prediction, int]:
    """Private prediction with the public-token shortcut (:class:`ShortcutText`) over
    ``documents``, private tokens over ``support``'s candidates; returns (prediction,
    private tokens drawn). ``advance()``: called after each token (a bar)."""
    text = ShortcutText(session, key, gen, instruction=instruction, tokens=tokens, clip=clip,
                        temperature=temperature, shortcut=shortcut, support=support)
    prefix, suffix = text.prompt.parts(gen)
    try:
        stepper, cut = open_documents(gen, documents, prefix, suffix, max_doc_tokens, rows)
    except BaseException:
        text.close()
        raise
    try:
        while not text.done:
            pub_clip = text.public_clip()
            if stepper is not None:
                z, q = shortcut_stats(support_logits(stepper, text.ids), pub_clip, clip)
            else:
                z, q = np.zeros_like(pub_clip), 0.0
            tok = text.release(z, q)
            advance()
            if stepper is not None and not text.done:
                stepper.advance(tok)
    finally:
        text.close()
        if stepper is not None:
            stepper.close()
    return text.prediction(cut), text.private


def shortcut_of(cfg: SynRAGConfig, clip: float) -> Shortcut | None:
    """The synrag section's :class:`Shortcut` (None: plain private prediction)."""
    if not cfg.public_shortcut:
        return None
    threshold = cfg.svt_threshold if cfg.svt_threshold is not None else cfg.target_size * clip
    return Shortcut(cfg.svt_epsilon, max_private_tokens(cfg), threshold)


def rephrase_of(cfg: SynRAGConfig, keyword: str | None = None) -> Rephrase:
    """The synrag section's rephrase prompt for the cluster seeded by ``keyword``."""
    return Rephrase(cfg.rephrase_instruction, cfg.lead, cfg.closing).for_keyword(keyword)


def predict_text(session: Any, key: str, gen: Any, documents: Sequence[str],
                 cfg: SynRAGConfig, clip: float,
                 support: Support | None = None,
                 prompt: Rephrase | None = None,
                 advance: Callable[..., None] = _no_bar) -> tuple[Prediction, int]:
    """One synthetic text over ``documents`` as the synrag section ``cfg`` says: private
    prediction over ``support``'s public candidates (None: the whole vocabulary), with the
    public-token :class:`Shortcut` when ``cfg.public_shortcut``, and the cluster's rephrase
    ``prompt`` (None: the section's, no keyword). Returns (prediction, private tokens
    drawn). ``advance(n)``: a bar's, ``cfg.tokens`` steps in all (an early end adds the
    rest)."""
    steps = _Steps(advance)
    opts: dict[str, Any] = {"instruction": prompt or rephrase_of(cfg), "tokens": cfg.tokens,
                            "clip": clip, "temperature": cfg.temperature,
                            "max_doc_tokens": cfg.max_doc_tokens, "support": support,
                            "rows": stepper_rows(cfg), "advance": steps}
    shortcut = shortcut_of(cfg, clip)
    if shortcut is None:
        pred = private_predict(session, key, gen, documents, **opts)
        done = pred, pred.steps
    else:
        done = private_predict_shortcut(session, key, gen, documents, shortcut=shortcut, **opts)
    steps.finish(cfg.tokens)
    return done


def _svt_noise(session: Any, key: str, tokens: int, instances: int) -> dict[str, list[float]]:
    """Uniforms for the SVT's Laplace noise, from the session's keyed noise source."""
    spawn = getattr(session.noise, "spawn", None)
    src = spawn(f"{key}/svt") if callable(spawn) else session.noise
    eps = np.finfo(np.float64).tiny
    u = np.clip(np.asarray(src.uniform(tokens + instances), dtype=np.float64), eps, 1 - 1e-16)
    return {"threshold": u[:instances].tolist(), "query": u[instances:].tolist()}
