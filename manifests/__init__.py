"""Module manifests: the format, loading with clear errors, the registration check."""

from .load import LoadedModule, ManifestError, Problem, find_modules, load_module
from .model import Artifact, BundleManifest, Module, Seat

__all__ = [
    "Artifact",
    "BundleManifest",
    "LoadedModule",
    "ManifestError",
    "Module",
    "Problem",
    "Seat",
    "find_modules",
    "load_module",
]
