"""The discovery interface every backend implements, and the one place commands run.

A backend is a small class with a ``name``, an ``install_hint``, an
``unavailable_reason()`` that says why it cannot run here (or None), and a
``discover()`` that returns a :class:`~gpu_topology.model.Topology`. Commands run through
an injectable :data:`Runner` so tests and callers can feed recorded output; the default
:func:`run_command` translates every ``subprocess``/``OSError`` failure into this
package's errors.
"""

from __future__ import annotations

import abc
import subprocess
from collections.abc import Callable, Sequence
from typing import ClassVar

from gpu_topology.errors import BackendUnavailable, DiscoveryError
from gpu_topology.model import Topology

# runner(argv, timeout_seconds, install_hint) -> stdout text
Runner = Callable[[Sequence[str], float, str], str]


def run_command(argv: Sequence[str], timeout: float, install_hint: str) -> str:
    """Run ``argv`` and return its stdout; failures become DiscoveryError/BackendUnavailable."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as exc:
        raise BackendUnavailable(f"{argv[0]} not found", hint=install_hint) from exc
    except PermissionError as exc:
        raise BackendUnavailable(f"{argv[0]} is not executable: {exc}", hint=install_hint) from exc
    except subprocess.TimeoutExpired as exc:
        raise DiscoveryError(f"{' '.join(argv)} did not answer within {timeout:g} s") from exc
    except OSError as exc:
        raise DiscoveryError(f"could not run {argv[0]}: {exc}") from exc
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise DiscoveryError(
            f"{' '.join(argv)} exited with status {done.returncode}" + (f": {detail[-1]}" if detail else "")
        )
    return done.stdout


class Backend(abc.ABC):
    """One way of discovering a machine's topology."""

    name: ClassVar[str]
    install_hint: ClassVar[str]

    @abc.abstractmethod
    def unavailable_reason(self) -> str | None:
        """Why this backend cannot run here, or None when it can."""

    @abc.abstractmethod
    def discover(self) -> Topology:
        """The topology this backend sees; raises DiscoveryError subclasses."""

    def require(self) -> None:
        """Raise BackendUnavailable (with what to install) unless the backend can run."""
        reason = self.unavailable_reason()
        if reason is not None:
            raise BackendUnavailable(f"{self.name} discovery cannot run: {reason}", hint=self.install_hint)
