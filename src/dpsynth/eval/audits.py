"""Empirical privacy audits (reported apart from the formal guarantee).

An audit can show leakage; it cannot prove its absence. Every function here returns numbers
(counts, rates, distances, p-values), never the private strings it matched, so that its output
may go into a report.

- :func:`dcr_audit`: distance to closest record, synthetic->private against synthetic->holdout.
- :func:`membership_inference`: a distance-based attack; score = max similarity of a candidate
  record to the synthetic set; members = private records, non-members = holdout records.
- :func:`pii_leakage`: e-mails, phone numbers and names in the output that occur in the
  private data.
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


def max_similarity(queries: np.ndarray, refs: np.ndarray, chunk: int = 2048) -> np.ndarray:
    """Cosine similarity of each query row to its nearest row of ``refs``."""
    q, r = _unit(queries), _unit(refs)
    if len(r) == 0:
        raise MetricUnavailable("no reference records to compare with")
    out = np.empty(len(q), dtype=np.float64)
    for start in range(0, len(q), chunk):
        out[start : start + chunk] = (q[start : start + chunk] @ r.T).max(axis=1)
    return out


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

EMAIL_RE = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
PHONE_RE = re.compile(
    r"(?<![\w])\+?\(?\d{1,4}\)?(?:[ .\-]?\(?\d{2,5}\)?){2,5}(?:\s*(?:x|ext\.?)\s*\d{1,5})?"
)
_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_CAP_RUN = re.compile(r"\b([A-Z][a-z]+(?:[ '\-][A-Z][a-z]+)+)\b")
_WORDS = re.compile(r"\w+", re.UNICODE)


def normalise_phone(raw: str) -> str | None:
    """Last 10 digits of a phone-like match (extension and country code dropped), or None."""
    core = re.split(r"\s*(?:x|ext\.?)\s*", raw.strip(), maxsplit=1)[0]
    if _ISO_DATE.match(core):
        return None
    digits = re.sub(r"\D", "", core)
    if not 7 <= len(digits) <= 15:
        return None
    # compare subscriber numbers: "+1 415 555 0199" and "(415) 555-0199" are the same phone
    return digits[-10:]


def find_emails(text: str) -> set[str]:
    return {m.lower() for m in EMAIL_RE.findall(text)}


def find_phones(text: str) -> set[str]:
    out = set()
    for match in PHONE_RE.finditer(text):
        digits = normalise_phone(match.group(0))
        if digits:
            out.add(digits)
    return out


_NOT_NAME_START = frozenset({
    "hello", "hi", "hey", "dear", "my", "the", "a", "an", "this", "that", "please", "thanks",
    "thank", "i", "we", "our", "your", "good", "best", "regards", "sincerely", "mr", "mrs", "ms",
    "miss", "dr", "doctor", "prof", "yours", "kind", "warm", "call", "contact", "ask", "tell",
    "email", "text", "from", "to", "for", "with", "and", "by", "patient", "name", "is",
})


def find_name_candidates(text: str) -> set[str]:
    """Runs of two or three capitalised words (a cheap stand-in for an NER 'PERSON').

    Leading greetings, articles and titles are dropped ("Hello Dr" is not a name); what is
    left must still be two words or more.
    """
    out = set()
    for match in _CAP_RUN.findall(text):
        words = match.lower().replace("-", " ").replace("'", " ").split()
        while words and words[0] in _NOT_NAME_START:
            words.pop(0)
        if 2 <= len(words) <= 3:
            out.add(" ".join(words))
        elif len(words) > 3:  # a long run: its word pairs and triples
            for n in (2, 3):
                out.update(" ".join(words[i : i + n]) for i in range(len(words) - n + 1))
    return out


def _ngrams(text: str, max_n: int) -> set[str]:
    words = [w.lower() for w in _WORDS.findall(text)]
    out: set[str] = set()
    for n in range(1, max_n + 1):
        for i in range(len(words) - n + 1):
            out.add(" ".join(words[i : i + n]))
    return out


def _norm_name(value: str) -> str:
    return " ".join(w.lower() for w in _WORDS.findall(value))


def pii_leakage(
    outputs: Sequence[str],
    private_texts: Sequence[str],
    private_values: Mapping[str, Iterable[str]] | None = None,
    min_name_chars: int = 4,
) -> dict[str, Any]:
    """PII in the output that also occurs in the private data (counts only, no strings).

    Detected in the output: e-mails and phone numbers by regex, names as capitalised word runs
    plus any value of the private PII columns. Private PII = the same detectors run on the
    private texts, plus the values of ``private_values`` (column name -> values; a column whose
    name mentions mail/phone/tel is read as e-mails/phones, anything else as names). When name
    columns are given, they alone define the private names (the heuristic is noisy).
    Returns, per kind, the number of distinct values detected in the output, how many of them
    occur in the private data (``leaked``) and how many output records hold one.
    """
    priv_email: set[str] = set()
    priv_phone: set[str] = set()
    priv_name: set[str] = set()
    for text in private_texts:
        priv_email |= find_emails(text)
        priv_phone |= find_phones(text)
        priv_name |= find_name_candidates(text)
    column_names: set[str] = set()
    for column, values in (private_values or {}).items():
        lower = column.lower()
        for value in values:
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue
            value = str(value)
            if "mail" in lower:
                priv_email |= find_emails(value) or {value.strip().lower()}
            elif "phone" in lower or "tel" in lower or "mobile" in lower:
                digits = normalise_phone(value)
                if digits:
                    priv_phone.add(digits)
            else:
                norm = _norm_name(value)
                if len(norm) >= min_name_chars:
                    column_names.add(norm)
    # name columns are exact; with them the capitalised-run heuristic would only add noise
    priv_name = column_names or {n for n in priv_name if len(n) >= min_name_chars}
    max_n = max((len(n.split()) for n in column_names), default=1)

    kinds = ("email", "phone", "name")
    detected: dict[str, set[str]] = {k: set() for k in kinds}
    leaked: dict[str, set[str]] = {k: set() for k in kinds}
    records: dict[str, int] = dict.fromkeys(kinds, 0)
    any_leak = 0
    for text in outputs:
        found = {
            "email": find_emails(text),
            "phone": find_phones(text),
            "name": find_name_candidates(text) | (_ngrams(text, max_n) & column_names),
        }
        hit_any = False
        for kind, private_set in (("email", priv_email), ("phone", priv_phone),
                                  ("name", priv_name)):
            detected[kind] |= found[kind]
            hits = found[kind] & private_set
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
        private_values_checked={k: len(v) for k, v in
                                (("email", priv_email), ("phone", priv_phone),
                                 ("name", priv_name))},
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


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions), O(len(a) * len(b))."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def canary_similarity(output: str, canary: str) -> float:
    """Best normalised edit similarity between the canary and a same-sized token window.

    Both sides are lower-cased word tokens joined by single spaces; windows of the canary's
    length +-1 tokens are compared when they share at least half of its tokens.
    """
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
            w_str = " ".join(window)
            sim = 1.0 - levenshtein(w_str, c_str) / max(len(w_str), len(c_str))
            best = max(best, sim)
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
