"""Which pod may read a striped version's bundles through this node's agent.

Who calls it: :mod:`dsagent.api.striperoutes` (``GET /v1/stripes/{name}/{digest}/bundles/{bundle}``)
asks :func:`pod_reader` what a calling pod names, and
:meth:`dsagent.cache.striped.stripes.StripeShares.check_reader` applies :func:`refusal` to the
share. What it owns: the rule (docs/design-striping.md#agent). A pod reads a version only of
its own namespace, and only the version its own task or annotation names:

- **the namespace.** A share records the Datasets it was held for (the ``X-Dsagent-For`` of
  the operator's ``PUT``: the controller names each time the Dataset it acts for). A pod
  reads it only when its namespace, as the cluster shows it, is one of theirs; a pod whose
  namespace the agent cannot tell (outside cluster mode, or not seen yet) reads none;
- **the version.** The pod's task or its ``dsagent.io/datasets`` annotation names the
  dataset, and either names the share's bundle store, or names none (a bare name in the
  annotation: the Dataset of that name in the pod's namespace, as the webhook wires a pod
  for a striped version) when the share was held for that very Dataset. A digest the pod
  pins must be the share's.

A share held without a Dataset (an operator's own ``PUT``) is read by a pod that names its
bundle store: it could read that store through its own task as well. The name alone never
suffices: any pod may name any dataset, with a source that never answers.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

from dsagent.cache.catalog import Catalog
from dsagent.cache.pools import Pools
from dsagent.cache.servicehooks import NamedDataset, ServiceHooks
from dsagent.cache.task import task_key

#: a Dataset a share was held for: (namespace, name)
Holder = tuple[str, str]


@dataclass(frozen=True)
class PodReader:
    """A pod asking for a striped version's bundle: its namespace (None: the agent cannot
    tell) and every dataset its own task and its annotation name."""

    pod_uid: str
    namespace: str | None
    datasets: tuple[NamedDataset, ...]


class _Service(Protocol):
    """What :func:`pod_reader` reads of the cache service."""

    pools: Pools
    hooks: ServiceHooks

    @property
    def catalog(self) -> Catalog: ...


async def pod_reader(svc: _Service, pod_uid: str) -> PodReader:
    """What pod ``pod_uid`` names: its own task's datasets (each with its bundle store, or its
    source for a dataset without one) and, in cluster mode, its namespace and its annotation's."""
    task = await svc.pools.db(svc.catalog.task, task_key(pod_uid))
    named = [
        NamedDataset(str(item.get("name")), item.get("bundles") or item.get("source"))
        for item in (task.request if task is not None else ())
    ]
    hook = svc.hooks.pod_wiring
    wiring = await hook(pod_uid) if hook is not None else None
    if wiring is not None:
        named += wiring.datasets
    return PodReader(pod_uid, wiring.namespace if wiring is not None else None, tuple(named))


def refusal(
    reader: PodReader, name: str, digest: str, store: str, holders: Collection[Holder]
) -> tuple[str, str] | None:
    """Why ``reader`` may not read the share of ``name@digest`` held from ``store`` for the
    Datasets ``holders`` (a message and its hint), or None when it may (the module docstring)."""
    version = f"{name}@{digest[:12]}"
    named = [d for d in reader.datasets if d.name == name]
    if not named:
        return f"this pod's task and annotation do not name dataset {name!r}", "list it in the pod's datasets"
    if holders:
        if reader.namespace is None:
            return (
                f"the share of {version} belongs to a namespace and the agent cannot tell this pod's",
                "in cluster mode the agent knows the pods on its node: ask again once the pod is running",
            )
        if reader.namespace not in {namespace for namespace, _ in holders}:
            return (
                f"the share of {version} belongs to another namespace than this pod's ({reader.namespace})",
                "a pod reads the striped versions of its own namespace's Datasets",
            )
    for dataset in named:
        if dataset.digest not in (None, digest):
            continue
        if dataset.store is not None and _same_store(dataset.store, store):
            return None
        if dataset.store is None and (reader.namespace, name) in holders:
            return None
    return (
        f"this pod names dataset {name!r} with another bundle store or version than the share of {version}",
        "name the Dataset (its name alone) or the bundle store it is packed in",
    )


def _same_store(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")


__all__ = ["Holder", "PodReader", "pod_reader", "refusal"]
