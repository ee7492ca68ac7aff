"""The API resources the operator writes, as (group, version, plural, kind), with their URL paths."""

from __future__ import annotations

from dataclasses import dataclass

from clef_operator.constants import KSERVE_GROUP, KSERVE_PLURAL, KSERVE_VERSION


@dataclass(frozen=True)
class Resource:
    """One namespaced API resource."""

    group: str  # "" for the core group
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        """``group/version`` (``version`` alone for the core group), as objects carry it."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_path(self) -> str:
        """The API group's discovery path: ``/apis/<group>/<version>`` (``/api/v1`` for the core group)."""
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def path(self, namespace: str, name: str | None = None) -> str:
        """The collection's path in ``namespace``, or one object's."""
        collection = f"{self.group_path}/namespaces/{namespace}/{self.plural}"
        return f"{collection}/{name}" if name else collection


INFERENCESERVICES = Resource(KSERVE_GROUP, KSERVE_VERSION, KSERVE_PLURAL, "InferenceService")
DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment")
SERVICES = Resource("", "v1", "services", "Service")
HORIZONTAL_POD_AUTOSCALERS = Resource("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler")
SCALED_OBJECTS = Resource("keda.sh", "v1alpha1", "scaledobjects", "ScaledObject")  # KEDA's, when installed
