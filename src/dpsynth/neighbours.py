"""The neighbour relation a run's guarantee is stated for, when ``data.limit`` picks a subset.

The guarantee is about the private *file*: two files are neighbours when one has one record
more (add/remove, docs/methods.md §0). ``data.limit: N`` keeps the first N rows. Removing one
of them brings row N + 1 in, so the subsets of two neighbouring files can differ by two
records (one out, one in), not one: a mechanism that is (epsilon, delta)-DP over the subset is
only group-private for two records over the file.

dpsynth charges such a run as a two-record change. Group privacy for k = 2: if M is
(e, d)-DP for one-record neighbours then for files two records apart

    Pr[M(D) in S] <= e^e (e^e Pr[M(D'') in S] + d) + d = e^(2e) Pr[M(D'') in S] + (1 + e^e) d,

i.e. M is (2e, (1 + e^e) d)-DP (Dwork & Roth 2014, Theorem 2.2, with the tighter delta of
the two-step chain). So a run asked for (epsilon, delta) over the file calibrates its
mechanisms to (epsilon / 2, delta / (1 + e^(epsilon / 2))) over the subset
(:func:`subset_target`), and its statement is converted back (:func:`over_file`): the user's
epsilon is what the data source is charged, and what it is protected at.

Privacy unit ``user`` with a limit is refused (one user's rows among the first N can pull in
as many other users' rows: the group is unbounded), and so is a limit on a run without an
(epsilon, delta) guarantee, which has nothing to convert (:func:`check_limit`).
"""

from __future__ import annotations

import math
from typing import Any

#: records by which the subsets of two neighbouring files can differ under ``data.limit``
LIMIT_GROUP = 2


def group_guarantee(epsilon: float, delta: float, k: int = LIMIT_GROUP) -> tuple[float, float]:
    """(epsilon, delta) for files ``k`` records apart of an (epsilon, delta)-DP mechanism:
    (k e, d sum_{i<k} e^(i e)) (the chain of k one-record steps; k = 2: (2e, (1 + e^e) d))."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return k * epsilon, delta * sum(math.exp(i * epsilon) for i in range(k))


def subset_target(epsilon: float, delta: float, k: int = LIMIT_GROUP) -> tuple[float, float]:
    """The (epsilon, delta) a mechanism over the subset must meet so that the run is
    (epsilon, delta)-DP over the file: the inverse of :func:`group_guarantee`."""
    e = epsilon / k
    return e, delta / sum(math.exp(i * e) for i in range(k))


def limited(config: Any) -> bool:
    """Whether the run reads a subset picked by position (``data.limit``)."""
    return config.data.limit is not None


def check_limit(config: Any, guarantee: str) -> str | None:
    """Why ``data.limit`` cannot be stated for this run (None when it can): the user unit,
    or a run without an (epsilon, delta) guarantee to convert."""
    if not limited(config):
        return None
    if config.privacy.unit == "user":
        return ("data.limit keeps the first N rows, and with privacy.unit: user one user's rows "
                "there can pull in any number of other users' rows, so no guarantee per user "
                "holds; remove data.limit (or write the subset you want to a file of its own "
                "and run on that file)")
    if guarantee not in ("dp", "public"):
        return ("data.limit is stated as a two-record change of an (epsilon, delta) guarantee "
                f"(docs/methods.md §0), and this run states {guarantee!r}; remove data.limit")
    return None


def mechanism_config(config: Any) -> Any:
    """The config the method plans and runs with: ``privacy.epsilon`` / ``delta`` replaced by
    :func:`subset_target` of the user's when a limit is set (else ``config`` itself)."""
    if not limited(config) or math.isinf(config.privacy.epsilon) or config.privacy.epsilon <= 0:
        return config
    eps, delta = subset_target(config.privacy.epsilon, config.privacy.delta)
    privacy = config.privacy.model_copy(update={"epsilon": eps, "delta": delta})
    return config.model_copy(update={"privacy": privacy})


def over_file(statement: dict[str, Any], config: Any) -> dict[str, Any]:
    """The method's statement over the subset, restated over the file (a copy): epsilon and
    delta by :func:`group_guarantee`, the subset's own values and the reason kept beside."""
    if not limited(config) or not isinstance(statement.get("epsilon"), int | float):
        return statement
    eps, delta = float(statement["epsilon"]), float(statement["delta"])
    file_eps, file_delta = group_guarantee(eps, delta)
    out = dict(statement)
    out.update(epsilon=file_eps, delta=file_delta,
               target_epsilon=config.privacy.epsilon, target_delta=config.privacy.delta,
               subset={"epsilon": eps, "delta": delta, "limit": config.data.limit,
                       "note": "data.limit keeps the first N rows, so neighbouring files give "
                               "subsets two records apart: the guarantee over the file is "
                               "group privacy for two records of the subset's"})
    return out


__all__ = ["LIMIT_GROUP", "check_limit", "group_guarantee", "limited", "mechanism_config",
           "over_file", "subset_target"]
