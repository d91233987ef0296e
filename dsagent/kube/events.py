"""Kubernetes Events (``events.k8s.io/v1``): what a platform process tells an object's owner.

Who calls it: the Dataset controller (a refusal of a spec field, a tenancy bound held);
any other process that wants ``kubectl describe`` and ``kubectl events`` to say why it did
or did not act can build an :class:`EventRecorder` the same way. What it owns: the Event's
shape and its repetition rule, the one client-go's recorder follows:

- one Event per ``(object UID, type, reason, note)``: a repeat within ``series_s`` of the
  last one is counted in that Event's ``series`` (``count``, ``lastObservedTime``) rather
  than written as a new object, so a refusal repeated at every resync is one Event with a
  count;
- the series is written when it starts (the first repeat) and then at most once every
  ``refresh_s`` (30 minutes, client-go's refresh): the repeats between are counted in
  memory and written with the next write, at a later repeat or at :meth:`EventRecorder.flush`
  (the controller's end of pass, the agent's loop). A refusal repeated on a thousand
  Datasets at every resync is then not a thousand writes a pass to the API server. The
  recorder remembers ``remembered`` series; one it lets go of with repeats not yet written
  is written at the next flush, so no count is lost;
- the note is cut to the API's 1 kB; the Event lives in the object's namespace, named after
  the object (``<name>.<random>``, as client-go names them);
- writing an Event never fails the caller: it is best effort by definition (the API server
  may be down, RBAC may lack ``create events``); a failure is logged once per reason and
  :meth:`EventRecorder.record` answers False;
- as client-go's recorder writes from a goroutine of its own, a caller that records many
  Events (the controller's pass) has them written on threads while it goes on
  (:meth:`EventRecorder.begin`, :meth:`EventRecorder.settle`), the writes of one Event in
  order; otherwise an Event is written before :meth:`EventRecorder.record` returns.

The client's typed models are not used (``_preload_content=False``): they reject an Event
the API server accepts when an optional field is absent, and the caller's JSON is the wire
format already.
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

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


#: (uid or namespace/name, type, reason, note): what makes two Events one series
_Key = tuple[str, str, str, str]


class _Seen(NamedTuple):
    """An Event written, as the recorder counts it."""

    namespace: str
    name: str
    times: int  # occurrences, counted
    observed: float  # the last one's time
    written: int  # the count the API server has
    written_at: float  # when it was written


class _Event(NamedTuple):
    """What an Event says."""

    regarding: ObjectRef
    type: str
    reason: str
    action: str
    note: str


def _event_name(regarding: ObjectRef) -> str:
    """A new Event's name: the object's, then a random suffix (as client-go names them)."""
    return f"{regarding.name[:200]}.{secrets.token_hex(8)}"


#: threads writing Events between :meth:`EventRecorder.begin` and :meth:`EventRecorder.settle`
LANES = 8


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
        refresh_s: float = 30 * 60.0,
        remembered: int = 4096,
    ) -> None:
        from kubernetes.client import EventsV1Api

        self._api: Any = EventsV1Api(api_client)
        self.controller, self.instance, self.clock = controller, instance[:128], clock
        self.series_s, self.refresh_s, self.remembered = series_s, refresh_s, remembered
        self._seen: OrderedDict[_Key, _Seen] = OrderedDict()
        # series let go of (more than ``remembered``) with repeats counted and not yet
        # written: the next flush writes them, then they are forgotten
        self._unwritten: list[_Seen] = []
        self._lock = threading.Lock()  # _seen, between the caller and the writing threads
        self._lanes: list[ThreadPoolExecutor] = []  # started at the first begin(), kept
        self._pending: list[Future[bool]] | None = None  # between begin() and settle()
        self._failed_reasons: set[str] = set()

    def record(self, regarding: ObjectRef, *, type: str, reason: str, action: str, note: str) -> bool:  # noqa: A002
        """Tell ``regarding``'s owner: ``type`` ``Normal`` or ``Warning``, a CamelCase ``reason``,
        the ``action`` taken or refused. True when the API server has it, or, between
        :meth:`begin` and :meth:`settle`, when it is counted or on its way."""
        note = note[:NOTE_MAX]
        key = (regarding.uid or f"{regarding.namespace}/{regarding.name}", type, reason, note)
        now = self.clock()
        event = _Event(regarding, type, reason, action, note)
        with self._lock:
            seen = self._seen.get(key)
            if seen is not None and now - seen.observed < self.series_s:
                counted = seen._replace(times=seen.times + 1, observed=now)
                if counted.written > 1 and now - counted.written_at < self.refresh_s:
                    self._remember(key, counted)  # written with the series' next write
                    return True
                written = counted._replace(written=counted.times, written_at=now)
                self._remember(key, written)
                work = partial(self._series, key, written, event, now)
            else:
                name = _event_name(regarding)
                self._remember(key, _Seen(regarding.namespace, name, 1, now, 1, now))
                work = partial(self._new, key, name, event, now)
        if self._pending is None:
            return work()
        self._pending.append(self._lanes[hash(key) % len(self._lanes)].submit(work))
        return True

    def begin(self) -> None:
        """From now until :meth:`settle`, Events are written on :data:`LANES` threads while
        the caller goes on (a controller's pass: at a few milliseconds an API write, a first
        pass's thousands of Events written one after another would take minutes). The
        writes of one Event (its creation, its series) keep their order on one thread."""
        self._lanes = self._lanes or [ThreadPoolExecutor(1, thread_name_prefix="events") for _ in range(LANES)]
        self._pending = []

    def settle(self) -> None:
        """Wait for the Events recorded since :meth:`begin`; then they are written at once."""
        pending, self._pending = self._pending or [], None
        for done in pending:
            if (error := done.exception()) is not None:  # an API error is answered False: this is a bug
                log.error("writing an Event failed", exc_info=error)

    def flush(self) -> None:
        """Write the series whose count has grown since they were written ``refresh_s`` or
        more ago, and those let go of with repeats not yet written (a controller calls it at
        the end of each pass, an agent's loop every round)."""
        now = self.clock()
        with self._lock:
            due = [
                (k, s) for k, s in self._seen.items() if s.times > s.written and now - s.written_at >= self.refresh_s
            ]
            dropped, self._unwritten = self._unwritten, []
        for at, seen in enumerate(dropped):
            try:
                self._patch_series(seen.namespace, seen.name, seen.times, seen.observed)
            except NotFound:  # expired or deleted: nothing to count on
                continue
            except DsagentError as exc:
                self._failed("counted", f"{seen.namespace}/{seen.name}", exc)
                with self._lock:  # the next flush tries again
                    self._unwritten[:0] = dropped[at:][: self.remembered]
                return
        for key, seen in due:
            try:
                self._patch_series(seen.namespace, seen.name, seen.times, seen.observed)
            except NotFound:  # expired or deleted: the next repeat is a new Event
                with self._lock:
                    self._seen.pop(key, None)
                continue
            except DsagentError as exc:
                self._failed(key[2], seen.namespace, exc)
                return  # the API server refuses or is down: the next flush tries again
            with self._lock:
                if (now_seen := self._seen.get(key)) is not None and now_seen.name == seen.name:
                    self._seen[key] = now_seen._replace(written=seen.times, written_at=now)

    def _series(self, key: _Key, seen: _Seen, event: _Event, now: float) -> bool:
        """Write a series' count; a new Event where the old one is gone."""
        try:
            self._patch_series(seen.namespace, seen.name, seen.times, seen.observed)
            return True
        except NotFound:  # expired or deleted meanwhile: a new Event
            name = _event_name(event.regarding)
            with self._lock:
                self._remember(key, _Seen(seen.namespace, name, 1, now, 1, now))
            return self._new(key, name, event, now)
        except DsagentError as exc:
            with self._lock:  # not written: the next repeat writes it
                if (now_seen := self._seen.get(key)) is not None and now_seen.name == seen.name:
                    self._seen[key] = now_seen._replace(written_at=-math.inf)
            self._failed(event.reason, f"{event.regarding.namespace}/{event.regarding.name}", exc)
            return False

    def _new(self, key: _Key, name: str, event: _Event, now: float) -> bool:
        """Create an Event; forgotten where the API server refuses it (its next repeat tries again)."""
        try:
            self._create(name, event, now)
            return True
        except DsagentError as exc:
            with self._lock:
                if (seen := self._seen.get(key)) is not None and seen.name == name:
                    del self._seen[key]
            self._failed(event.reason, f"{event.regarding.namespace}/{event.regarding.name}", exc)
            return False

    def _failed(self, reason: str, about: str, exc: DsagentError) -> None:
        if reason not in self._failed_reasons:
            self._failed_reasons.add(reason)
            log.warning("could not write a %s Event about %s: %s", reason, about, exc)

    def _remember(self, key: _Key, value: _Seen) -> None:
        self._seen[key] = value
        self._seen.move_to_end(key)
        while len(self._seen) > self.remembered:
            _, old = self._seen.popitem(last=False)
            if old.times > old.written:  # counted since its last write: written at the next flush
                self._unwritten.append(old)
                del self._unwritten[: -self.remembered]

    def _create(self, name: str, event: _Event, now: float) -> None:
        regarding = event.regarding
        body = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": regarding.namespace},
            "eventTime": format_micro_time(now),
            "reportingController": self.controller,
            "reportingInstance": self.instance,
            "action": event.action[:128],
            "reason": event.reason[:128],
            "type": event.type,
            "regarding": regarding.to_json(),
            "note": event.note,
        }
        with translated(f"create Event in {regarding.namespace}"):
            answer = self._api.create_namespaced_event(regarding.namespace, body, _preload_content=False)
            answer.data  # noqa: B018 (read: its connection goes back to the pool)

    def _patch_series(self, namespace: str, name: str, count: int, now: float) -> None:
        body = {"series": {"count": count, "lastObservedTime": format_micro_time(now)}}
        with translated(f"update Event {namespace}/{name}"):
            answer = self._api.patch_namespaced_event(
                name, namespace, body, _content_type=MERGE_PATCH, _preload_content=False
            )
            answer.data  # noqa: B018 (read: its connection goes back to the pool)


__all__ = ["LANES", "EventRecorder", "ObjectRef"]
