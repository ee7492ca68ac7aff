"""The ClefDecision spec as a pydantic model: the operator's own check of what the CRD schema enforces.

The API server validates and defaults objects against the CRD; the operator validates again so that
a spec written against an older schema (or a cluster without CEL) gets a clear ``InvalidSpec``
condition naming the field instead of a half-built InferenceService.

This model is also the CRD's schema source: clef_operator.crd renders the chart's CRD from it (fields, bounds,
defaults, enums, descriptions, and each CEL rule written beside the validator it mirrors), hence the length.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from clef_contract.container import (
    DEFAULT_REQUESTS,
    DEFAULT_SHM_SIZE,
    DEFAULT_STARTUP_FAILURES,
    DEFAULT_STARTUP_PERIOD,
)
from clef_contract.container import MANAGED_FLAGS as CONTRACT_FLAGS
from clef_contract.predictor import COMPILE_CACHE_VOLUME

STORAGE_URI_PATTERN = r"^(pvc|s3|gs|hf|oci)://.+"
MAX_STORAGE_URI = 2048
MODEL_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9._]*[a-z0-9])?$"
# MAJOR.MINOR with a one-digit minor, as NVIDIA numbers them (8.9, 9.0, 10.0, 12.0): read as a number by the
# CRD's CEL rules and as (major, minor) here, two readings that agree only when the minor has one digit.
CAPABILITY_PATTERN = r"^[0-9]{1,2}\.[0-9]$"
DEFAULT_PREDICTOR_IMAGE = "ghcr.io/clef-serving/clef-predictor:0.1.0"
PREDICTOR_IMAGE_ENV = "CLEF_PREDICTOR_IMAGE"

# A Kubernetes resource quantity (the API server's own pattern, as in KServe's and Kubernetes' schemas).
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
# A duration such as 10m, 90s, 1h30m.
DURATION_PATTERN = r"^([0-9]+h)?([0-9]+m)?([0-9]+s)?$"
DEFAULT_REMOVAL_GRACE = "10m"

# Flags the operator sets itself (the predictor contract's); extraArgs may not repeat them.
MANAGED_FLAGS: tuple[str, ...] = CONTRACT_FLAGS

# Release formats, best first, with the smallest compute capability each needs: NVFP4 has FP4 tensor cores
# from Blackwell (10.0), FP8 from Ada (8.9); BF16 runs from Ampere (8.0).
QUANTIZATIONS: tuple[str, ...] = ("nvfp4", "fp8", "bf16")
QUANTIZATION_FLOOR: dict[str, tuple[int, int]] = {"nvfp4": (10, 0), "fp8": (8, 9), "bf16": (8, 0)}
Quantization = Literal["nvfp4", "fp8", "bf16"]

# Kubernetes volume sources a compile cache may use: the writable ones (configMap, secret, downwardAPI,
# projected and image volumes are read-only; gitRepo is deprecated).
CACHE_VOLUME_SOURCES: tuple[str, ...] = (
    "emptyDir",
    "ephemeral",
    "hostPath",
    "persistentVolumeClaim",
    "nfs",
    "csi",
    "awsElasticBlockStore",
    "azureDisk",
    "azureFile",
    "cephfs",
    "cinder",
    "fc",
    "flexVolume",
    "flocker",
    "gcePersistentDisk",
    "glusterfs",
    "iscsi",
    "photonPersistentDisk",
    "portworxVolume",
    "quobyte",
    "rbd",
    "scaleIO",
    "storageos",
    "vsphereVolume",
)
DEFAULT_COMPILE_CACHE: dict[str, Any] = {"emptyDir": {}}


# Caps on the free-form fields, the same in the CRD: with them every accepted ClefDecision yields an
# InferenceService far below the API server's object limit.
MAX_EXTRA_ARGS = 64
MAX_ARG_LENGTH = 2048
MAX_ENV = 64
MAX_ENV_NAME = 256
MAX_ENV_VALUE = 8192
MAX_ENV_FROM = 16
MAX_TOLERATIONS = 32
MAX_PULL_SECRETS = 16

# CRD-only schema keywords (pydantic's json_schema_extra): how the API server merges lists, and CEL rules.
ATOMIC: dict[str, Any] = {"x-kubernetes-list-type": "atomic"}
SET: dict[str, Any] = {"x-kubernetes-list-type": "set"}


def list_map(*keys: str) -> dict[str, Any]:
    """A list the API server merges by the given keys (x-kubernetes-list-type: map)."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": list(keys)}


def cel(*rules: dict[str, str]) -> dict[str, Any]:
    """CEL rules (x-kubernetes-validations) the API server checks; each mirrors a validator of this module."""
    return {"x-kubernetes-validations": list(rules)}


def free_form(**schema: Any) -> dict[str, Any]:
    """An object whose unknown fields the API server keeps (Kubernetes' own types, passed through)."""
    return {"type": "object", "x-kubernetes-preserve-unknown-fields": True, **schema}


class _Model(BaseModel):
    # strict: no coercion the API server would not do (the CRD refuses maxModelLen: "8192", pydantic's lax
    # mode would read it as 8192).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Toleration(_Model):
    """A Kubernetes toleration, with the CRD's enums."""

    key: str | None = Field(default=None, max_length=317)
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = Field(default=None, max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    tolerationSeconds: int | None = Field(default=None, json_schema_extra={"format": "int64"})


class EnvVar(_Model):
    """A Kubernetes EnvVar: name and value checked, valueFrom passed through."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True, json_schema_extra=free_form())
    name: str = Field(min_length=1, max_length=MAX_ENV_NAME)
    value: str | None = Field(default=None, max_length=MAX_ENV_VALUE)


class PullSecret(_Model):
    """A reference to an image pull Secret."""

    name: str = Field(min_length=1, max_length=253)


class Variant(_Model):
    """One release of the model: its format, where it lives, and the GPUs that may run it."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            {
                "rule": "!has(self.minComputeCapability) || self.quantization == 'bf16' || "
                "double(self.minComputeCapability) >= (self.quantization == 'nvfp4' ? 10.0 : 8.9)",
                "message": "fp8 needs minComputeCapability >= 8.9, nvfp4 >= 10.0",
            }
        )
    )
    quantization: Quantization
    storageUri: str = Field(max_length=MAX_STORAGE_URI, pattern=STORAGE_URI_PATTERN)
    minComputeCapability: str | None = Field(
        default=None,
        pattern=CAPABILITY_PATTERN,
        description="Default: the format's own floor (nvfp4 10.0, fp8 8.9, bf16 8.0).",
    )

    @model_validator(mode="after")
    def _runnable(self) -> Variant:
        floor = QUANTIZATION_FLOOR[self.quantization]
        if self.minComputeCapability is not None and parse_capability(self.minComputeCapability) < floor:
            raise ValueError(f"minComputeCapability must be at least {floor[0]}.{floor[1]} for {self.quantization}")
        return self

    @property
    def min_capability(self) -> tuple[int, int]:
        """The variant's own minimum, else its format's floor."""
        if self.minComputeCapability is None:
            return QUANTIZATION_FLOOR[self.quantization]
        return parse_capability(self.minComputeCapability)


class ModelSource(_Model):
    """Where the release lives (one storageUri, or variants per GPU class) and the name it is served under."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            {
                "rule": "has(self.storageUri) != (has(self.variants) && size(self.variants) > 0)",
                "message": "give exactly one of storageUri and variants",
            }
        )
    )
    storageUri: str | None = Field(
        default=None,
        max_length=MAX_STORAGE_URI,
        pattern=STORAGE_URI_PATTERN,
        description="Where the release lives: pvc://claim/path, s3://, gs://, hf://org/repo or oci://image. "
        "KServe's storage initializer mounts it at /mnt/models.",
    )
    variants: list[Variant] = Field(
        default_factory=list,
        max_length=3,
        description="Releases per GPU class instead of one storageUri: each pool runs the best one its GPUs can "
        "(nvfp4 on >= 10.0, fp8 on >= 8.9, bf16 otherwise).",
        json_schema_extra=list_map("quantization"),
    )
    name: str = Field(
        default="clef-flash",
        min_length=1,
        max_length=63,
        pattern=MODEL_NAME_PATTERN,
        description="The model name the predictor serves (GET /v1/models/<name>).",
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelSource:
        if (self.storageUri is None) == (not self.variants):
            raise ValueError("give exactly one of storageUri and variants")
        formats = [variant.quantization for variant in self.variants]
        duplicates = sorted({q for q in formats if formats.count(q) > 1})
        if duplicates:
            raise ValueError(f"variants lists a quantization more than once: {', '.join(duplicates)}")
        return self


class DeclaredPool(_Model):
    """A pool named ahead of its nodes (scale-from-zero, Karpenter): served before any node exists."""

    name: str = Field(min_length=1, max_length=63)
    labelKey: str | None = Field(default=None, min_length=1, max_length=316, description="Default: nodePools.labelKey.")
    computeCapability: str = Field(pattern=CAPABILITY_PATTERN)
    gpusPerNode: int | None = Field(default=None, ge=1, le=16)


class NodePoolSelection(_Model):
    """How GPU node pools are found and which of them are considered."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            {
                "rule": "!has(self.include) || !has(self.exclude) || self.include.all(p, !(p in self.exclude))",
                "message": "a pool may not be listed in both include and exclude",
            },
            {
                "rule": "!has(self.declared) || has(self.labelKey) || self.declared.all(d, has(d.labelKey))",
                "message": "a declared pool needs a labelKey (its own or spec.nodePools.labelKey)",
            },
        )
    )
    labelKey: str | None = Field(
        default=None,
        min_length=1,
        max_length=316,
        description="Node label naming the pool. Default: the first present of cloud.google.com/gke-nodepool, "
        "eks.amazonaws.com/nodegroup, kubernetes.azure.com/agentpool, karpenter.sh/nodepool.",
    )
    include: list[Annotated[str, Field(min_length=1, max_length=63)]] = Field(
        default_factory=list,
        max_length=256,
        description="Only these pools (empty means every pool).",
        json_schema_extra=SET,
    )
    exclude: list[Annotated[str, Field(min_length=1, max_length=63)]] = Field(
        default_factory=list, max_length=256, description="Never these pools.", json_schema_extra=SET
    )
    removalGracePeriod: str = Field(
        default=DEFAULT_REMOVAL_GRACE,
        pattern=DURATION_PATTERN,
        min_length=2,
        description="How long a pool may be empty or ineligible (state Degraded) before its InferenceService is "
        "deleted, e.g. 10m, 90s, 1h.",
    )
    declared: list[DeclaredPool] = Field(
        default_factory=list,
        max_length=64,
        description="Pools served before any node exists (scale-from-zero, Karpenter): name, label key and the "
        "compute capability their nodes will have.",
        json_schema_extra=ATOMIC,
    )

    @model_validator(mode="after")
    def _disjoint(self) -> NodePoolSelection:
        both = sorted(set(self.include) & set(self.exclude))
        if both:
            raise ValueError(f"pools listed in both include and exclude: {', '.join(both)}")
        keys = [(pool.labelKey or self.labelKey, pool.name) for pool in self.declared]
        if any(key is None for key, _ in keys):
            raise ValueError("a declared pool needs a labelKey (its own or spec.nodePools.labelKey)")
        twice = sorted({name for key, name in keys if keys.count((key, name)) > 1})
        if twice:
            raise ValueError(f"declared lists a pool more than once: {', '.join(twice)}")
        return self

    @property
    def removal_grace_seconds(self) -> float:
        """removalGracePeriod in seconds."""
        return parse_duration(self.removalGracePeriod)


class PoolOverride(_Model):
    """Replicas and GPUs per replica for one named pool."""

    name: str = Field(min_length=1, max_length=63)
    replicas: int | None = Field(default=None, ge=1, le=1000)
    minReplicas: int | None = Field(default=None, ge=0, le=1000)
    maxReplicas: int | None = Field(default=None, ge=1, le=1000)
    gpusPerReplica: int | None = Field(default=None, ge=1, le=16)


# The predictor's own Prometheus gauges a pool may scale on: requests inside the engine, and requests admitted but
# waiting for it (a KEDA trigger's query, or the HorizontalPodAutoscaler's per-pod metric).
PREDICTOR_GAUGES: tuple[str, ...] = ("clef_engine_in_flight", "clef_queue_depth")
PredictorGauge = Literal["clef_engine_in_flight", "clef_queue_depth"]
DEFAULT_GAUGE_TARGET = "4"

# The deployment backend's stabilization windows when the spec gives none, for a predictor that takes about a
# minute to warm up (docs/autoscaling.md): scale up once the load has stayed above the target for a minute (a
# burst shorter than one warm-up is over before a new replica could serve it), and scale down only after ten
# minutes below it (removing a replica that a returning load needs again costs another warm-up).
DEFAULT_SCALE_UP_WINDOW_S = 60
DEFAULT_SCALE_DOWN_WINDOW_S = 600
MAX_WINDOW_S = 3600  # the HorizontalPodAutoscaler's own bound on stabilizationWindowSeconds


class Keda(_Model):
    """KEDA scaling on the predictor's own metrics (KServe's autoScaling block, or the deployment backend's
    ScaledObject; KEDA must be installed)."""

    metric: PredictorGauge = "clef_queue_depth"
    target: str = Field(
        default=DEFAULT_GAUGE_TARGET, pattern=QUANTITY_PATTERN, description="Average value per replica to scale to."
    )
    serverAddress: str = Field(min_length=1, pattern=r"^https?://.+", description="Prometheus URL.")


class PodMetric(_Model):
    """A HorizontalPodAutoscaler on the predictor's own gauge per pod, read through the custom metrics API
    (custom.metrics.k8s.io, served by an adapter such as prometheus-adapter: docs/autoscaling.md)."""

    name: PredictorGauge = Field(
        default="clef_queue_depth",
        description="clef_queue_depth (requests admitted and waiting or running) or clef_engine_in_flight "
        "(requests inside the engine).",
    )
    target: str = Field(
        default=DEFAULT_GAUGE_TARGET,
        pattern=QUANTITY_PATTERN,
        description="Average value per pod to scale to (the HorizontalPodAutoscaler's averageValue).",
    )


KSERVE_REFUSES_DEPLOYMENT_SCALING = (
    "autoscaling.podMetric, scaleUpStabilizationSeconds and scaleDownStabilizationSeconds are the deployment "
    "backend's (its HorizontalPodAutoscaler): KServe's InferenceService has no such fields; use scaleMetric/"
    "scaleTarget or autoscaling.keda with backend kserve, or backend: deployment"
)


class Autoscaling(_Model):
    """Replicas between min and max, scaled by KServe on scaleMetric/scaleTarget, by KEDA, or (deployment backend)
    by a HorizontalPodAutoscaler on the predictor's own per-pod metric."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            {
                "rule": "!has(self.minReplicas) || self.minReplicas <= self.maxReplicas",
                "message": "minReplicas may not exceed maxReplicas",
            },
            {
                "rule": "!has(self.keda) || (!has(self.scaleMetric) && !has(self.scaleTarget))",
                "message": "keda replaces scaleMetric/scaleTarget: give one or the other",
            },
            {
                "rule": "!has(self.podMetric) || (!has(self.keda) && !has(self.scaleMetric) && !has(self.scaleTarget))",
                "message": "podMetric replaces keda and scaleMetric/scaleTarget: give one of them",
            },
        )
    )
    minReplicas: int = Field(default=1, ge=0, le=1000)
    maxReplicas: int = Field(ge=1, le=1000)
    scaleMetric: Literal["concurrency", "rps", "cpu", "memory"] | None = None
    scaleTarget: int | None = Field(default=None, ge=1)
    keda: Keda | None = Field(
        default=None,
        description="KEDA (installed separately) scales on a Prometheus query of the predictor's gauge "
        "clef_queue_depth (requests waiting) or clef_engine_in_flight (requests in the engine), summed over the "
        "pool's pods.",
    )
    podMetric: PodMetric | None = Field(
        default=None,
        description="Deployment backend only: an autoscaling/v2 HorizontalPodAutoscaler on the predictor's gauge "
        "per pod (type Pods, averageValue target) through the custom metrics API; needs a Prometheus scraping "
        "the predictor pods (their prometheus.io/* annotations) and an adapter serving custom.metrics.k8s.io.",
    )
    scaleUpStabilizationSeconds: int | None = Field(
        default=None,
        ge=0,
        le=MAX_WINDOW_S,
        description=f"Deployment backend only: how long the wanted replica count must stay higher before the "
        f"autoscaler adds replicas (the HorizontalPodAutoscaler's behavior.scaleUp.stabilizationWindowSeconds). "
        f"Absent: {DEFAULT_SCALE_UP_WINDOW_S}.",
    )
    scaleDownStabilizationSeconds: int | None = Field(
        default=None,
        ge=0,
        le=MAX_WINDOW_S,
        description=f"Deployment backend only: how long the wanted replica count must stay lower before the "
        f"autoscaler removes replicas (behavior.scaleDown.stabilizationWindowSeconds). Absent: "
        f"{DEFAULT_SCALE_DOWN_WINDOW_S}.",
    )

    @model_validator(mode="after")
    def _bounds(self) -> Autoscaling:
        if self.minReplicas > self.maxReplicas:
            raise ValueError("minReplicas may not exceed maxReplicas")
        if self.keda is not None and (self.scaleMetric is not None or self.scaleTarget is not None):
            raise ValueError("keda replaces scaleMetric/scaleTarget: give one or the other")
        if self.podMetric is not None and (
            self.keda is not None or self.scaleMetric is not None or self.scaleTarget is not None
        ):
            raise ValueError("podMetric replaces keda and scaleMetric/scaleTarget: give one of them")
        return self

    @property
    def deployment_only(self) -> list[str]:
        """The fields set here that only the deployment backend acts on."""
        fields = ("podMetric", "scaleUpStabilizationSeconds", "scaleDownStabilizationSeconds")
        return [name for name in fields if getattr(self, name) is not None]


class ApiKeySecret(_Model):
    """A Secret in the ClefDecision's namespace whose key holds the predictor's API keys (one per line)."""

    name: str = Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    key: str = Field(default="keys", min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")


def _quantity(value: str | int) -> str | int:
    if not re.fullmatch(QUANTITY_PATTERN, str(value)):
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 8, 500m, 64Gi)")
    return value


QUANTITY_SCHEMA: dict[str, Any] = {
    "x-kubernetes-int-or-string": True,
    "anyOf": [{"type": "integer"}, {"type": "string"}],
    "pattern": QUANTITY_PATTERN,
}
Quantity = Annotated[str | int, AfterValidator(_quantity), WithJsonSchema(QUANTITY_SCHEMA)]
# requests and limits, each a map of resource name to quantity.
Resources = Annotated[
    dict[Literal["requests", "limits"], dict[str, Quantity]],
    WithJsonSchema(
        {
            "type": "object",
            "properties": {
                "requests": {
                    "type": "object",
                    "description": "Default when absent: "
                    + ", ".join(f"{name} {value}" for name, value in DEFAULT_REQUESTS.items())
                    + ".",
                    "additionalProperties": QUANTITY_SCHEMA,
                },
                "limits": {"type": "object", "additionalProperties": QUANTITY_SCHEMA},
            },
        }
    ),
]


class StartupBudget(_Model):
    """The startup probe's budget: periodSeconds * failureThreshold covers weight loading and warm-up."""

    periodSeconds: int = Field(default=DEFAULT_STARTUP_PERIOD, ge=1, le=300)
    failureThreshold: int = Field(default=DEFAULT_STARTUP_FAILURES, ge=1, le=10000)


class Predictor(_Model):
    """The predictor container: image, resources, serving limits, extra CLI flags, compile-cache volume."""

    image: str | None = Field(
        default=None, min_length=1, description="Predictor image; default the operator's CLEF_PREDICTOR_IMAGE."
    )
    imagePullPolicy: Literal["Always", "IfNotPresent", "Never"] | None = None
    resources: Resources = Field(
        default_factory=dict,
        description="CPU/memory requests and limits; nvidia.com/gpu is set from gpusPerReplica.",
    )
    maxModelLen: int = Field(
        default=8192, ge=256, le=1_048_576, description="Longest prompt in tokens (--max-model-len)."
    )
    extraArgs: list[Annotated[str, Field(max_length=MAX_ARG_LENGTH)]] = Field(
        default_factory=list,
        max_length=MAX_EXTRA_ARGS,
        description=f"Extra predictor flags (at most {MAX_EXTRA_ARGS} of {MAX_ARG_LENGTH} characters); the flags "
        "the operator sets may not appear.",
        json_schema_extra=ATOMIC
        | cel(
            {
                "rule": f"self.all(a, !{list(MANAGED_FLAGS)}.exists(f, a == f || a.startsWith(f + '=')))",
                "message": f"{', '.join(MANAGED_FLAGS[:-1])} and {MANAGED_FLAGS[-1]} are set by the operator",
            }
        ),
    )
    shmSize: str = Field(
        default=DEFAULT_SHM_SIZE,
        pattern=QUANTITY_PATTERN,
        description="Size of the memory-backed /dev/shm (its pages count against the container's memory limit).",
    )
    startupProbe: StartupBudget = Field(
        default_factory=StartupBudget,
        description=f"Startup budget = periodSeconds x failureThreshold (default {DEFAULT_STARTUP_PERIOD} s x "
        f"{DEFAULT_STARTUP_FAILURES} = {DEFAULT_STARTUP_PERIOD * DEFAULT_STARTUP_FAILURES // 60} min) for weight "
        "loading and warm-up.",
        json_schema_extra={"default": {}},
    )
    # One writable volume source (Kubernetes Volume fields less name), each free-form: the API server refuses
    # any other key (unknown field) and CEL cannot iterate an object of unknown fields.
    compileCache: dict[str, Any] = Field(
        default_factory=lambda: copy.deepcopy(DEFAULT_COMPILE_CACHE),
        description="Volume for vLLM's torch.compile cache and Triton's kernel cache, mounted at /var/cache/clef "
        "(VLLM_CACHE_ROOT, TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR, TRITON_CACHE_AUTOTUNING=1) so that a "
        "restarted predictor reuses compiled kernels. Exactly one writable Kubernetes volume source without a "
        "name, e.g. {persistentVolumeClaim: {claimName: clef-compile-cache}}, {hostPath: {path: /var/cache/clef, "
        "type: DirectoryOrCreate}} or {emptyDir: {sizeLimit: 20Gi}}. Default when absent: {emptyDir: {}} (kept "
        "across container restarts within one pod).",
        json_schema_extra={
            "type": "object",
            "additionalProperties": False,
            "minProperties": 1,
            "maxProperties": 1,
            "properties": {source: free_form() for source in CACHE_VOLUME_SOURCES},
        },
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=MAX_ENV,
        description=f"Extra environment variables of the predictor container (Kubernetes EnvVar objects; at most "
        f"{MAX_ENV}, values up to {MAX_ENV_VALUE} characters).",
        json_schema_extra=ATOMIC,
    )
    envFrom: list[dict[str, Any]] = Field(
        default_factory=list,
        max_length=MAX_ENV_FROM,
        description="ConfigMaps and Secrets whose keys become environment variables (Kubernetes EnvFromSource "
        "objects).",
        json_schema_extra=ATOMIC,
    )
    apiKeySecret: ApiKeySecret | None = Field(
        default=None,
        description="A Secret in this namespace whose key (default keys) holds API keys, one per line: mounted "
        "read-only and passed as --api-key-file; clients send Authorization: Bearer <key>.",
    )

    @field_validator("compileCache")
    @classmethod
    def _one_volume_source(cls, value: dict[str, Any]) -> dict[str, Any]:
        if "name" in value:
            raise ValueError(
                f"name is set by the operator (the volume is always named {COMPILE_CACHE_VOLUME}); "
                "give only the volume source, e.g. {persistentVolumeClaim: {claimName: ...}}"
            )
        if len(value) != 1:
            found = ", ".join(sorted(value)) or "none"
            raise ValueError(
                f"must name exactly one volume source (e.g. persistentVolumeClaim, hostPath, "
                f"emptyDir), found {len(value)}: {found}"
            )
        ((source, settings),) = value.items()
        if source not in CACHE_VOLUME_SOURCES:
            raise ValueError(
                f"{source!r} is not a writable Kubernetes volume source; use one of {', '.join(CACHE_VOLUME_SOURCES)}"
            )
        if not isinstance(settings, dict):  # pydantic turns ValueError, not TypeError, into a field error
            raise ValueError(f"{source} must be an object (e.g. {{}}), not {type(settings).__name__}")
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

    model_config = ConfigDict(
        json_schema_extra=cel(
            {
                "rule": "!has(self.model.storageUri) || self.quantization == 'bf16' || "
                "double(self.minComputeCapability) >= (self.quantization == 'nvfp4' ? 10.0 : 8.9)",
                "message": "fp8 needs minComputeCapability >= 8.9 (Ada, Hopper, Blackwell), nvfp4 >= 10.0 "
                "(Blackwell); use quantization: bf16 for older GPUs",
                "fieldPath": ".minComputeCapability",
            },
            {
                "rule": "!has(self.poolOverrides) || !has(self.nodePools.exclude) || "
                "self.poolOverrides.all(o, !(o.name in self.nodePools.exclude))",
                "message": "poolOverrides names a pool that nodePools.exclude excludes",
                "fieldPath": ".poolOverrides",
            },
            {
                "rule": "!has(self.backend) || self.backend != 'kserve' || !has(self.autoscaling) || "
                "(!has(self.autoscaling.podMetric) && !has(self.autoscaling.scaleUpStabilizationSeconds) && "
                "!has(self.autoscaling.scaleDownStabilizationSeconds))",
                "message": KSERVE_REFUSES_DEPLOYMENT_SCALING,
                "fieldPath": ".autoscaling",
            },
        )
    )
    model: ModelSource
    quantization: Quantization = Field(
        default="fp8",
        description="The format of model.storageUri's release. fp8 (compressed-tensors) needs compute capability "
        "8.9+, nvfp4 10.0+; bf16 runs on older GPUs.",
    )
    minComputeCapability: str = Field(
        default="8.9",
        pattern=CAPABILITY_PATTERN,
        description="Smallest NVIDIA compute capability a pool's GPUs must report "
        "(nvidia.com/gpu.compute.major/minor).",
    )
    allowUnverifiedPools: bool = Field(
        default=False,
        description="Serve on GPU pools whose nodes lack GPU Feature Discovery compute-capability labels.",
    )
    nodePools: NodePoolSelection = Field(default_factory=NodePoolSelection, json_schema_extra={"default": {}})
    replicas: int = Field(default=1, ge=1, le=1000, description="Predictor replicas per pool (overridable per pool).")
    gpusPerReplica: int = Field(
        default=1,
        ge=1,
        le=16,
        description="GPUs per predictor replica; the predictor runs one data-parallel engine per GPU (--dp).",
    )
    poolOverrides: list[PoolOverride] = Field(default_factory=list, max_length=256, json_schema_extra=list_map("name"))
    tolerations: list[Toleration] = Field(
        default_factory=list,
        max_length=MAX_TOLERATIONS,
        description="Tolerations for the predictor pods (e.g. nvidia.com/gpu taints).",
        json_schema_extra=ATOMIC,
    )
    autoscaling: Autoscaling | None = Field(
        default=None,
        description="Replicas per pool between minReplicas and maxReplicas (instead of replicas), scaled by KServe "
        "on scaleMetric/scaleTarget or by KEDA on the predictor's own metrics.",
    )
    affinity: dict[str, Any] = Field(
        default_factory=dict,
        description="Pod affinity, anti-affinity and preferred node affinity for the predictor pods. Required node "
        "affinity is the operator's (pool and compute capability).",
        # Declared (still free-form) so that the CEL rule compiles: CEL cannot name fields of an object that only
        # preserves unknown fields.
        json_schema_extra=free_form(
            properties={
                "nodeAffinity": free_form(properties={"requiredDuringSchedulingIgnoredDuringExecution": free_form()})
            },
            **cel(
                {
                    "rule": "!has(self.nodeAffinity) || "
                    "!has(self.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution)",
                    "message": "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution is set by the "
                    "operator",
                }
            ),
        ),
    )
    serviceAccountName: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="The predictor pods' ServiceAccount (e.g. one carrying s3://, gs:// or hf:// credentials for "
        "KServe's storage initializer).",
    )
    imagePullSecrets: list[PullSecret] = Field(
        default_factory=list, max_length=MAX_PULL_SECRETS, json_schema_extra=ATOMIC
    )
    priorityClassName: str | None = Field(default=None, min_length=1, max_length=253)
    predictor: Predictor = Field(default_factory=Predictor, json_schema_extra={"default": {}})
    deploymentMode: Literal["Standard", "Knative"] = Field(
        default="Standard", description="KServe deployment mode (serving.kserve.io/deploymentMode)."
    )
    # None: the operator's default (--default-backend; auto: kserve where the InferenceService CRD is served).
    backend: Literal["kserve", "deployment"] | None = Field(
        default=None,
        description="What serves each pool: a KServe InferenceService (kserve) or a Deployment, Service and "
        "(autoscaled) HorizontalPodAutoscaler or, with autoscaling.keda, KEDA ScaledObject (deployment). Absent: "
        "the operator's default (--default-backend; auto: kserve where the cluster serves InferenceServices, else "
        "deployment, decided once and kept in status.backend). Changing it replaces every pool's objects.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> ClefDecisionSpec:
        floor = QUANTIZATION_FLOOR[self.quantization]
        if self.model.storageUri is not None and parse_capability(self.minComputeCapability) < floor:
            raise ValueError(
                f"minComputeCapability must be at least {floor[0]}.{floor[1]} when quantization is {self.quantization}"
            )
        names = [override.name for override in self.poolOverrides]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"poolOverrides lists a pool more than once: {', '.join(duplicates)}")
        excluded = sorted(set(names) & set(self.nodePools.exclude))
        if excluded:
            raise ValueError(f"poolOverrides names a pool that nodePools.exclude excludes: {', '.join(excluded)}")
        if self.backend == "kserve" and self.autoscaling is not None and self.autoscaling.deployment_only:
            raise ValueError(KSERVE_REFUSES_DEPLOYMENT_SCALING)
        if "requiredDuringSchedulingIgnoredDuringExecution" in (self.affinity.get("nodeAffinity") or {}):
            raise ValueError(
                "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution is set by the "
                "operator (pool and compute capability); use preferred node affinity or pod affinity"
            )
        return self

    @property
    def variants(self) -> list[Variant]:
        """The releases to choose from, best format first (one, from storageUri, for a single-release spec)."""
        if self.model.storageUri is not None:
            return [
                Variant(
                    quantization=self.quantization,
                    storageUri=self.model.storageUri,
                    minComputeCapability=self.minComputeCapability,
                )
            ]
        return sorted(self.model.variants, key=lambda variant: QUANTIZATIONS.index(variant.quantization))

    @property
    def min_capability(self) -> tuple[int, int]:
        """The smallest compute capability any variant runs on, as (major, minor)."""
        return min(variant.min_capability for variant in self.variants)

    def best_variant(self, capability: tuple[int, int] | None) -> Variant | None:
        """The best release a GPU of ``capability`` runs (unknown capability: the most tolerant one)."""
        if capability is None:
            return min(self.variants, key=lambda variant: variant.min_capability)
        return next((variant for variant in self.variants if variant.min_capability <= capability), None)

    def replicas_for(self, pool: str) -> tuple[int, int]:
        """(minReplicas, maxReplicas) for a pool: its override, else autoscaling, else replicas for both."""
        override = self._override(pool)
        if override and override.replicas is not None:
            return override.replicas, override.replicas
        low, high = (
            (self.autoscaling.minReplicas, self.autoscaling.maxReplicas)
            if self.autoscaling
            else (self.replicas, self.replicas)
        )
        if override and override.minReplicas is not None:
            low = override.minReplicas
        if override and override.maxReplicas is not None:
            high = override.maxReplicas
        return low, max(low, high)

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


def parse_duration(text: str) -> float:
    """Seconds in a duration such as ``10m``, ``90s`` or ``1h30m``."""
    match = re.fullmatch(DURATION_PATTERN, text)
    if not text or match is None:
        raise ValueError(f"duration {text!r} is not of the form 1h30m10s")
    hours, minutes, seconds = (int(part[:-1]) if part else 0 for part in match.groups())
    return float(hours * 3600 + minutes * 60 + seconds)


def check_host_path(spec: ClefDecisionSpec, allowed_prefixes: tuple[str, ...]) -> None:
    """Refuse a hostPath compile cache outside the operator's allow-listed prefixes (none: hostPath is off)."""
    host_path = spec.predictor.compileCache.get("hostPath")
    if host_path is None:
        return
    where = "spec.predictor.compileCache.hostPath.path"
    path = str(host_path.get("path", ""))
    if not allowed_prefixes:
        raise InvalidSpecError(
            f"{where}: hostPath compile caches are disabled on this operator "
            "(the chart's operator.hostPathCachePrefixes enables them under given folders)"
        )
    normal = os.path.normpath(path)
    if not path.startswith("/") or not any(
        normal == prefix.rstrip("/") or normal.startswith(prefix.rstrip("/") + "/") for prefix in allowed_prefixes
    ):
        raise InvalidSpecError(f"{where}: {path!r} is not under an allowed prefix ({', '.join(allowed_prefixes)})")


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
