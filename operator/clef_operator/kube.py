"""The few Kubernetes API calls the operator makes itself (kopf makes the watching ones).

Calls go through the official ``kubernetes`` client, run in threads so that the event loop stays free.
The same client configuration feeds kopf's login, so both use one set of credentials.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import kopf
import kubernetes.client
import kubernetes.config
import urllib3
from kubernetes.client.exceptions import ApiException

from clef_operator.constants import DECISION_LABEL, GROUP, PLURAL, VERSION
from clef_operator.resources import Resource

CRDS_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class ConflictError(RuntimeError):
    """A write lost a race (409 Conflict or a failed resourceVersion test); retry the reconciliation."""


def load_configuration() -> kubernetes.client.Configuration:
    """Client configuration from the pod's service account, else from $KUBECONFIG or ~/.kube/config."""
    configuration = kubernetes.client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    else:
        path = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or os.path.expanduser("~/.kube/config")
        kubernetes.config.load_kube_config(config_file=path, client_configuration=configuration)
    return configuration


def connection_info(configuration: kubernetes.client.Configuration) -> kopf.ConnectionInfo:
    """The same credentials in the form kopf's login handlers return."""
    header = configuration.get_api_key_with_prefix("BearerToken") or configuration.get_api_key_with_prefix(
        "authorization"
    )
    parts = header.split(" ", 1) if header else []
    scheme, token = (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1])
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        username=configuration.username or None,
        password=configuration.password or None,
        scheme=scheme,
        token=token,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
    )


class ApiError(RuntimeError):
    """A write the API server refused (quota, admission webhook, permissions) or could not answer in time."""

    def __init__(self, action: str, code: int | None, reason: str) -> None:
        super().__init__(f"{action} failed: {f'{code} ' if code else ''}{reason}")
        self.code = code


# Every call the operator makes gives up after this long (connect, read) in seconds; it holds the
# ClefDecision's lock meanwhile, so a hung API server must not hold it for ever.
REQUEST_TIMEOUT: tuple[float, float] = (10.0, 30.0)


class KubeApi:
    """Calls on the objects the operator writes and on ClefDecision statuses, async over the official client."""

    def __init__(self, configuration: kubernetes.client.Configuration) -> None:
        self._client = kubernetes.client.ApiClient(configuration)
        self._custom = kubernetes.client.CustomObjectsApi(self._client)

    async def _call(self, action: str, method: Any, *args: Any, **kwargs: Any) -> Any:
        """One client call in a thread, bounded by REQUEST_TIMEOUT; transport failures become ApiError."""
        try:
            return await asyncio.to_thread(method, *args, _request_timeout=REQUEST_TIMEOUT, **kwargs)
        except ApiException:
            raise
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiError(action, None, f"{type(exc).__name__}: {exc}") from exc

    def _send(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str | None = None,
        _request_timeout: tuple[float, float] = REQUEST_TIMEOUT,
    ) -> Any:
        """One request through the client's public request API; the decoded JSON answer (ApiException on a
        non-2xx answer)."""
        headers = {"Accept": "application/json"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        request = self._client.param_serialize(
            method=method,
            resource_path=path,
            query_params=list(query),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self._client.call_api(*request, _request_timeout=_request_timeout)
        response.read()
        return self._client.response_deserialize(response, {"2XX": "object"}).data

    async def served(self, resource: Resource) -> bool:
        """Whether the API server serves a custom ``resource``: API discovery lists it. Not served only when
        discovery does not list it and no CustomResourceDefinition of that name exists either (an API server
        that has just started may leave a CRD's group out of discovery for a moment); ApiError when it cannot
        tell now."""
        action = f"discovering {resource.group_path}"
        try:
            found = await self._call(action, self._send, "GET", resource.group_path)
        except ApiException as exc:
            if exc.status != 404:
                raise ApiError(action, exc.status, _reason(exc)) from exc
            found = None
        if any(item.get("name") == resource.plural for item in (found or {}).get("resources") or []):
            return True
        crd = f"{resource.plural}.{resource.group}"
        try:
            crds = await self._call(
                action, self._send, "GET", CRDS_PATH, query=[("fieldSelector", f"metadata.name={crd}")]
            )
        except ApiException as exc:
            raise ApiError(action, exc.status, _reason(exc)) from exc
        if any(item["metadata"]["name"] == crd for item in crds.get("items") or []):
            raise ApiError(action, None, f"the CustomResourceDefinition {crd} exists but discovery does not list it")
        return False

    async def list_labelled(
        self, resource: Resource, namespace: str, decision_label: str
    ) -> list[dict[str, Any]] | None:
        """Objects in ``namespace`` labelled as belonging to a ClefDecision; None when ``resource`` is not served.

        The API server filters by the label; the items are checked again here, because callers delete what this
        returns and has no owner (an owner reference stripped): an answer that ignored the selector (a caching proxy,
        an emulator) must not turn someone else's object into one of ours."""
        action = f"listing {resource.plural}"
        try:
            result = await self._call(
                action,
                self._send,
                "GET",
                resource.path(namespace),
                query=[("labelSelector", f"{DECISION_LABEL}={decision_label}")],
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise ApiError(action, exc.status, _reason(exc)) from exc
        return [
            item
            for item in result.get("items", [])
            if ((item.get("metadata") or {}).get("labels") or {}).get(DECISION_LABEL) == decision_label
        ]

    async def get(self, resource: Resource, namespace: str, name: str) -> dict[str, Any] | None:
        """One object, or None when there is none of that name."""
        try:
            found: dict[str, Any] = await self._call(
                f"reading {name}", self._send, "GET", resource.path(namespace, name)
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise ApiError(f"reading {name}", exc.status, _reason(exc)) from exc
        return found

    async def create(self, resource: Resource, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create an object; ConflictError when the name is taken, ApiError when refused. A 404 is an ApiError
        with the API server's message: the namespace was deleted meanwhile, or the kind stopped being served
        since the pass listed it (the next pass reports KServe missing)."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            created: dict[str, Any] = await self._call(
                f"creating {name}", self._send, "POST", resource.path(namespace), body=dict(body)
            )
        except ApiException as exc:
            _raise_translated(exc)
            raise ApiError(f"creating {name}", exc.status, _reason(exc)) from exc
        return created

    async def patch(
        self, resource: Resource, namespace: str, name: str, ops: Sequence[Mapping[str, Any]]
    ) -> dict[str, Any]:
        """Apply a JSON patch to an object; ConflictError when its resourceVersion moved or it is gone."""
        try:
            patched: dict[str, Any] = await self._call(
                f"updating {name}",
                self._send,
                "PATCH",
                resource.path(namespace, name),
                body=list(ops),
                content_type=JSON_PATCH,
            )
        except ApiException as exc:
            if exc.status == 404:
                raise ConflictError(f"{name} is gone") from exc
            _raise_translated(exc)
            raise ApiError(f"updating {name}", exc.status, _reason(exc)) from exc
        return patched

    async def delete(self, resource: Resource, namespace: str, name: str) -> None:
        """Delete an object, its dependents in the background (already gone is fine)."""
        try:
            await self._call(
                f"deleting {name}",
                self._send,
                "DELETE",
                resource.path(namespace, name),
                query=[("propagationPolicy", "Background")],
            )
        except ApiException as exc:
            if exc.status != 404:
                raise ApiError(f"deleting {name}", exc.status, _reason(exc)) from exc

    async def patch_decision_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """Merge-patch a ClefDecision's status subresource (a deleted ClefDecision is ignored)."""
        try:
            await self._call(
                f"writing the status of {name}",
                self._custom.patch_namespaced_custom_object_status,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                {"status": dict(status)},
                _content_type=MERGE_PATCH,
            )
        except ApiException as exc:
            if exc.status != 404:
                raise ApiError(f"writing the status of {name}", exc.status, _reason(exc)) from exc


def _reason(exc: ApiException) -> str:
    """The API server's message (its Status body), else the HTTP reason."""
    try:
        message = json.loads(exc.body or "{}").get("message")
    except (TypeError, ValueError):
        message = None
    return str(message or exc.reason or "unknown error")


def _raise_translated(exc: ApiException) -> None:
    """Turn races (409, a failed resourceVersion test) into ConflictError; leave the rest as is."""
    body = str(exc.body or "").lower()
    lost_race = exc.status == 409 or (exc.status == 422 and "test failed" in body)
    if lost_race:
        raise ConflictError(f"{exc.status} {exc.reason}") from exc
