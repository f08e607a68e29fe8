"""Privacy core: noise sources, privacy events, accountants, calibration, the release session
and the cross-run budget ledger (METHODS.md section 0)."""

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
    ZCDPEvent,
    event_from_dict,
    overlapping,
)
from .ledger import BudgetLedger, dataset_fingerprint, default_ledger_path
from .noise import NoiseSource, SecureNoise, SeededNoise, make_noise_source
from .session import PrivacySession, clip_logits, threshold_log_weights

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
    "SecureNoise",
    "SeededNoise",
    "ZCDPEvent",
    "calibrate_gaussian_sigma",
    "calibrate_steps",
    "clip_logits",
    "dataset_fingerprint",
    "default_ledger_path",
    "event_from_dict",
    "gdp_delta",
    "gdp_epsilon",
    "make_noise_source",
    "overlapping",
    "plan_epsilon",
    "steps_epsilon",
    "threshold_log_weights",
    "validate_epsilon_delta",
    "zcdp_to_delta_cks",
    "zcdp_to_eps_cks",
    "zcdp_to_eps_standard",
]
