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

from clef_operator.constants import (
    DECISION_LABEL,
    GROUP,
    KSERVE_GROUP,
    KSERVE_PLURAL,
    KSERVE_VERSION,
    PLURAL,
    VERSION,
)

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class KServeNotInstalledError(RuntimeError):
    """The cluster does not serve serving.kserve.io/v1beta1 InferenceServices."""


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
    """InferenceService and ClefDecision-status calls, async over the synchronous official client."""

    def __init__(self, configuration: kubernetes.client.Configuration) -> None:
        self._custom = kubernetes.client.CustomObjectsApi(kubernetes.client.ApiClient(configuration))

    async def _call(self, action: str, method: Any, *args: Any, **kwargs: Any) -> Any:
        """One client call in a thread, bounded by REQUEST_TIMEOUT; transport failures become ApiError."""
        try:
            return await asyncio.to_thread(method, *args, _request_timeout=REQUEST_TIMEOUT, **kwargs)
        except ApiException:
            raise
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiError(action, None, f"{type(exc).__name__}: {exc}") from exc

    async def list_inferenceservices(self, namespace: str, decision_label: str) -> list[dict[str, Any]]:
        """InferenceServices in ``namespace`` labelled as belonging to a ClefDecision."""
        try:
            result = await self._call(
                "listing InferenceServices",
                self._custom.list_namespaced_custom_object,
                KSERVE_GROUP,
                KSERVE_VERSION,
                namespace,
                KSERVE_PLURAL,
                label_selector=f"{DECISION_LABEL}={decision_label}",
            )
        except ApiException as exc:
            if exc.status == 404:
                raise KServeNotInstalledError(str(exc.reason)) from exc
            raise ApiError("listing InferenceServices", exc.status, _reason(exc)) from exc
        return list(result.get("items", []))

    async def get_inferenceservice(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One InferenceService, or None when there is none of that name."""
        try:
            return await self._call(
                f"reading {name}",
                self._custom.get_namespaced_custom_object,
                KSERVE_GROUP,
                KSERVE_VERSION,
                namespace,
                KSERVE_PLURAL,
                name,
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise ApiError(f"reading {name}", exc.status, _reason(exc)) from exc

    async def create_inferenceservice(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create an InferenceService; ConflictError when the name is taken, ApiError when refused."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            return await self._call(
                f"creating {name}",
                self._custom.create_namespaced_custom_object,
                KSERVE_GROUP,
                KSERVE_VERSION,
                namespace,
                KSERVE_PLURAL,
                dict(body),
            )
        except ApiException as exc:
            _raise_translated(exc, not_found=KServeNotInstalledError)
            raise ApiError(f"creating {name}", exc.status, _reason(exc)) from exc

    async def patch_inferenceservice(
        self, namespace: str, name: str, ops: Sequence[Mapping[str, Any]]
    ) -> dict[str, Any]:
        """Apply a JSON patch to an InferenceService; ConflictError when its resourceVersion moved."""
        try:
            return await self._call(
                f"updating {name}",
                self._custom.patch_namespaced_custom_object,
                KSERVE_GROUP,
                KSERVE_VERSION,
                namespace,
                KSERVE_PLURAL,
                name,
                list(ops),
                _content_type=JSON_PATCH,
            )
        except ApiException as exc:
            _raise_translated(exc, not_found=ConflictError)
            raise ApiError(f"updating {name}", exc.status, _reason(exc)) from exc

    async def delete_inferenceservice(self, namespace: str, name: str) -> None:
        """Delete an InferenceService (already gone is fine)."""
        try:
            await self._call(
                f"deleting {name}",
                self._custom.delete_namespaced_custom_object,
                KSERVE_GROUP,
                KSERVE_VERSION,
                namespace,
                KSERVE_PLURAL,
                name,
                propagation_policy="Background",
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


def _raise_translated(exc: ApiException, *, not_found: type[RuntimeError]) -> None:
    """Turn races into ConflictError and a missing resource into ``not_found``; leave the rest as is."""
    body = str(exc.body or "").lower()
    lost_race = exc.status == 409 or (exc.status == 422 and "test failed" in body)
    if lost_race:
        raise ConflictError(f"{exc.status} {exc.reason}") from exc
    if exc.status == 404:
        raise not_found(str(exc.reason)) from exc
