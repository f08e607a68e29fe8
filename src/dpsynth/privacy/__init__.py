"""Privacy core (docs/methods.md §0): noise sources, privacy events (dp_accounting's, plus named
release events), accountants behind dp_accounting's interface, one calibration, pure mechanisms,
the release store and session, and the cross-run budget ledger."""

# The names below load on first use (PEP 562): a Ray worker that needs only the noise sources
# or the mechanisms does not import dp_accounting (and the scipy.signal/stats it pulls in).

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

if TYPE_CHECKING:
    from .accountant import (
        KINDS,
        Accountant,
        ddgauss_rdp,
        ddgauss_rho,
        ddgauss_tau,
        dgauss_rho,
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
    from .distributed import party_share, share_sigma, sum_shares
    from .errors import BudgetExceededError, BudgetRefusedError, PrivacyConfigError
    from .events import (
        DiscreteGaussianEvent,
        DistributedDiscreteGaussianEvent,
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
    from .lattice import FIXED_POINT_GRID, Lattice
    from .ledger import BudgetLedger, default_ledger_path, keyed_fingerprint
    from .mechanisms import (
        discrete_gaussian_mechanism,
        exponential_mechanism,
        gaussian_mechanism,
        private_token_mechanism,
        threshold_log_weights,
        threshold_mechanism,
    )
    from .noise import NoiseSource, SecureNoise, SeededNoise, make_noise_source, run_seed
    from .planned import ReleasePlan, Scaled, SecAggRounds
    from .session import PrivacySession, StoreOpener, noise_note
    from .store import ReleaseStore, StoreLockedError

#: exported name -> the submodule that defines it
_WHERE: dict[str, str] = {
    "Accountant": "accountant",
    "KINDS": "accountant",
    "gdp_delta": "accountant",
    "gdp_epsilon": "accountant",
    "zcdp_to_delta_cks": "accountant",
    "zcdp_to_eps_cks": "accountant",
    "zcdp_to_eps_standard": "accountant",
    "ddgauss_rdp": "accountant",
    "ddgauss_rho": "accountant",
    "ddgauss_tau": "accountant",
    "dgauss_rho": "accountant",
    "party_share": "distributed",
    "share_sigma": "distributed",
    "sum_shares": "distributed",
    "DiscreteGaussianEvent": "events",
    "DistributedDiscreteGaussianEvent": "events",
    "FIXED_POINT_GRID": "lattice",
    "Lattice": "lattice",
    "discrete_gaussian_mechanism": "mechanisms",
    "calibrate_gaussian_sigma": "calibration",
    "calibrate_steps": "calibration",
    "plan_epsilon": "calibration",
    "steps_epsilon": "calibration",
    "validate_epsilon_delta": "calibration",
    "BudgetExceededError": "errors",
    "BudgetRefusedError": "errors",
    "PrivacyConfigError": "errors",
    "Event": "events",
    "ExponentialEvent": "events",
    "GaussianEvent": "events",
    "PureDpEvent": "events",
    "ZCDPEvent": "events",
    "as_event_list": "events",
    "event_from_dict": "events",
    "overlapping": "events",
    "to_dp_event": "events",
    "BudgetLedger": "ledger",
    "default_ledger_path": "ledger",
    "keyed_fingerprint": "ledger",
    "exponential_mechanism": "mechanisms",
    "gaussian_mechanism": "mechanisms",
    "private_token_mechanism": "mechanisms",
    "threshold_log_weights": "mechanisms",
    "threshold_mechanism": "mechanisms",
    "NoiseSource": "noise",
    "SecureNoise": "noise",
    "SeededNoise": "noise",
    "make_noise_source": "noise",
    "run_seed": "noise",
    "ReleasePlan": "planned",
    "Scaled": "planned",
    "SecAggRounds": "planned",
    "PrivacySession": "session",
    "noise_note": "session",
    "StoreOpener": "session",
    "ReleaseStore": "store",
    "StoreLockedError": "store",
}

__all__ = [
    "FIXED_POINT_GRID",
    "KINDS",
    "Accountant",
    "BudgetExceededError",
    "BudgetLedger",
    "BudgetRefusedError",
    "DiscreteGaussianEvent",
    "DistributedDiscreteGaussianEvent",
    "Event",
    "ExponentialEvent",
    "GaussianEvent",
    "Lattice",
    "NoiseSource",
    "PrivacyConfigError",
    "PrivacySession",
    "PureDpEvent",
    "ReleasePlan",
    "ReleaseStore",
    "Scaled",
    "SecAggRounds",
    "SecureNoise",
    "SeededNoise",
    "StoreLockedError",
    "StoreOpener",
    "ZCDPEvent",
    "as_event_list",
    "calibrate_gaussian_sigma",
    "calibrate_steps",
    "ddgauss_rdp",
    "ddgauss_rho",
    "ddgauss_tau",
    "default_ledger_path",
    "dgauss_rho",
    "discrete_gaussian_mechanism",
    "event_from_dict",
    "exponential_mechanism",
    "gaussian_mechanism",
    "gdp_delta",
    "gdp_epsilon",
    "keyed_fingerprint",
    "make_noise_source",
    "noise_note",
    "overlapping",
    "party_share",
    "plan_epsilon",
    "private_token_mechanism",
    "run_seed",
    "share_sigma",
    "steps_epsilon",
    "sum_shares",
    "threshold_log_weights",
    "threshold_mechanism",
    "to_dp_event",
    "validate_epsilon_delta",
    "zcdp_to_delta_cks",
    "zcdp_to_eps_cks",
    "zcdp_to_eps_standard",
]


__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
