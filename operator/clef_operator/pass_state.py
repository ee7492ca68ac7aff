"""What one reconciliation pass shares with its writes: the operator's Policy, the pass's state, its Events.

Also which resources each backend writes per pool, and the one mark of ownership (the controller ownerReference).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from clef_operator.constants import AUTO_BACKEND, DEPLOYMENT_BACKEND, KSERVE_BACKEND
from clef_operator.deployment_backend import DEFAULT_STORAGE_INITIALIZER_IMAGE
from clef_operator.kube import KubeApi
from clef_operator.pools import PoolDecision
from clef_operator.resources import (
    DEPLOYMENTS,
    HORIZONTAL_POD_AUTOSCALERS,
    INFERENCESERVICES,
    SCALED_OBJECTS,
    SERVICES,
    Resource,
)
from clef_operator.spec import ClefDecisionSpec
from clef_operator.status import build_pool_status

Adopter = Callable[[dict[str, Any]], None]
# Each backend's object per pool, and the objects that go with it (same name, same owner).
PRIMARY: dict[str, Resource] = {KSERVE_BACKEND: INFERENCESERVICES, DEPLOYMENT_BACKEND: DEPLOYMENTS}
COMPANIONS: dict[str, tuple[Resource, ...]] = {
    KSERVE_BACKEND: (),
    DEPLOYMENT_BACKEND: (SERVICES, HORIZONTAL_POD_AUTOSCALERS, SCALED_OBJECTS),
}


@dataclass(frozen=True)
class Policy:
    """What the operator's own command line allows every ClefDecision."""

    host_path_prefixes: tuple[str, ...] = ()
    default_backend: str = AUTO_BACKEND  # for ClefDecisions without spec.backend
    storage_initializer_image: str = DEFAULT_STORAGE_INITIALIZER_IMAGE  # the deployment backend's release fetcher


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the ClefDecision."""

    type: str  # "Normal" or "Warning"
    reason: str
    message: str


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether the ClefDecision of ``uid`` is the object's controller: the one mark of ownership (its labels and
    annotations are copies that a hand edit may change, and that the repair patch puts back)."""
    return any(
        ref.get("uid") == uid and ref.get("controller") is True
        for ref in (obj.get("metadata") or {}).get("ownerReferences") or []
    )


def orphaned(obj: Mapping[str, Any]) -> bool:
    """Labelled as this ClefDecision's (it was listed by that label) but without any owner: its owner
    reference was stripped. Adopted back by the repair patch, so that it never outlives the ClefDecision."""
    return not (obj.get("metadata") or {}).get("ownerReferences")


@dataclass
class Pass:
    """The state of one reconciliation pass."""

    api: KubeApi
    name: str
    namespace: str
    uid: str
    spec: ClefDecisionSpec
    adopt: Adopter
    now: datetime.datetime
    previous: Mapping[tuple[str, str], Mapping[str, Any]]
    backend: str = KSERVE_BACKEND
    policy: Policy = field(default_factory=lambda: Policy())
    held: frozenset[str] = frozenset()
    # The chosen backend's companion objects owned by the ClefDecision, by resource and name.
    companions: dict[Resource, dict[str, dict[str, Any]]] = field(default_factory=dict)
    kept: set[str] = field(default_factory=set)  # names of the pools' primary objects that stay
    events: list[Event] = field(default_factory=list)
    requeue: list[float] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    failed: bool = False
    keda_served: bool | None = None  # whether the API server serves KEDA's ScaledObjects (asked once, when needed)

    def warn_once(self, key: tuple[str, str], entry: Mapping[str, Any], reason: str, message: str) -> None:
        """A Warning event, unless the previous status already reported the same message for the pool."""
        if (self.previous.get(key) or {}).get("predictorMessage") != entry.get("predictorMessage"):
            self.events.append(Event("Warning", reason, message))

    @property
    def primary(self) -> Resource:
        """The resource of each pool's predictor object in the chosen backend."""
        return PRIMARY[self.backend]

    def pool_status(self, decision: PoolDecision, **fields: Any) -> dict[str, Any]:
        """build_pool_status for this pass's backend."""
        return build_pool_status(decision, backend=self.backend, **fields)
