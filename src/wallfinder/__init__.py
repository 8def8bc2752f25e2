"""wallfinder: find the wall a slow PyTorch job is hitting — compute, memory bandwidth, or
communication/overhead — from its profiler traces.

    >>> import wallfinder
    >>> diagnosis = wallfinder.analyze("trace.json.gz")
    >>> diagnosis.verdict.wall
"""

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
