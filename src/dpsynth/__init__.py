"""dpsynth: differentially private synthetic text with the Private Evolution family.

The Python API (docs/python-api.md), imported on first use so that ``import dpsynth`` stays
fast::

    import dpsynth
    result = dpsynth.generate(df, text="text", labels=["department"],
                              label_values={"department": ["billing", "support"]},
                              epsilon=2, output="runs/first")
    result.synthetic, result.privacy, result.run_dir
"""

from .lazy import lazy_exports

__version__ = "0.1.0"

__all__ = ["RagResult", "Result", "build_rag", "evaluate", "generate", "load_run", "report",
           "run_generation"]

__getattr__, __dir__ = lazy_exports(__name__, dict.fromkeys(__all__, "api"))
