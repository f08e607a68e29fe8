"""Empirical privacy audits (reported apart from the formal guarantee).

An audit can show leakage; it cannot prove its absence. Every function here returns numbers
(counts, rates, distances, p-values), never the private strings it matched, so that its output
may go into a report.

- :func:`dcr_audit`: distance to closest record, synthetic->private against synthetic->holdout.
- :func:`membership_inference`: a distance-based attack; score = max similarity of a candidate
  record to the synthetic set; members = private records, non-members = holdout records.
- :func:`pii_leakage`: e-mails, phone numbers and names (found by Presidio's analyzer) in the
  output that occur in the private data.
- :func:`insert_canaries` / :func:`count_canary_hits`: secret strings planted in n private
  records and searched for in the output.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from .common import MetricUnavailable

# -- nearest-record distances ----------------------------------------------------------------


def _unit(x: np.ndarray) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float32)
    if arr.ndim != 2:
        raise ValueError(f"expected a 2-D embedding array, got shape {arr.shape}")
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    return arr / np.maximum(norms, 1e-12)


def max_similarity(queries: np.ndarray, refs: np.ndarray) -> np.ndarray:
    """Cosine similarity of each query row to its nearest row of ``refs`` (exact faiss)."""
    from ..knn import nearest

    q, r = _unit(queries), _unit(refs)
    if len(r) == 0:
        raise MetricUnavailable("no reference records to compare with")
    if len(q) == 0:
        return np.zeros(0, dtype=np.float64)
    scores, _ = nearest(q, r, k=1, metric="ip")
    return scores[:, 0].astype(np.float64)


def _equal_subsample(
    a: np.ndarray, b: np.ndarray, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Subsample both sets to the smaller size (more reference points = smaller distances)."""
    n = min(len(a), len(b))
    rng = np.random.default_rng(seed)
    if len(a) > n:
        a = a[np.sort(rng.choice(len(a), n, replace=False))]
    if len(b) > n:
        b = b[np.sort(rng.choice(len(b), n, replace=False))]
    return a, b


def dcr_audit(
    synthetic: np.ndarray,
    private: np.ndarray,
    holdout: np.ndarray,
    copy_threshold: float = 0.99,
    seed: int = 0,
) -> dict[str, Any]:
    """Distance to closest record (cosine distance 1 - sim), synthetic->private vs ->holdout.

    Private and holdout sets are subsampled to the same size so their distances compare fairly.
    Without memorisation each synthetic record is as likely to sit closer to the private set as
    to the holdout set; ``gap`` = median(d_holdout) - median(d_private) > 0 and a small one-sided
    p-value (Wilcoxon signed-rank on the paired distances, alternative: private closer) point to
    memorisation. ``near_copies_*`` count synthetic records with similarity >= copy_threshold.
    """
    from scipy.stats import binomtest, wilcoxon

    if len(synthetic) < 2:
        raise MetricUnavailable(f"DCR needs at least 2 synthetic records, got {len(synthetic)}")
    if min(len(private), len(holdout)) < 2:
        raise MetricUnavailable(
            f"DCR needs at least 2 private and 2 holdout records, got {len(private)} and "
            f"{len(holdout)}"
        )
    priv, hold = _equal_subsample(np.asarray(private), np.asarray(holdout), seed)
    s_priv = max_similarity(synthetic, priv)
    s_hold = max_similarity(synthetic, hold)
    d_priv, d_hold = 1.0 - s_priv, 1.0 - s_hold
    diff = d_hold - d_priv
    nonzero = diff[np.abs(diff) > 1e-9]
    closer = int((nonzero > 0).sum())
    if len(nonzero) == 0:
        p_wilcoxon = p_binom = 1.0
    else:
        p_wilcoxon = float(wilcoxon(nonzero, alternative="greater").pvalue)
        p_binom = float(binomtest(closer, len(nonzero), 0.5, alternative="greater").pvalue)
    return {
        "n_synthetic": len(d_priv),
        "n_reference": len(priv),
        "median_private": float(np.median(d_priv)),
        "median_holdout": float(np.median(d_hold)),
        "mean_private": float(d_priv.mean()),
        "mean_holdout": float(d_hold.mean()),
        "gap": float(np.median(d_hold) - np.median(d_priv)),
        "share_closer_to_private": float(closer / len(nonzero)) if len(nonzero) else 0.5,
        "p_value": p_wilcoxon,
        "p_value_sign_test": p_binom,
        "near_copies_private": int((s_priv >= copy_threshold).sum()),
        "near_copies_holdout": int((s_hold >= copy_threshold).sum()),
        "copy_threshold": copy_threshold,
        "memorisation_signal": bool(p_wilcoxon < 0.01 and np.median(d_hold) > np.median(d_priv)),
    }


def tpr_at_fpr(fpr: np.ndarray, tpr: np.ndarray, target: float) -> float:
    """Largest TPR reached at a false-positive rate no higher than ``target``."""
    ok = fpr <= target + 1e-12
    return float(tpr[ok].max()) if ok.any() else 0.0


def membership_inference(
    synthetic: np.ndarray,
    members: np.ndarray,
    non_members: np.ndarray,
    fprs: Sequence[float] = (0.01, 0.1),
) -> dict[str, Any]:
    """Distance-based membership inference against the synthetic release.

    Score of a candidate = its max cosine similarity to the synthetic set (closer = "member").
    Returns the ROC AUC (0.5 = no signal) and TPR at each low FPR; a TPR at FPR alpha needs at
    least 1/alpha non-members, otherwise that entry says it is unavailable.
    """
    from sklearn.metrics import roc_auc_score, roc_curve

    if len(synthetic) == 0:
        raise MetricUnavailable("membership inference needs synthetic records, got none")
    if len(members) < 2 or len(non_members) < 2:
        raise MetricUnavailable(
            f"membership inference needs at least 2 members and 2 non-members, got "
            f"{len(members)} and {len(non_members)}"
        )
    scores = np.concatenate([max_similarity(members, synthetic),
                             max_similarity(non_members, synthetic)])
    truth = np.concatenate([np.ones(len(members)), np.zeros(len(non_members))])
    fpr, tpr, _ = roc_curve(truth, scores)
    at: dict[str, Any] = {}
    for alpha in fprs:
        need = math.ceil(1.0 / alpha)
        if len(non_members) < need:
            at[f"{alpha:g}"] = {
                "unavailable": f"TPR at FPR {alpha:g} needs >= {need} non-members, "
                f"got {len(non_members)}"
            }
        else:
            at[f"{alpha:g}"] = tpr_at_fpr(fpr, tpr, alpha)
    return {
        "auc": float(roc_auc_score(truth, scores)),
        "tpr_at_fpr": at,
        "n_members": len(members),
        "n_non_members": len(non_members),
        "score": "max cosine similarity to the synthetic set",
    }


# -- PII leakage ----------------------------------------------------------------------------

#: Presidio entity -> the kind reported by :func:`pii_leakage`.
PII_ENTITIES = {"EMAIL_ADDRESS": "email", "PHONE_NUMBER": "phone", "PERSON": "name"}
_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_WORDS = re.compile(r"\w+", re.UNICODE)
#: Titles Presidio keeps inside a PERSON span ("Dr Smith"); dropped before comparing names.
_TITLES = frozenset({"mr", "mrs", "ms", "miss", "dr", "prof", "doctor", "sir", "madam"})


def normalise_phone(raw: str) -> str | None:
    """Last 10 digits of a phone number (extension and country code dropped), or None."""
    core = re.split(r"\s*(?:x|ext\.?)\s*", raw.strip(), maxsplit=1)[0]
    if _ISO_DATE.match(core):
        return None
    digits = re.sub(r"\D", "", core)
    if not 7 <= len(digits) <= 15:
        return None
    # compare subscriber numbers: "+1 415 555 0199" and "(415) 555-0199" are the same phone
    return digits[-10:]


def normalise_name(value: str) -> str:
    """Lower-cased word tokens of a name, leading titles dropped ("Dr. Jon Sutter" ->
    "jon sutter"); empty when the span holds a digit (not a name)."""
    words = [w.lower() for w in _WORDS.findall(value)]
    if any(ch.isdigit() for w in words for ch in w):
        return ""
    while words and words[0] in _TITLES:
        words.pop(0)
    return " ".join(words)


def _normalise(kind: str, span: str) -> str | None:
    if kind == "phone":
        return normalise_phone(span)
    if kind == "email":
        return span.strip().lower() or None
    name = normalise_name(span)
    return name if len(name.split()) >= 2 else None  # full names: a lone first name is noise


def find_pii(texts: Sequence[str], score_threshold: float = 0.3,
             batch_size: int = 64) -> list[dict[str, set[str]]]:
    """Per text, the normalised e-mails, phones and person names Presidio's analyzer finds
    (the offline spaCy model for names, phonenumbers for phones)."""
    from presidio_analyzer import BatchAnalyzerEngine

    from ..secrets import presidio_analyzer

    texts = [str(t) for t in texts]
    if not texts:
        return []
    batch = BatchAnalyzerEngine(analyzer_engine=presidio_analyzer())
    results = batch.analyze_iterator(texts, language="en", batch_size=batch_size,
                                     entities=list(PII_ENTITIES),
                                     score_threshold=score_threshold)
    out: list[dict[str, set[str]]] = []
    for text, found in zip(texts, results, strict=True):
        row: dict[str, set[str]] = {kind: set() for kind in PII_ENTITIES.values()}
        for res in found:
            kind = PII_ENTITIES[res.entity_type]
            value = _normalise(kind, text[res.start : res.end])
            if value:
                row[kind].add(value)
        out.append(row)
    return out


def find_phones(text: str) -> set[str]:
    """Normalised phone numbers in one text (Presidio's phone recognizer)."""
    return find_pii([text])[0]["phone"]


def _ngrams(text: str, max_n: int) -> set[str]:
    words = [w.lower() for w in _WORDS.findall(text)]
    out: set[str] = set()
    for n in range(1, max_n + 1):
        for i in range(len(words) - n + 1):
            out.add(" ".join(words[i : i + n]))
    return out


def pii_leakage(
    outputs: Sequence[str],
    private_texts: Sequence[str],
    private_values: Mapping[str, Iterable[str]] | None = None,
    min_name_chars: int = 4,
) -> dict[str, Any]:
    """PII in the output that also occurs in the private data (counts only, no strings).

    Detection is Presidio's analyzer (:func:`find_pii`): e-mails, phone numbers and full
    person names, in the output and in the private texts. ``private_values`` (column name ->
    values) adds the private PII columns: a column whose name mentions mail/phone/tel/mobile
    is read as e-mails/phones, anything else as names, and a name value is also searched for
    verbatim (as a word sequence) in the output. When name columns are given they alone
    define the private names (NER on free text is noisier than a column).
    Returns, per kind, the number of distinct values detected in the output, how many of them
    occur in the private data (``leaked``) and how many output records hold one.
    """
    kinds = ("email", "phone", "name")
    private: dict[str, set[str]] = {k: set() for k in kinds}
    for row in find_pii(private_texts):
        for kind in kinds:
            private[kind] |= row[kind]
    column_names: set[str] = set()
    for column, values in (private_values or {}).items():
        lower = column.lower()
        for value in values:
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue
            value = str(value)
            if "mail" in lower:
                if value.strip():
                    private["email"].add(value.strip().lower())
            elif "phone" in lower or "tel" in lower or "mobile" in lower:
                digits = normalise_phone(value)
                if digits:
                    private["phone"].add(digits)
            else:
                norm = normalise_name(value)
                if len(norm) >= min_name_chars:
                    column_names.add(norm)
    private["name"] = column_names or {n for n in private["name"] if len(n) >= min_name_chars}
    max_n = max((len(n.split()) for n in column_names), default=1)

    detected: dict[str, set[str]] = {k: set() for k in kinds}
    leaked: dict[str, set[str]] = {k: set() for k in kinds}
    records: dict[str, int] = dict.fromkeys(kinds, 0)
    any_leak = 0
    for text, found in zip(outputs, find_pii(outputs), strict=True):
        if column_names:
            found["name"] |= _ngrams(text, max_n) & column_names
        hit_any = False
        for kind in kinds:
            detected[kind] |= found[kind]
            hits = found[kind] & private[kind]
            if hits:
                leaked[kind] |= hits
                records[kind] += 1
                hit_any = True
        any_leak += hit_any
    result: dict[str, Any] = {
        kind: {
            "detected": len(detected[kind]),
            "leaked": len(leaked[kind]),
            "records_with_leak": records[kind],
        }
        for kind in kinds
    }
    result.update(
        n_outputs=len(outputs),
        records_with_any_leak=any_leak,
        leak_rate=any_leak / len(outputs) if outputs else 0.0,
        private_values_checked={k: len(v) for k, v in private.items()},
        detector="presidio-analyzer (spaCy en_core_web_sm, phonenumbers)",
    )
    return result


# -- canaries -------------------------------------------------------------------------------

DEFAULT_CANARY = "the vault access code of Orla Quennell is 7341-ZEBRA-0926"


def insert_canaries(
    texts: Sequence[str], canary: str, copies: int, seed: int = 0
) -> tuple[list[str], list[int]]:
    """Append ``canary`` to ``copies`` distinct records chosen at random (sorted indices)."""
    if not canary.strip():
        raise ValueError("insert_canaries: the canary string is empty")
    if copies < 1:
        raise ValueError(f"insert_canaries: copies must be >= 1, got {copies}")
    if copies > len(texts):
        raise ValueError(
            f"insert_canaries: copies={copies} exceeds the number of records ({len(texts)})"
        )
    rng = np.random.default_rng(seed)
    indices = sorted(int(i) for i in rng.choice(len(texts), size=copies, replace=False))
    out = list(texts)
    for i in indices:
        base = str(out[i]).rstrip()
        sep = "" if not base else (" " if base[-1] in ".!?" else ". ")
        out[i] = f"{base}{sep}{canary}"
    return out, indices


def _norm_tokens(text: str) -> list[str]:
    return [w.lower() for w in _WORDS.findall(text)]


def canary_similarity(output: str, canary: str) -> float:
    """Best normalised edit similarity between the canary and a same-sized token window.

    Both sides are lower-cased word tokens joined by single spaces; windows of the canary's
    length +-1 tokens are compared when they share at least half of its tokens; similarity is
    1 - Levenshtein distance / longer length (rapidfuzz).
    """
    from ..errors import require

    levenshtein = require("rapidfuzz.distance", "eval", "the canary audit's edit distance "
                          "(rapidfuzz)").Levenshtein
    c_tok = _norm_tokens(canary)
    o_tok = _norm_tokens(output)
    if not c_tok or not o_tok:
        return 0.0
    c_str = " ".join(c_tok)
    c_count = Counter(c_tok)
    best = 0.0
    for size in {max(1, len(c_tok) - 1), len(c_tok), len(c_tok) + 1}:
        for i in range(max(1, len(o_tok) - size + 1)):
            window = o_tok[i : i + size]
            overlap = sum((Counter(window) & c_count).values()) / len(c_tok)
            if overlap < 0.5:
                continue
            best = max(best, levenshtein.normalized_similarity(" ".join(window), c_str))
    return best


def count_canary_hits(
    outputs: Iterable[str], canary: str, threshold: float = 0.8
) -> dict[str, Any]:
    """Outputs holding the canary exactly, and (separately) nearly.

    exact: the canary's word tokens appear contiguously in the output (case, punctuation and
    spacing ignored). near: not exact, but :func:`canary_similarity` >= ``threshold``.
    """
    c_str = " ".join(_norm_tokens(canary))
    if not c_str:
        raise ValueError("count_canary_hits: the canary has no word characters")
    exact = near = n = 0
    best = 0.0
    for output in outputs:
        n += 1
        o_str = " " + " ".join(_norm_tokens(output)) + " "
        if f" {c_str} " in o_str:
            exact += 1
            best = 1.0
            continue
        sim = canary_similarity(output, canary)
        best = max(best, sim)
        if sim >= threshold:
            near += 1
    return {"exact": exact, "near": near, "outputs": n, "threshold": threshold,
            "best_similarity": best}
