"""Every resource kind under ``datacache.io/v1alpha1``, by name (what the loader and the CRDs use)."""

from __future__ import annotations

from typing import Annotated, Union

from pydantic import BaseModel, Field

from .dataflow import DataMigrate, DataProcess
from .models import CacheRuntime, DataLoad, Dataset, JuiceFSRuntime, ThinRuntime, ThinRuntimeProfile

__all__ = ["KINDS", "Resource"]

Resource = Annotated[Union[Dataset, CacheRuntime, ThinRuntime, ThinRuntimeProfile, JuiceFSRuntime, DataLoad,
                           DataMigrate, DataProcess], Field(discriminator="kind")]
"""Any resource; pydantic picks the class from ``kind``."""

KINDS: dict[str, type[BaseModel]] = {
    "Dataset": Dataset,
    "CacheRuntime": CacheRuntime,
    "ThinRuntime": ThinRuntime,
    "ThinRuntimeProfile": ThinRuntimeProfile,
    "JuiceFSRuntime": JuiceFSRuntime,
    "DataLoad": DataLoad,
    "DataMigrate": DataMigrate,
    "DataProcess": DataProcess,
}
"""Kind name → model class."""
