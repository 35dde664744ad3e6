"""Generic calls on objects of other API groups (Kueue's Workloads and ResourceFlavors,
PriorityClasses, DRA's ResourceSlices/Claims/ClaimTemplates) through the client's
``CustomObjectsApi`` with the bounded, retried calls of :class:`hetero_operator.controller.k8s.Api`,
so that neither kopf nor the kubernetes package is needed here.  A group the cluster does not serve
answers 404 (``None``/``False`` where the call says so).  Split from
:mod:`hetero_operator.controller.objects`, which keeps the Kueue gate and the DRA calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hetero_operator.controller.ownership import create_owned


def _status(exc: BaseException) -> int | None:
    return getattr(exc, "status", None)


class _NotServed(Exception):
    status = 404


class Objects:
    """Generic object calls over an :class:`hetero_operator.controller.k8s.Api` (its bounded ``_call``).

    An API object without the generic client (``custom``), such as a test double of the core
    calls only, serves none of these groups: every call answers as a 404 would.

    Args:
        api: the operator's API wrapper.
    """

    def __init__(self, api: Any) -> None:
        self.api = api

    async def _call(self, method: str, *args: Any) -> Any:
        custom = getattr(self.api, "custom", None)
        if custom is None:
            raise _NotServed(method)
        return await self.api._call(getattr(custom, method), *args)

    async def get(self, gvr: tuple[str, str, str], namespace: str | None, name: str
                  ) -> dict[str, Any] | None:
        """The object, ``None`` on 404 (absent, or the API group is not served)."""
        group, version, plural = gvr
        try:
            if namespace is None:
                return await self._call("get_cluster_custom_object", group, version, plural, name)
            return await self._call("get_namespaced_custom_object", group, version, namespace,
                                    plural, name)
        except Exception as exc:
            if _status(exc) == 404:
                return None
            raise

    async def list(self, gvr: tuple[str, str, str]) -> list[dict[str, Any]] | None:
        """Every object of a resource in all namespaces; ``None`` when the group is not served."""
        group, version, plural = gvr
        try:
            data = await self._call("list_cluster_custom_object", group, version, plural)
        except Exception as exc:
            if _status(exc) == 404:
                return None
            raise
        return list(data.get("items") or [])

    async def create(self, gvr: tuple[str, str, str], obj: Mapping[str, Any]) -> bool:
        """Create a namespaced object; ``False`` when it exists already (409).

        Raises:
            Exception: 404 when the API group is not served, and other API errors.
        """
        group, version, plural = gvr
        try:
            await self._call("create_namespaced_custom_object", group, version,
                             obj["metadata"]["namespace"], plural, dict(obj))
            return True
        except Exception as exc:
            if _status(exc) == 409:
                return False
            raise

    async def create_owned(self, gvr: tuple[str, str, str], obj: Mapping[str, Any],
                           owner: Mapping[str, Any]) -> bool:
        """Create ``obj`` for ``owner`` (the job); on a 409 the object that exists must be the
        job's (:func:`hetero_operator.controller.ownership.create_owned`).

        Returns:
            True when created, False when the job's object exists already.

        Raises:
            NotOwned: an object of that name exists and is not the job's.
        """
        meta = obj["metadata"]

        async def read(_: Mapping[str, Any]) -> Mapping[str, Any] | None:
            return await self.get(gvr, meta["namespace"], meta["name"])

        return await create_owned(lambda o: self.create(gvr, o), read, obj, owner)

    async def patch_status(self, gvr: tuple[str, str, str], namespace: str, name: str,
                           status: Mapping[str, Any], *, resource_version: str | None = None,
                           ) -> bool:
        """Merge-patch the ``status`` subresource (404 ignored: the object is gone).

        With ``resource_version`` the patch applies only to that version of the object.

        Returns:
            False when the object changed since ``resource_version`` (409), else True.
        """
        group, version, plural = gvr
        body: dict[str, Any] = {"status": dict(status)}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        try:
            await self._call("patch_namespaced_custom_object_status", group, version, namespace,
                             plural, name, body)
        except Exception as exc:
            if _status(exc) == 409:
                return False
            if _status(exc) != 404:
                raise
        return True

    async def patch(self, gvr: tuple[str, str, str], namespace: str, name: str,
                    patch: Mapping[str, Any]) -> None:
        """Merge-patch a namespaced object (404 ignored: the object is gone)."""
        group, version, plural = gvr
        try:
            await self._call("patch_namespaced_custom_object", group, version, namespace, plural,
                             name, dict(patch))
        except Exception as exc:
            if _status(exc) != 404:
                raise

    async def delete(self, gvr: tuple[str, str, str], namespace: str, name: str) -> bool:
        """Delete a namespaced object; False when it was not there (404)."""
        group, version, plural = gvr
        try:
            await self._call("delete_namespaced_custom_object", group, version, namespace, plural, name)
        except Exception as exc:
            if _status(exc) == 404:
                return False
            raise
        return True

    async def served(self, group: str, version: str) -> bool:
        """Whether the cluster serves ``group/version`` (API discovery; any error but a 404 raises)."""
        try:
            await self._call("get_api_resources", group, version)
        except Exception as exc:
            if _status(exc) == 404:
                return False
            raise
        return True
