"""Kubernetes label selectors (``app=agent,tier in (a,b),!canary``) read here, to pick objects
out of a list already in hand the way the API server would have picked them.

Who calls it: the Dataset controller, which finds its agents among every pod when a pass
lists them all anyway (:func:`dsagent.controller.agents.agents_among`) rather than asking the
API server for them apart. What it owns: :func:`label_matcher`, for the selector grammar of
``labels.Parse`` in Kubernetes: comma-separated requirements, each ``key``, ``!key``,
``key=value``, ``key==value``, ``key!=value``, ``key in (v1,v2)`` or ``key notin (v1,v2)``,
with the API's rules for keys (an optional DNS-subdomain prefix and ``/``, a name of at most
63 characters) and values (at most 63, possibly empty). ``!=`` and ``notin`` select an object
without the label too; an empty selector selects everything. The numeric ``key>1`` and
``key<1`` forms, and anything the grammar does not allow, are not read (None): the caller asks
the API server instead, which applies its own rules (and refuses a malformed selector).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

_NAME = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_PREFIX = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*"
_KEY = rf"(?:(?P<prefix>{_PREFIX})/)?{_NAME}"
_VALUE = rf"(?:{_NAME})?"
_EXISTS = re.compile(rf"(?P<key>{_KEY})")
_ABSENT = re.compile(rf"!\s*(?P<key>{_KEY})")
_EQUAL = re.compile(rf"(?P<key>{_KEY})\s*(?P<op>==|!=|=)\s*(?P<value>{_VALUE})")
_SET = re.compile(rf"(?P<key>{_KEY})\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)")
_ONE_VALUE = re.compile(_VALUE)

Labels = Mapping[str, str]
Requirement = Callable[[Labels], bool]


def label_matcher(selector: str) -> Callable[[Labels], bool] | None:
    """Whether an object's labels satisfy ``selector`` (see the module docstring); None when
    the selector is not one read here."""
    requirements = []
    for term in _terms(selector):
        requirement = _requirement(term)
        if requirement is None:
            return None
        requirements.append(requirement)
    return lambda labels: all(requirement(labels) for requirement in requirements)


def _terms(selector: str) -> list[str]:
    """The requirements of ``selector``: split at the commas outside parentheses."""
    terms, depth, start = [], 0, 0
    for i, char in enumerate(selector):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            terms.append(selector[start:i].strip())
            start = i + 1
    last = selector[start:].strip()
    if terms or last:
        terms.append(last)
    return terms


def _requirement(term: str) -> Requirement | None:
    if match := _ABSENT.fullmatch(term):
        key = match["key"]
        return None if not _key_fits(match) else lambda labels: key not in labels
    if match := _EQUAL.fullmatch(term):
        key, value, equal = match["key"], match["value"], match["op"] != "!="
        return None if not _key_fits(match) else lambda labels: (labels.get(key) == value) == equal
    if match := _SET.fullmatch(term):
        values = [v.strip() for v in match["values"].split(",")]
        if not _key_fits(match) or not match["values"].strip() or not all(_ONE_VALUE.fullmatch(v) for v in values):
            return None
        key, wanted, inside = match["key"], frozenset(values), match["op"] == "in"
        return lambda labels: (key in labels and labels[key] in wanted) == inside
    if match := _EXISTS.fullmatch(term):
        key = match["key"]
        return None if not _key_fits(match) else lambda labels: key in labels
    return None


def _key_fits(match: re.Match[str]) -> bool:
    """The API's length bound on a key's prefix (the name's is in the pattern)."""
    prefix = match["prefix"]
    return prefix is None or len(prefix) <= 253


__all__ = ["label_matcher"]
