"""A thin test-side subclass of kmock's KubernetesEmulator that kopf and kubectl can work against.

It adds what the bare emulator lacks: server-set metadata (uid, resourceVersion, generation,
creationTimestamp, names from generateName), 422 for a failed JSON-patch ``test``,
status-subresource isolation, ``kind: XList`` on lists, label selectors on lists, a correct core ``/api/v1`` discovery,
discovery entries from CRD manifests, and background garbage collection of owner-referenced objects. It also
maps every request it served to the RBAC (apiGroup, resource, verb) it needs, for comparing with the chart's
RBAC.
"""

from __future__ import annotations

import datetime
import itertools
import json
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import jsonpatch
import kmock
from kmock._internal import enums, references, rendering

# A real API server's limits: all annotations of an object together (key + value bytes), and what etcd stores.
MAX_ANNOTATIONS_BYTES = 256 * 1024
MAX_OBJECT_BYTES = 1_572_864
_CUT = "CUT"  # a bus item that ends watch streams (never sent to a client)
_DISCOVERY_PREFIXES = ("/api", "/apis", "/version", "/openapi", "/healthz")


@attrs.define(kw_only=True)
class ClusterEmulator(kmock.KubernetesEmulator):
    """KubernetesEmulator plus the server-side behaviour kopf relies on."""

    _versions: Iterable[int] = attrs.field(factory=lambda: itertools.count(1), init=False)
    # Injected refusals: (METHOD, resource plural, object name) -> (HTTP status, message), as a quota or an
    # admission webhook would answer (the emulator has neither).
    refusals: dict[tuple[str, str, str], tuple[int, str]] = attrs.field(factory=dict, init=False)
    # An API outage: every request but the test's own is answered 503 while it is True (start_outage also
    # ends the open watch streams, as an API server going away does).
    outage: bool = attrs.field(default=False, init=False)
    # Every request served, in arrival order. kmock keeps only the requests still in flight in its own list
    # (``_requests``): it finds a request's reaction by scanning that list once per reaction (a cost that grows
    # with every request served: 70 % of the 50-pool scale test's CPU), and a request needs to be there only
    # until its reaction is found.
    history: list[rendering.Request] = attrs.field(factory=list, init=False)

    async def watch_error(self, plural: str, code: int, message: str = "injected") -> None:
        """Send an ERROR event (a Status with ``code``) on every open watch stream of ``plural``."""
        status = {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "code": code,
            "reason": "InternalError" if code >= 500 else "Expired",
            "message": message,
        }
        for resource, bus in list(self._buses.items()):
            if resource.plural == plural:
                await bus.put({"type": "ERROR", "object": status})

    async def start_outage(self) -> None:
        """Answer 503 to everything the operator sends and end its open watch streams (EOF)."""
        self.outage = True
        for bus in list(self._buses.values()):
            await bus.put({"type": _CUT})

    def end_outage(self) -> None:
        """Answer again."""
        self.outage = False

    def add_crd(self, crd: Mapping[str, Any]) -> None:
        """Serve a CustomResourceDefinition's versions in discovery (as if the API server registered it)."""
        spec = crd["spec"]
        names = spec["names"]
        for version in spec["versions"]:
            info = self.resources[f"{spec['group']}/{version['name']}/{names['plural']}"]
            info.kind = names["kind"]
            info.singular = names.get("singular", names["kind"].lower())
            info.namespaced = spec["scope"] == "Namespaced"
            info.verbs = {"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}
            info.shortnames = set(names.get("shortNames", []))
            info.categories = set(names.get("categories", []))
            info.subresources = set((version.get("subresources") or {}).keys())

    def served_requests(self) -> list[tuple[str, str]]:
        """Every request served so far as (METHOD, path?query)."""
        return [(str(r.method.value), str(r.url.path_qs)) for r in self.history]

    def operator_writes(
        self, plural: str, *, exclude_user_agents: tuple[str, ...] = ("kmock/",)
    ) -> list[tuple[str, str]]:
        """(METHOD, object name) of each write to ``plural`` the operator (not the test) sent, in order."""
        writes = []
        for r in self.history:
            if r.headers.get("User-Agent", "").startswith(exclude_user_agents) or r.resource is None:
                continue
            method = str(r.method.value)
            if r.resource.plural == plural and method in ("POST", "PATCH", "PUT", "DELETE") and r.subresource is None:
                name = r.name
                if name is None and isinstance(r.data, dict):
                    name = (r.data.get("metadata") or {}).get("name")
                writes.append((method, str(name or "")))
        return writes

    def all_operator_writes(self, *, exclude_user_agents: tuple[str, ...] = ("kmock/",)) -> list[tuple[str, str]]:
        """(METHOD, path) of every write the operator (not the test) sent, to any resource or subresource."""
        return [
            (str(r.method.value), str(r.url.path))
            for r in self.history
            if not r.headers.get("User-Agent", "").startswith(exclude_user_agents)
            and str(r.method.value) in ("POST", "PATCH", "PUT", "DELETE")
        ]

    def rbac_requests(self, *, exclude_user_agents: tuple[str, ...] = ("kmock/",)) -> set[tuple[str, str, str]]:
        """The (apiGroup, resource[/subresource], verb) triples the served requests need.

        Requests from the test's own client (kmock's User-Agent) are left out by default.
        """
        return rbac_triples(
            r for r in self.history if not r.headers.get("User-Agent", "").startswith(exclude_user_agents)
        )

    async def _serve_watch(self, request: rendering.Request) -> Any:
        async for event in super()._serve_watch(request):
            if isinstance(event, dict) and event.get("type") == _CUT:
                return
            yield event

    async def _handle(self, request: rendering.Request) -> Any:
        self.history.append(request)
        try:
            return await self._handle_in_flight(request)
        finally:
            for index, pending in enumerate(self._requests):
                if pending is request:  # by identity: an identical request may still be finding its reaction
                    del self._requests[index]
                    break

    async def _handle_in_flight(self, request: rendering.Request) -> Any:
        if self.outage and not request.headers.get("User-Agent", "").startswith("kmock/"):
            raise kmock.KubernetesError(status=503, reason="ServiceUnavailable", message="the API is down")
        if request.resource is not None and request.resource.plural:
            name = request.name or (
                ((request.data or {}).get("metadata") or {}).get("name") if isinstance(request.data, dict) else None
            )
            refusal = self.refusals.get((str(request.method.value), request.resource.plural, str(name)))
            if refusal is not None:
                raise kmock.KubernetesError(status=refusal[0], reason="Refused", message=refusal[1])
        if request.resource is not None and request.action is not None:
            async with self._lock:
                self._prepare(request)
        response = await super()._handle(request)
        if request.resource is not None and request.action in (enums.action.DELETE, enums.action.UPDATE):
            await self._collect_garbage()
        return response

    def _prepare(self, request: rendering.Request) -> None:
        """Stamp server-set metadata into the request's payload and enforce JSON-patch tests."""
        now = datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
        version = str(next(self._versions))  # type: ignore[call-overload]
        data = request.data
        if request.action == enums.action.CREATE and isinstance(data, dict):
            _check_limits(data)
            meta = data.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = f"{meta['generateName']}{uuid.uuid4().hex[:5]}"
            meta.update(uid=str(uuid.uuid4()), resourceVersion=version, creationTimestamp=now, generation=1)
            return
        if request.action != enums.action.UPDATE or request.name is None:
            return
        key = (request.resource, request.namespace, request.name)
        current = self._objects[key] if key in self._objects else None  # noqa: SIM401 (kmock's ObjectsArray: no get())
        if current is None or current.deleted:
            return
        raw = current.raw
        generation = int(raw.get("metadata", {}).get("generation", 1))
        has_status = "status" in self._subresources(request.resource)
        if isinstance(data, list):
            try:
                _check_limits(jsonpatch.apply_patch(raw, data, in_place=False))
            except (jsonpatch.JsonPatchTestFailed, jsonpatch.JsonPatchConflict) as exc:
                message = f"testing value failed: test failed: {exc}"
                raise kmock.KubernetesError(status=422, reason="Invalid", message=message) from None
            if request.subresource is None and any(op.get("path", "").startswith("/spec") for op in data):
                data.append({"op": "add", "path": "/metadata/generation", "value": generation + 1})
            data.append({"op": "add", "path": "/metadata/resourceVersion", "value": version})
        elif isinstance(data, dict):
            _check_limits(_merged(raw, data))
            if request.subresource == "status":
                for field in [k for k in data if k != "status"]:
                    del data[field]
            elif has_status:
                data.pop("status", None)
            if request.subresource is None and "spec" in data and data["spec"] != raw.get("spec"):
                data.setdefault("metadata", {})["generation"] = generation + 1
            data.setdefault("metadata", {})["resourceVersion"] = version

    def _subresources(self, resource: references.resource) -> set[str]:
        for known in self.resources:
            if known == resource:
                return set(self.resources[known].subresources)
        return set()

    async def _collect_garbage(self) -> None:
        """Delete (or mark for deletion) objects whose every owner is gone, like the background GC."""
        async with self._lock:
            live = {obj.raw["metadata"].get("uid") for obj in self._objects.values() if not obj.deleted}
            for (resource, _, _), obj in list(self._objects.items()):
                if obj.deleted:
                    continue
                owners = obj.raw.get("metadata", {}).get("ownerReferences") or []
                if not owners or any(ref.get("uid") in live for ref in owners):
                    continue
                if obj.raw["metadata"].get("finalizers"):
                    if not obj.raw["metadata"].get("deletionTimestamp"):
                        obj.patch({"metadata": {"deletionTimestamp": datetime.datetime.now(datetime.UTC).isoformat()}})
                        await self._buses[resource].put({"type": "MODIFIED", "object": obj.raw})
                    continue
                raw = obj.raw
                obj.delete()
                await self._buses[resource].put({"type": "DELETED", "object": raw})

    async def _serve_version(self, request: rendering.Request) -> rendering.Payload:
        payload = await super()._serve_version(request)
        if isinstance(payload, dict) and str(payload.get("groupVersion", "")).startswith("/"):
            payload["groupVersion"] = payload["groupVersion"].lstrip("/")
        return payload

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        payload = await super()._serve_list(request)
        assert request.resource is not None
        info = next((self.resources[r] for r in self.resources if r == request.resource), None)
        if isinstance(payload, dict) and info is not None and info.kind:
            group_version = "/".join(p for p in (request.resource.group, request.resource.version) if p)
            payload.update(kind=f"{info.kind}List", apiVersion=group_version)
            payload["metadata"] = {"resourceVersion": str(next(self._versions))}  # type: ignore[call-overload]
        selector = request.params.get("labelSelector")
        if selector and isinstance(payload, dict):
            payload["items"] = [item for item in payload.get("items", []) if _selected(item, selector)]
        return payload


def _selected(obj: Mapping[str, Any], selector: str) -> bool:
    """Whether ``obj``'s labels match an equality-based label selector (``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``,
    comma-separated), as the API server applies it to a list; set-based terms are refused, not guessed."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in selector.split(","):
        term = term.strip()
        if " in " in term or " notin " in term or "(" in term:
            raise NotImplementedError(f"set-based label selector {term!r}")
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _merged(target: Any, patch: Any) -> Any:
    """A JSON merge patch (RFC 7386) applied to a copy of ``target``."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merged(result.get(key), value)
    return result


def _check_limits(obj: Mapping[str, Any]) -> None:
    """Refuse what a real API server refuses: annotations over 256 KiB, objects over etcd's 1.5 MiB."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    size = sum(len(str(key).encode()) + len(str(value).encode()) for key, value in annotations.items())
    if size > MAX_ANNOTATIONS_BYTES:
        raise kmock.KubernetesError(
            status=422,
            reason="Invalid",
            message=(f"metadata.annotations: Too long: must have at most {MAX_ANNOTATIONS_BYTES} bytes"),
        )
    if len(json.dumps(obj, separators=(",", ":")).encode()) > MAX_OBJECT_BYTES:
        raise kmock.KubernetesError(status=500, reason="InternalError", message="etcdserver: request is too large")


_VERBS = {"POST": "create", "PATCH": "patch", "PUT": "update"}


def rbac_triples(requests: Iterable[rendering.Request]) -> set[tuple[str, str, str]]:
    """Map API requests to the (apiGroup, resource[/subresource], verb) each needs in RBAC terms.

    Discovery and other non-resource paths (/api, /apis, /version) are left out: every
    authenticated user may read them (the built-in ``system:discovery`` role).
    """
    triples: set[tuple[str, str, str]] = set()
    for request in requests:
        if request.resource is None or not request.resource.plural:
            continue
        method = str(request.method.value)
        if method == "GET":
            verb = "watch" if request.params.get("watch") in ("true", "1") else "get" if request.name else "list"
        elif method == "DELETE":
            verb = "delete" if request.name else "deletecollection"
        elif method in _VERBS:
            verb = _VERBS[method]
        else:
            continue
        plural = request.resource.plural
        resource = f"{plural}/{request.subresource}" if request.subresource else plural
        triples.add((request.resource.group or "", resource, verb))
    return triples
