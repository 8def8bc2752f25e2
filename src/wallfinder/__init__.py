"""wallfinder: find the wall a slow PyTorch job is hitting — compute, memory bandwidth, or
communication/overhead — from its profiler traces.

    >>> import wallfinder
    >>> diagnosis = wallfinder.analyze("trace.json.gz")
    >>> diagnosis.verdict.wall

The names below are imported on first use: the command line imports only what its command
needs.
"""

from typing import TYPE_CHECKING

from wallfinder._lazy import lazy_attributes

if TYPE_CHECKING:
    from wallfinder.analysis import ModelFlops, Thresholds
    from wallfinder.api import Options, analyze
    from wallfinder.diagnosis import Diagnosis
    from wallfinder.errors import WallfinderError
    from wallfinder.measure import Profile, StepTimer, profile

__all__ = [
    "Diagnosis",
    "ModelFlops",
    "Options",
    "Profile",
    "StepTimer",
    "Thresholds",
    "WallfinderError",
    "__version__",
    "analyze",
    "profile",
]

__version__ = "0.1.0"

__getattr__ = lazy_attributes(
    __name__,
    {
        "Diagnosis": "wallfinder.diagnosis",
        "ModelFlops": "wallfinder.analysis",
        "Options": "wallfinder.api",
        "Profile": "wallfinder.measure",
        "StepTimer": "wallfinder.measure",
        "Thresholds": "wallfinder.analysis",
        "WallfinderError": "wallfinder.errors",
        "analyze": "wallfinder.api",
        "profile": "wallfinder.measure",
    },
)


def __dir__() -> list[str]:
    return list(__all__)
