"""The evaluation of one run: fidelity, utility and audits, written as JSON beside the run.

``evaluate_run`` is the orchestration; the metrics are the pure functions of
:mod:`.fidelity`, :mod:`.utility` and :mod:`.audits`, and :mod:`.view` turns the utility
block into the user's table (synthetic vs zero-shot vs real-trained vs chance) and verdict.

The real-data reference (a classifier trained on the private data) and the audits read the
private data named by the run config. That is the evaluator's own use of the private data,
outside the release: those numbers are not covered by the run's DP guarantee, so they are
written to the operator's ``private/`` area only (docs/methods.md §5, §6):

* ``RUN_DIR/eval/eval.json``: shareable (release/ and the public test data only);
* ``RUN_DIR/private/eval/reference.json`` (0600): the real-trained reference;
* ``RUN_DIR/private/eval/audit.json`` (0600): the empirical privacy audits.

A metric that cannot be computed is ``{"unavailable": "reason"}`` instead of a number.

eval.json::

    {run_id, run_dir, method, epsilon, delta, test_file, text_column, label_columns, embedder,
     n: {synthetic, zero_shot, test},   (nothing time-like: no creation time, no duration)
     fidelity: {synthetic | zero_shot: {n, n_real, fid, fid_note?, precision, recall, knn_k,
                mauve, length: {synthetic, real, bin_edges, *_hist, tv, ks},
                labels: {COLUMN: {synthetic, real, tv}}},
               per_iteration: [{iteration, n, fid}]},   (from release/iterations/)
     utility: {logreg | finetune: {COLUMN: {chance, chance_macro_f1, synthetic | zero_shot:
               {accuracy, macro_f1, n_train, n_test, ...}, synthetic_vs_zero_shot: {n, both,
               synthetic_only, zero_shot_only, neither}}}}     (labeled corpora)
              {next_token: {synthetic | zero_shot: {accuracy, ...}}}  (unlabeled)
     versus_zero_shot: {logreg | finetune: {COLUMN: {accuracy_points, macro_f1_points,
                        beats_zero_shot, interval_points: [low, high], interval, measurable}}},
     verdict: "The synthetic data beat the zero-shot reference: ...",   (one line, worded
              from the 95 % interval of the accuracy difference)
     references, notes}

reference.json::

    {run_id, n_private, utility: {logreg | finetune: {COLUMN: {private: {...}}}}, note}

audit.json::

    {run_id, method, holdout, holdout_overlap_removed, dcr: {...}, membership_inference:
     {auc, tpr_at_fpr: {"0.01", "0.1"}, ...}, pii: {email | phone | name: {detected, leaked,
     records_with_leak}, ...}, pii_columns, zero_shot_control: {dcr, membership_inference},
     note}
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..embed.protocols import TextEmbedder
from ..files import SHARED_MODE, atomic_write_json, read_jsonl
from ..progress import bar
from . import audits as au
from . import fidelity as fi
from . import utility as ut
from .common import EvalInputError, guarded, unavailable
from .release import LabeledTexts, load_private_data, load_run, load_test_data, run_label_domain
from .view import NOT_GIVEN, OPERATOR_ROWS, PAIRED_KEY, verdict, versus_zero_shot

Classifier = Literal["logreg", "finetune", "both"]

PRIVATE_USE_NOTE = (
    "The 'private' reference and the audits were computed by the evaluator on the private data "
    "named in the run config, outside the release; they are not covered by the DP guarantee "
    "and should not be published with the synthetic data."
)
AUDIT_NOTE = (
    "Empirical audits can show leakage; they cannot prove its absence. The formal guarantee is "
    "the one in release/privacy.json."
)


def per_iteration_fid(run_root: Path, embedder: Any, test_emb: np.ndarray,
                      progress: bool = False) -> list[dict[str, Any]]:
    """FID of each iteration's pool (release/iterations/iterT.jsonl) against the test data
    (``progress``: each pool embedded under a bar)."""
    folder = Path(run_root) / "release" / "iterations"
    rows = []
    for path in sorted(folder.glob("iter*.jsonl"), key=lambda p: int(p.stem[4:] or 0)):
        texts = [str(r.get("text", "")) for r in read_jsonl(path)]
        label = f"iteration {path.stem[4:]}" if progress else None
        value = guarded(lambda t=texts, n=label: fi.fid(_embed(embedder, t, n), test_emb))
        rows.append({"iteration": int(path.stem[4:]), "n": len(texts), "fid": value})
    return rows


def fidelity_block(
    syn_emb: np.ndarray,
    real_emb: np.ndarray,
    syn: LabeledTexts,
    real: LabeledTexts,
    k: int = 3,
    mauve_buckets: int | None = None,
    with_mauve: bool = True,
) -> dict[str, Any]:
    """FID, kNN precision/recall, MAUVE, length and label distributions of one set vs real."""
    out: dict[str, Any] = {"n": len(syn), "n_real": len(real)}
    out["fid"] = guarded(fi.fid, syn_emb, real_emb)
    if len(syn) < syn_emb.shape[1] and len(syn) >= 2:
        out["fid_note"] = (
            f"{len(syn)} samples < {syn_emb.shape[1]} dimensions: the covariance is rank "
            "deficient and FID is biased upward; compare FIDs only at equal sample sizes"
        )
    pr = guarded(fi.knn_precision_recall, real_emb, syn_emb, k=k)
    if isinstance(pr, dict) and "unavailable" in pr:
        out["precision"] = out["recall"] = pr
    else:
        out["precision"], out["recall"] = pr["precision"], pr["recall"]
    out["knn_k"] = k
    out["mauve"] = (
        guarded(fi.mauve_score, syn_emb, real_emb, num_buckets=mauve_buckets)
        if with_mauve else unavailable("skipped (--no-mauve)")
    )
    out["length"] = guarded(fi.length_comparison, syn.texts, real.texts)
    out["labels"] = {
        col: guarded(fi.label_comparison, syn.labels.get(col, []), real.labels[col])
        for col in real.labels
    }
    return out


def utility_block(
    train_sets: dict[str, tuple[np.ndarray, LabeledTexts] | str | None],
    test_emb: np.ndarray,
    test: LabeledTexts,
    classifier: Classifier = "logreg",
    finetune_epochs: int = 3,
    finetune_max_train: int | None = 2000,
    seed: int = 0,
    progress: bool = False,
) -> dict[str, Any]:
    """Per label column: each training set's accuracy and macro-F1 on the real test data.

    ``train_sets`` maps a name ("synthetic", "private", "zero_shot") to its embeddings and
    texts, or to the reason it is unavailable (None: "no NAME data"). Each row also holds the
    chance line (:func:`.utility.majority_scores`): ``chance`` (accuracy) and
    ``chance_macro_f1``. Without label columns, next-token accuracy. ``progress``: a bar per
    fine-tuning (:func:`_finetune`).
    """
    out: dict[str, Any] = {}
    names = list(train_sets)
    if not test.labels:
        out["next_token"] = {
            name: (
                guarded(ut.next_token_accuracy, data[1].texts, test.texts)
                if isinstance(data, tuple) else _missing(name, data)
            )
            for name, data in train_sets.items()
        }
        return out
    kinds = ["logreg", "finetune"] if classifier == "both" else [classifier]
    for kind in kinds:
        per_col: dict[str, Any] = {}
        for col, test_y in test.labels.items():
            chance = ut.majority_scores(test_y)
            row: dict[str, Any] = {"chance": chance["accuracy"],
                                   "chance_macro_f1": chance["macro_f1"]}
            predictions: dict[str, list[str]] = {}
            for name in names:
                data = train_sets[name]
                if not isinstance(data, tuple):
                    row[name] = _missing(name, data)
                    continue
                emb, texts = data
                train_y = texts.labels.get(col)
                if train_y is None:
                    row[name] = unavailable(f"the {name} data has no label {col!r}")
                elif kind == "logreg":
                    row[name] = guarded(ut.logreg_scores, emb, train_y, test_emb, test_y,
                                        seed=seed, keep_predictions=True)
                else:
                    row[name] = _finetune(texts.texts, train_y, test, test_y, finetune_epochs,
                                          finetune_max_train, seed, progress and (col, name))
                if isinstance(row[name], dict) and "predictions" in row[name]:
                    predictions[name] = row[name].pop("predictions")
            if "synthetic" in predictions and "zero_shot" in predictions:
                row[PAIRED_KEY] = paired_block(test_y, predictions["synthetic"],
                                               predictions["zero_shot"])
            per_col[col] = row
        out[kind] = per_col
    return out


def _finetune(texts: list[str], train_y: list[str], test: LabeledTexts, test_y: list[str],
              epochs: int, max_train: int | None, seed: int,
              shown: tuple[str, str] | bool) -> dict[str, Any]:
    """The fine-tuned classifier's cell (on at most ``max_train`` texts); ``shown``: (label
    column, training set's name) for a bar counting its texts over the epochs."""
    tx, ty = _cap(texts, train_y, max_train, seed)
    label = (f"fine-tuning the {shown[0]} classifier on {shown[1]}"
             if isinstance(shown, tuple) else None)
    return guarded(ut.finetune_scores, tx, ty, test.texts, test_y, epochs=epochs, seed=seed,
                   keep_predictions=True, progress_label=label)


def paired_block(test_y: list[str], synthetic: list[str], zero_shot: list[str]
                 ) -> dict[str, int]:
    """Counts of test examples both classifiers got right, only one, or neither (shareable:
    both are trained on released sets and scored on the public test set)."""
    counts = ut.paired_counts(test_y, synthetic, zero_shot)
    return {"n": counts["n"], "both": counts["both"], "synthetic_only": counts["first_only"],
            "zero_shot_only": counts["second_only"], "neither": counts["neither"]}


def _missing(name: str, reason: str | None) -> dict[str, str]:
    return unavailable(reason or f"no {name} data")


def _seeded_draw(n: int, size: int, seed: int) -> np.ndarray:
    """``size`` of ``range(n)`` drawn without replacement by ``seed``, in order."""
    return np.sort(np.random.default_rng(seed).choice(n, size, replace=False))


def _cap(texts: list[str], y: list[str], cap: int | None, seed: int
         ) -> tuple[list[str], list[str]]:
    if cap is None or len(texts) <= cap:
        return texts, y
    idx = _seeded_draw(len(texts), cap, seed)
    return [texts[i] for i in idx], [y[i] for i in idx]


def at_release_size(emb: np.ndarray, data: LabeledTexts, size: int, seed: int
                    ) -> tuple[np.ndarray, LabeledTexts] | str:
    """A seeded draw of ``size`` private records (embeddings and texts): the real-trained
    reference at the synthetic set's size (the most a release of that size is likely to
    give); the reason there is none where the private data is no larger."""
    if len(data) <= size:
        return (f"the private data has no more records than the synthetic set's {size}: "
                "see the real-trained row")
    idx = _seeded_draw(len(data), size, seed)
    return emb[idx], LabeledTexts([data.texts[i] for i in idx],
                                  {c: [v[i] for i in idx] for c, v in data.labels.items()})


def audit_block(
    syn_emb: np.ndarray,
    syn: LabeledTexts,
    priv_emb: np.ndarray,
    priv: LabeledTexts,
    hold_emb: np.ndarray,
    pii_values: dict[str, list[str]],
    seed: int = 0,
    advance: Callable[..., None] | None = None,
) -> dict[str, Any]:
    """DCR, membership inference and PII leakage (numbers only); ``advance()`` after each of
    the three (a bar of :data:`AUDITS_BAR`)."""
    done = advance or _not_shown
    dcr = guarded(au.dcr_audit, syn_emb, priv_emb, hold_emb, seed=seed)
    done()
    mia = guarded(au.membership_inference, syn_emb, priv_emb, hold_emb)
    done()
    pii = au.pii_leakage(syn.texts, priv.texts, pii_values)
    done()
    return {"dcr": dcr, "membership_inference": mia, "pii": pii,
            "pii_columns": sorted(pii_values)}


#: the label of the bar that counts the audits of :func:`audit_block`
AUDITS_BAR = "audits (DCR, membership inference, PII)"


def _not_shown(n: int = 1) -> None:
    """The ``advance`` of audits without a bar."""


#: texts per call of the embedder when the evaluation shows a bar (its unit of progress)
EMBED_CHUNK = 256


def _embed(embedder: Any, texts: list[str], label: str | None = None) -> np.ndarray:
    """The texts' embeddings; with ``label`` (a set's name, never a text) under a bar
    ``embedding LABEL (texts)``, :data:`EMBED_CHUNK` texts a call."""
    if not texts:
        dim = embedder.dim if isinstance(embedder, TextEmbedder) else 384
        return np.zeros((0, int(dim)), dtype=np.float32)
    if label is None:
        return np.asarray(embedder.embed(texts), dtype=np.float32)
    parts = []
    with bar(f"embedding {label} (texts)", len(texts)) as advance:
        for start in range(0, len(texts), EMBED_CHUNK):
            chunk = texts[start : start + EMBED_CHUNK]
            parts.append(np.asarray(embedder.embed(chunk), dtype=np.float32))
            advance(len(chunk))
    return np.concatenate(parts)


@dataclass(frozen=True)
class EvalOptions:
    """What ``dpsynth eval`` computes (its options): ``text`` / ``labels``, the columns
    (default: the run config's data section); ``classifier`` (logreg, finetune or both) and
    its ``finetune_epochs``; ``k`` of the kNN precision / recall; ``with_mauve`` and
    ``with_audits``; ``pii_columns`` of the private file whose values the PII audit looks for;
    ``zero_shot_run``, a zero-shot run folder as the reference (wins over the run's own
    release/zero_shot.jsonl); ``seed`` of the classifiers and audits; ``test_name``, what
    eval.json calls the test data (default its path; the Python API names a DataFrame it
    wrote to a temporary file)."""

    text: str | None = None
    labels: list[str] | None = None
    classifier: Classifier = "logreg"
    k: int = 3
    finetune_epochs: int = 3
    with_mauve: bool = True
    with_audits: bool = True
    pii_columns: list[str] | None = None
    zero_shot_run: str | Path | None = None
    seed: int = 0
    test_name: str | None = None


def evaluate_run(
    run_dir: str | Path,
    test_path: str | Path | None = None,
    options: EvalOptions | None = None,
    *,
    embedder: Any = None,
    write: bool = True,
    log: Callable[[str], None] | None = None,
    progress: bool | None = None,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Evaluate a run folder against a real test file; returns (eval, audit) dicts.

    ``options``: what to compute (:class:`EvalOptions`); ``embedder``: a ready embedder (default
    the run config's); ``write``: write the results into the run folder; ``log``: progress
    notes. The returned eval dict is the operator's view; ``eval/eval.json`` gets its
    shareable part and ``private/eval/reference.json`` (mode 0600) the real-trained reference
    (:func:`split_private`); ``private/eval/audit.json`` the audits when the private data is
    reachable and audits are on. ``progress``: bars for the embedding (texts) and the
    fine-tuning (texts x epochs), names and counts only (None: when ``log`` is given).
    """
    o = options or EvalOptions()
    text, labels, classifier, k, seed = o.text, o.labels, o.classifier, o.k, o.seed
    with_mauve, with_audits, pii_columns = o.with_mauve, o.with_audits, o.pii_columns
    say = log or (lambda _msg: None)
    show = log is not None if progress is None else progress
    if classifier not in ("logreg", "finetune", "both"):
        raise EvalInputError(
            f"classifier must be logreg, finetune or both, got {classifier!r}"
        )
    release = load_run(run_dir)
    data_cfg = release.data_config
    text_col = text or str(data_cfg.get("text") or "text")
    label_cols = list(labels) if labels is not None else release.label_columns
    missing = [c for c in label_cols if c not in release.synthetic.labels]
    if missing:
        raise EvalInputError(
            f"label column(s) {', '.join(map(repr, missing))} not in the synthetic data "
            f"(synthetic labels: {', '.join(release.synthetic.labels) or 'none'})"
        )
    notes: list[str] = []
    if release.meta.get("status") != "finished":
        notes.append(f"run status is {release.meta.get('status')!r}, not 'finished'")

    say("loading the private data named in the run config (evaluator's own use)")
    private = load_private_data(release, label_cols, pii_columns)
    if private is None:
        notes.append(
            "private data not reachable from the run config: the real-data reference and the "
            "audits are skipped"
        )
    if test_path is None:
        if private is not None and private.demo_test is not None:
            test_path = private.demo_test
            notes.append("test data: the built-in demo corpus's test split")
        else:
            raise EvalInputError("give the real test data with --test FILE")
    test, test_notes = load_test_data(test_path, text_col, label_cols, release.synthetic,
                                      run_label_domain(release, label_cols))
    notes += test_notes
    zero_shot, zs_source = release.zero_shot, "release/zero_shot.jsonl"
    if o.zero_shot_run is not None:
        zero_shot, zs_source = load_zero_shot_run(o.zero_shot_run), str(o.zero_shot_run)
        notes.append(f"zero-shot reference: {zs_source}")
    if zero_shot is not None and len(zero_shot) != len(release.synthetic):
        notes.append(f"the zero-shot reference has {len(zero_shot)} samples, the synthetic "
                     f"data {len(release.synthetic)}: compare at equal sizes")
    zs_missing = (f"{NOT_GIVEN}: the run has no release/zero_shot.jsonl; pass a zero-shot run "
                  "folder with --zero-shot RUN_DIR")

    if embedder is None:
        from ..embed import Embedder

        emb_cfg = release.config.get("embedder") or {}
        embedder = Embedder(str(emb_cfg.get("model", "minilm")))
    say(f"embedding {len(release.synthetic)} synthetic and {len(test)} test texts")
    named = (lambda name: name) if show else (lambda name: None)
    syn_emb = _embed(embedder, release.synthetic.texts, named("synthetic"))
    test_emb = _embed(embedder, test.texts, named("test"))
    zs_emb = (_embed(embedder, zero_shot.texts, named("zero-shot"))
              if zero_shot is not None else None)
    priv_emb = _embed(embedder, private.data.texts, named("private")) if private else None

    say("fidelity")
    fidelity = {
        "synthetic": fidelity_block(syn_emb, test_emb, release.synthetic, test, k=k,
                                    with_mauve=with_mauve),
        "zero_shot": (
            fidelity_block(zs_emb, test_emb, zero_shot, test, k=k, with_mauve=with_mauve)
            if zero_shot is not None and zs_emb is not None
            else unavailable(zs_missing)
        ),
    }
    fidelity["per_iteration"] = per_iteration_fid(release.root, embedder, test_emb, show)
    say(f"utility ({classifier})")
    train_sets: dict[str, tuple[np.ndarray, LabeledTexts] | str | None] = {
        "synthetic": (syn_emb, release.synthetic),
        "private": (priv_emb, private.data) if private and priv_emb is not None else None,
        "private_at_size": (at_release_size(priv_emb, private.data, len(release.synthetic),
                                            seed)
                            if private and priv_emb is not None else None),
        "zero_shot": (zs_emb, zero_shot)
        if zero_shot is not None and zs_emb is not None else zs_missing,
    }
    utility = utility_block(train_sets, test_emb, test, classifier=classifier,
                            finetune_epochs=o.finetune_epochs, seed=seed, progress=show)

    privacy = release.privacy or {}
    result: dict[str, Any] = {
        "run_id": release.run_id,
        "run_dir": str(release.root),
        "method": release.method,
        "epsilon": privacy.get("epsilon"),
        "delta": privacy.get("delta"),
        "test_file": o.test_name or str(test_path),
        "text_column": text_col,
        "label_columns": label_cols,
        "embedder": str(embedder.name if isinstance(embedder, TextEmbedder)
                        else type(embedder).__name__),
        "n": {
            "synthetic": len(release.synthetic),
            "zero_shot": len(zero_shot) if zero_shot is not None else 0,
            "private": len(private.data) if private else None,
            "test": len(test),
        },
        "fidelity": fidelity,
        "utility": utility,
        "references": {
            "private": "same model trained on the real private data (evaluator's own use)",
            "zero_shot": f"same model trained on {zs_source} (no private data, epsilon 0)",
            "chance": "always predicting the test split's most frequent label (accuracy = its "
            "share; macro-F1 = its F1 / number of test classes)",
        },
        "notes": [*notes, PRIVATE_USE_NOTE] if private else notes,
    }
    result["versus_zero_shot"] = versus_zero_shot(utility)
    result["verdict"] = verdict(result["versus_zero_shot"])

    audit: dict[str, Any] | None = None
    if with_audits and private is not None and priv_emb is not None:
        say("audits")
        # the holdout must be records the generator never saw: drop test texts that are
        # also private records
        private_set = set(private.data.texts)
        keep = [i for i, t in enumerate(test.texts) if t not in private_set]
        overlap = len(test) - len(keep)
        audit = {
            "run_id": release.run_id,
            "method": release.method,
            "holdout": f"{o.test_name or test_path} (real records not used by the run)",
            "holdout_overlap_removed": overlap,
            **audit_block(syn_emb, release.synthetic, priv_emb, private.data,
                          test_emb[keep], private.pii_values, seed=seed),
            "note": AUDIT_NOTE,
        }
        if zero_shot is not None and zs_emb is not None:
            # control: the zero-shot set saw no private data, so its audit is the null level
            audit["zero_shot_control"] = {
                "dcr": guarded(au.dcr_audit, zs_emb, priv_emb, test_emb[keep], seed=seed),
                "membership_inference": guarded(au.membership_inference, zs_emb, priv_emb,
                                                 test_emb[keep]),
            }
    elif with_audits:
        audit = None

    if write:
        shareable, reference = split_private(result)
        release.eval_dir.mkdir(exist_ok=True)
        atomic_write_json(release.eval_dir / "eval.json", shareable, mode=SHARED_MODE)
        if reference is not None:
            release.audit_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            atomic_write_json(release.audit_dir / REFERENCE_FILE, reference, mode=0o600)
        if audit is not None:
            release.audit_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            atomic_write_json(release.audit_dir / "audit.json", audit, mode=0o600)
    if private is not None:
        private.close()
    return result, audit


REFERENCE_FILE = "reference.json"


def split_private(result: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(shareable part, private part) of an eval result (docs/methods.md §5, §6).

    The private part holds what was computed on the private data: the real-trained
    utility cells (:data:`.view.OPERATOR_ROWS`: on all the private records and on as many as
    the synthetic set has texts) and the private data's size; it goes to
    ``private/eval/reference.json``. None when the result holds nothing private.
    """
    shareable = copy.deepcopy(result)
    utility: dict[str, Any] = {}
    for kind, block in (shareable.get("utility") or {}).items():
        if kind == "next_token":
            if cells := _operator_cells(block):
                utility[kind] = cells
            continue
        for col, row in block.items():
            if cells := _operator_cells(row):
                utility.setdefault(kind, {})[col] = cells
    n_private = (shareable.get("n") or {}).pop("private", None)
    shareable["notes"] = [n for n in shareable.get("notes", []) if n != PRIVATE_USE_NOTE]
    if not utility and n_private is None:
        return shareable, None
    return shareable, {"run_id": result.get("run_id"), "n_private": n_private,
                       "utility": utility, "note": PRIVATE_USE_NOTE}


def _operator_cells(row: dict[str, Any]) -> dict[str, Any]:
    """The cells of :data:`.view.OPERATOR_ROWS` taken out of one utility row."""
    return {key: row.pop(key) for key in sorted(OPERATOR_ROWS) if key in row}


def merge_private(shareable: dict[str, Any], reference: dict[str, Any] | None
                  ) -> dict[str, Any]:
    """The operator's view: an eval.json with its private/eval/reference.json put back."""
    merged = copy.deepcopy(shareable)
    if not reference:
        return merged
    for kind, block in (reference.get("utility") or {}).items():
        target = merged.setdefault("utility", {}).setdefault(kind, {})
        if kind == "next_token":
            target.update(block)
            continue
        for col, cells in block.items():
            target.setdefault(col, {}).update(cells)
    if reference.get("n_private") is not None:
        merged.setdefault("n", {})["private"] = reference["n_private"]
    if reference.get("note") and reference["note"] not in merged.get("notes", []):
        merged["notes"] = [*merged.get("notes", []), reference["note"]]
    return merged


def load_zero_shot_run(run_dir: str | Path) -> LabeledTexts:
    """The zero-shot set of another run folder: a ``zero_shot`` run's synthetic data, or any
    run's release/zero_shot.jsonl."""
    other = load_run(run_dir)
    if other.method == "zero_shot":
        return other.synthetic
    if other.zero_shot is not None:
        return other.zero_shot
    raise EvalInputError(
        f"{other.root}: not a zero-shot run (method {other.method}) and no "
        "release/zero_shot.jsonl; --zero-shot takes a run of method zero_shot"
    )


def audit_run(
    run_dir: str | Path,
    holdout_path: str | Path | None = None,
    *,
    text: str | None = None,
    embedder: Any = None,
    pii_columns: list[str] | None = None,
    seed: int = 0,
    write: bool = True,
    progress: bool = False,
) -> dict[str, Any]:
    """Only the audits (DCR, membership inference, PII) of a run; writes private/eval/audit.json.

    ``holdout_path``: real records the run never saw (non-members), e.g. the test split;
    ``progress``: bars for the embedding of each set (texts) and the three audits.
    """
    release = load_run(run_dir)
    data_cfg = release.data_config
    text_col = text or str(data_cfg.get("text") or "text")
    private = load_private_data(release, [], pii_columns)
    if private is None:
        raise EvalInputError(
            f"{release.root}: the private data named in config.yaml "
            f"({data_cfg.get('path')!r}) is not reachable; audits need it"
        )
    try:
        if holdout_path is None:
            if private.demo_test is None:
                raise EvalInputError("give the holdout (non-member) records with --holdout FILE")
            holdout_path = private.demo_test
        holdout, _ = load_test_data(holdout_path, text_col, [], release.synthetic)
        if embedder is None:
            from ..embed import Embedder

            embedder = Embedder(str((release.config.get("embedder") or {}).get("model",
                                                                               "minilm")))
        private_set = set(private.data.texts)
        hold_texts = [t for t in holdout.texts if t not in private_set]
        syn_emb = _embed(embedder, release.synthetic.texts, "synthetic" if progress else None)
        priv_emb = _embed(embedder, private.data.texts, "private" if progress else None)
        hold_emb = _embed(embedder, hold_texts, "holdout" if progress else None)
        with bar(AUDITS_BAR, 3, progress) as advance:
            block = audit_block(syn_emb, release.synthetic, priv_emb, private.data, hold_emb,
                                private.pii_values, seed=seed, advance=advance)
        audit = {
            "run_id": release.run_id,
            "method": release.method,
            "holdout": f"{holdout_path} (real records not used by the run)",
            "holdout_overlap_removed": len(holdout) - len(hold_texts),
            **block,
            "note": AUDIT_NOTE,
        }
    finally:
        private.close()
    if write:
        release.audit_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write_json(release.audit_dir / "audit.json", audit, mode=0o600)
    return audit
