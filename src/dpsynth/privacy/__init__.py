"""Privacy core (docs/methods.md §0): noise sources, privacy events (dp_accounting's, plus named
release events), accountants behind dp_accounting's interface, one calibration, pure mechanisms,
the release store and session, and the cross-run budget ledger."""

from .accountant import (
    KINDS,
    Accountant,
    gdp_delta,
    gdp_epsilon,
    zcdp_to_delta_cks,
    zcdp_to_eps_cks,
    zcdp_to_eps_standard,
)
from .calibration import (
    calibrate_gaussian_sigma,
    calibrate_steps,
    plan_epsilon,
    steps_epsilon,
    validate_epsilon_delta,
)
from .errors import BudgetExceededError, BudgetRefusedError, PrivacyConfigError
from .events import (
    Event,
    ExponentialEvent,
    GaussianEvent,
    PureDpEvent,
    ZCDPEvent,
    as_event_list,
    event_from_dict,
    overlapping,
    to_dp_event,
)
from .ledger import BudgetLedger, default_ledger_path, keyed_fingerprint
from .mechanisms import (
    exponential_mechanism,
    gaussian_mechanism,
    private_token_mechanism,
    threshold_log_weights,
    threshold_mechanism,
)
from .noise import NoiseSource, SecureNoise, SeededNoise, make_noise_source, run_seed
from .session import PrivacySession, noise_note
from .store import ReleaseStore, StoreLockedError

__all__ = [
    "KINDS",
    "Accountant",
    "BudgetExceededError",
    "BudgetLedger",
    "BudgetRefusedError",
    "Event",
    "ExponentialEvent",
    "GaussianEvent",
    "NoiseSource",
    "PrivacyConfigError",
    "PrivacySession",
    "PureDpEvent",
    "ReleaseStore",
    "SecureNoise",
    "SeededNoise",
    "StoreLockedError",
    "ZCDPEvent",
    "as_event_list",
    "calibrate_gaussian_sigma",
    "calibrate_steps",
    "default_ledger_path",
    "event_from_dict",
    "exponential_mechanism",
    "gaussian_mechanism",
    "gdp_delta",
    "gdp_epsilon",
    "keyed_fingerprint",
    "make_noise_source",
    "noise_note",
    "overlapping",
    "plan_epsilon",
    "private_token_mechanism",
    "run_seed",
    "steps_epsilon",
    "threshold_log_weights",
    "threshold_mechanism",
    "to_dp_event",
    "validate_epsilon_delta",
    "zcdp_to_delta_cks",
    "zcdp_to_eps_cks",
    "zcdp_to_eps_standard",
]
