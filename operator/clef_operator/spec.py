"""The ClefDecision spec as a pydantic model: the operator's own check of what the CRD schema enforces.

The API server validates and defaults objects against the CRD; the operator validates again so that
a spec written against an older schema (or a cluster without CEL) gets a clear ``InvalidSpec``
condition naming the field instead of a half-built InferenceService.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from clef_contract.predictor import COMPILE_CACHE_VOLUME
from clef_operator.constants import FP8_MIN_COMPUTE_CAPABILITY

STORAGE_URI_PATTERN = r"^(pvc|s3|gs|hf|oci)://.+"
MODEL_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9._]*[a-z0-9])?$"
CAPABILITY_PATTERN = r"^[0-9]{1,2}\.[0-9]{1,2}$"
DEFAULT_PREDICTOR_IMAGE = "ghcr.io/clef-serving/clef-predictor:0.1.0"
PREDICTOR_IMAGE_ENV = "CLEF_PREDICTOR_IMAGE"

# Flags the operator sets itself; extraArgs may not repeat them.
MANAGED_FLAGS: tuple[str, ...] = (
    "--model-dir",
    "--model-name",
    "--engine",
    "--dp",
    "--max-model-len",
    "--http_port",
)

# Kubernetes volume sources a compile cache may use: the writable ones (configMap, secret, downwardAPI,
# projected and image volumes are read-only; gitRepo is deprecated).
CACHE_VOLUME_SOURCES: tuple[str, ...] = (
    "emptyDir", "ephemeral", "hostPath", "persistentVolumeClaim", "nfs", "csi",
    "awsElasticBlockStore", "azureDisk", "azureFile", "cephfs", "cinder", "fc", "flexVolume", "flocker",
    "gcePersistentDisk", "glusterfs", "iscsi", "photonPersistentDisk", "portworxVolume", "quobyte", "rbd",
    "scaleIO", "storageos", "vsphereVolume",
)
DEFAULT_COMPILE_CACHE: dict[str, Any] = {"emptyDir": {}}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSource(_Model):
    """Where the release lives and the name the predictor serves it under."""

    storageUri: str = Field(pattern=STORAGE_URI_PATTERN)
    name: str = Field(default="clef-flash", min_length=1, max_length=63, pattern=MODEL_NAME_PATTERN)


class NodePoolSelection(_Model):
    """How GPU node pools are found and which of them are considered."""

    labelKey: str | None = Field(default=None, min_length=1, max_length=316)
    include: list[str] = Field(default_factory=list)
    exclude: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _disjoint(self) -> NodePoolSelection:
        both = sorted(set(self.include) & set(self.exclude))
        if both:
            raise ValueError(f"pools listed in both include and exclude: {', '.join(both)}")
        return self


class PoolOverride(_Model):
    """Replicas and GPUs per replica for one named pool."""

    name: str = Field(min_length=1, max_length=63)
    replicas: int | None = Field(default=None, ge=1, le=1000)
    gpusPerReplica: int | None = Field(default=None, ge=1, le=16)


class StartupBudget(_Model):
    """The startup probe's budget: periodSeconds * failureThreshold covers weight loading and warm-up."""

    periodSeconds: int = Field(default=10, ge=1, le=300)
    failureThreshold: int = Field(default=180, ge=1, le=10000)


class Predictor(_Model):
    """The predictor container: image, resources, serving limits, extra CLI flags, compile-cache volume."""

    image: str | None = Field(default=None, min_length=1)
    imagePullPolicy: Literal["Always", "IfNotPresent", "Never"] | None = None
    resources: dict[str, dict[str, str | int]] = Field(default_factory=dict)
    maxModelLen: int = Field(default=8192, ge=256, le=1_048_576)
    extraArgs: list[str] = Field(default_factory=list)
    shmSize: str = Field(default="16Gi", pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|K|M|G|T)?$")
    startupProbe: StartupBudget = Field(default_factory=StartupBudget)
    compileCache: dict[str, Any] = Field(default_factory=lambda: copy.deepcopy(DEFAULT_COMPILE_CACHE))

    @field_validator("resources")
    @classmethod
    def _only_requests_and_limits(cls, value: dict[str, dict[str, str | int]]) -> dict[str, dict[str, str | int]]:
        unknown = sorted(set(value) - {"requests", "limits"})
        if unknown:
            raise ValueError(f"unknown keys {unknown}: only requests and limits are allowed")
        return value

    @field_validator("compileCache")
    @classmethod
    def _one_volume_source(cls, value: dict[str, Any]) -> dict[str, Any]:
        if "name" in value:
            raise ValueError(f"name is set by the operator (the volume is always named {COMPILE_CACHE_VOLUME}); "
                             "give only the volume source, e.g. {persistentVolumeClaim: {claimName: ...}}")
        if len(value) != 1:
            found = ", ".join(sorted(value)) or "none"
            raise ValueError(f"must name exactly one volume source (e.g. persistentVolumeClaim, hostPath, "
                             f"emptyDir), found {len(value)}: {found}")
        ((source, settings),) = value.items()
        if source not in CACHE_VOLUME_SOURCES:
            raise ValueError(f"{source!r} is not a writable Kubernetes volume source; use one of "
                             f"{', '.join(CACHE_VOLUME_SOURCES)}")
        if not isinstance(settings, dict):  # pydantic turns ValueError, not TypeError, into a field error
            raise ValueError(f"{source} must be an object (e.g. {{}}), not {type(settings).__name__}")  # noqa: TRY004
        return value

    @field_validator("extraArgs")
    @classmethod
    def _no_managed_flags(cls, value: list[str]) -> list[str]:
        for arg in value:
            flag = arg.split("=", 1)[0]
            if flag in MANAGED_FLAGS:
                raise ValueError(f"{flag} is set by the operator and may not appear in extraArgs")
        return value


class ClefDecisionSpec(_Model):
    """The whole ``spec`` of a ClefDecision, with the CRD's defaults."""

    model: ModelSource
    quantization: Literal["fp8", "bf16"] = "fp8"
    minComputeCapability: str = Field(default="8.9", pattern=CAPABILITY_PATTERN)
    allowUnverifiedPools: bool = False
    nodePools: NodePoolSelection = Field(default_factory=NodePoolSelection)
    replicas: int = Field(default=1, ge=1, le=1000)
    gpusPerReplica: int = Field(default=1, ge=1, le=16)
    poolOverrides: list[PoolOverride] = Field(default_factory=list)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    predictor: Predictor = Field(default_factory=Predictor)
    deploymentMode: Literal["Standard", "Knative"] = "Standard"

    @model_validator(mode="after")
    def _consistent(self) -> ClefDecisionSpec:
        if self.quantization == "fp8" and self.min_capability < FP8_MIN_COMPUTE_CAPABILITY:
            raise ValueError("minComputeCapability must be at least 8.9 when quantization is fp8")
        names = [override.name for override in self.poolOverrides]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"poolOverrides lists a pool more than once: {', '.join(duplicates)}")
        return self

    @property
    def min_capability(self) -> tuple[int, int]:
        """The minimum compute capability as (major, minor)."""
        return parse_capability(self.minComputeCapability)

    def replicas_for(self, pool: str) -> int:
        """Replicas for a pool: its override, else the spec-wide value."""
        override = self._override(pool)
        return override.replicas if override and override.replicas is not None else self.replicas

    def gpus_for(self, pool: str) -> int:
        """GPUs per replica for a pool: its override, else the spec-wide value."""
        override = self._override(pool)
        return override.gpusPerReplica if override and override.gpusPerReplica is not None else self.gpusPerReplica

    def image(self) -> str:
        """The predictor image: the spec's, else $CLEF_PREDICTOR_IMAGE, else the release default."""
        return self.predictor.image or os.environ.get(PREDICTOR_IMAGE_ENV) or DEFAULT_PREDICTOR_IMAGE

    def _override(self, pool: str) -> PoolOverride | None:
        return next((override for override in self.poolOverrides if override.name == pool), None)


class InvalidSpecError(ValueError):
    """The ClefDecision's spec does not validate; the message names every offending field."""


def parse_capability(text: str) -> tuple[int, int]:
    """Parse a compute capability such as ``"8.9"`` into ``(8, 9)``."""
    if not re.fullmatch(CAPABILITY_PATTERN, text):
        raise ValueError(f"compute capability {text!r} is not of the form MAJOR.MINOR")
    major, minor = text.split(".")
    return int(major), int(minor)


def parse_spec(spec: Mapping[str, Any]) -> ClefDecisionSpec:
    """Validate a ClefDecision's spec; raise InvalidSpecError naming each bad field as ``spec.a.b``."""
    try:
        return ClefDecisionSpec.model_validate(dict(spec))
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            where = ".".join(str(part) for part in ("spec", *error["loc"]))
            problems.append(f"{where}: {error['msg']}")
        raise InvalidSpecError("; ".join(problems)) from None
