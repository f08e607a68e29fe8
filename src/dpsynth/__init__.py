"""dpsynth: differentially private synthetic text with the Private Evolution family."""

__version__ = "0.1.0"
