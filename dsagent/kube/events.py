"""Kubernetes Events (``events.k8s.io/v1``): what a platform process tells an object's owner.

Who calls it: the Dataset controller (a refusal of a spec field, a tenancy bound held);
any other process that wants ``kubectl describe`` and ``kubectl events`` to say why it did
or did not act can build an :class:`EventRecorder` the same way. What it owns: the Event's
shape and its repetition rule, the one client-go's recorder follows:

- one Event per ``(object UID, type, reason, note)``: a repeat within ``series_s`` of the
  last one updates that Event's ``series`` (``count``, ``lastObservedTime``) rather than
  writing a new object, so a refusal repeated at every resync is one Event with a count;
- the note is cut to the API's 1 kB; the Event lives in the object's namespace, named after
  the object (``<name>.<random>``, as client-go names them);
- writing an Event never fails the caller: it is best effort by definition (the API server
  may be down, RBAC may lack ``create events``); a failure is logged once per reason and
  :meth:`EventRecorder.record` answers False.

The client's typed models are not used (``_preload_content=False``): they reject an Event
the API server accepts when an optional field is absent, and the caller's JSON is the wire
format already.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dsagent.errors import DsagentError, NotFound
from dsagent.kube.apiclient import translated
from dsplatform.kubetime import format_micro_time

log = logging.getLogger("dsagent.kube.events")

NOTE_MAX = 1024  # the API server refuses a longer note
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class ObjectRef:
    """The object an Event is about (``regarding``)."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str = ""

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> ObjectRef:
        """The reference of an object as the API server returns it."""
        meta = obj.get("metadata") or {}
        return cls(
            str(obj.get("apiVersion", "")),
            str(obj.get("kind", "")),
            str(meta.get("namespace") or "default"),
            str(meta.get("name", "")),
            str(meta.get("uid") or ""),
        )

    def to_json(self) -> dict[str, str]:
        body = {"apiVersion": self.api_version, "kind": self.kind, "namespace": self.namespace, "name": self.name}
        if self.uid:
            body["uid"] = self.uid
        return body


class EventRecorder:
    """Writes Events for one reporting process (see the module docstring)."""

    def __init__(
        self,
        api_client: Any,
        *,
        controller: str,
        instance: str,
        clock: Callable[[], float] = time.time,
        series_s: float = 30 * 60.0,
        remembered: int = 4096,
    ) -> None:
        from kubernetes.client import EventsV1Api

        self._api: Any = EventsV1Api(api_client)
        self.controller, self.instance, self.clock = controller, instance[:128], clock
        self.series_s, self.remembered = series_s, remembered
        # (uid or namespace/name, type, reason, note) -> (event name, count, last time)
        self._seen: OrderedDict[tuple[str, str, str, str], tuple[str, int, float]] = OrderedDict()
        self._failed_reasons: set[str] = set()

    def record(self, regarding: ObjectRef, *, type: str, reason: str, action: str, note: str) -> bool:  # noqa: A002
        """Tell ``regarding``'s owner: ``type`` ``Normal`` or ``Warning``, a CamelCase ``reason``,
        the ``action`` taken or refused. True when the API server has it."""
        note = note[:NOTE_MAX]
        key = (regarding.uid or f"{regarding.namespace}/{regarding.name}", type, reason, note)
        now = self.clock()
        seen = self._seen.get(key)
        try:
            if seen is not None and now - seen[2] < self.series_s:
                name, count, _ = seen
                try:
                    self._patch_series(regarding.namespace, name, count + 1, now)
                    self._remember(key, (name, count + 1, now))
                    return True
                except NotFound:  # expired or deleted meanwhile: a new Event
                    pass
            name = self._create(regarding, type=type, reason=reason, action=action, note=note, now=now)
            self._remember(key, (name, 1, now))
            return True
        except DsagentError as exc:
            if reason not in self._failed_reasons:
                self._failed_reasons.add(reason)
                log.warning(
                    "could not write a %s Event about %s/%s: %s", reason, regarding.namespace, regarding.name, exc
                )
            return False

    def _remember(self, key: tuple[str, str, str, str], value: tuple[str, int, float]) -> None:
        self._seen[key] = value
        self._seen.move_to_end(key)
        while len(self._seen) > self.remembered:
            self._seen.popitem(last=False)

    def _create(
        self,
        regarding: ObjectRef,
        *,
        type: str,
        reason: str,
        action: str,
        note: str,
        now: float,  # noqa: A002
    ) -> str:
        name = f"{regarding.name[:200]}.{secrets.token_hex(8)}"
        body = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": regarding.namespace},
            "eventTime": format_micro_time(now),
            "reportingController": self.controller,
            "reportingInstance": self.instance,
            "action": action[:128],
            "reason": reason[:128],
            "type": type,
            "regarding": regarding.to_json(),
            "note": note,
        }
        with translated(f"create Event in {regarding.namespace}"):
            response = self._api.create_namespaced_event(regarding.namespace, body, _preload_content=False)
        created = json.loads(response.data)
        return str((created.get("metadata") or {}).get("name") or name)

    def _patch_series(self, namespace: str, name: str, count: int, now: float) -> None:
        body = {"series": {"count": count, "lastObservedTime": format_micro_time(now)}}
        with translated(f"update Event {namespace}/{name}"):
            self._api.patch_namespaced_event(name, namespace, body, _content_type=MERGE_PATCH, _preload_content=False)


__all__ = ["EventRecorder", "ObjectRef"]
