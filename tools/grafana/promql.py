"""The PromQL the dashboard's panels are written in, evaluated over scraped samples.

Who calls it: ``tools/grafana/render.py``, which draws every panel of
``tools/grafana/dashboard.py``'s ``PANELS`` from the ``/metrics`` of a real demo run with
no Prometheus at hand, and its test. What it owns: the subset of PromQL those panels use,
parsed and evaluated as Prometheus does it over a list of ``(seconds, samples)`` scrapes:
metric selectors with ``=``, ``!=`` and ``=~`` matchers (a matcher on a dashboard variable,
``"$job"``, matches everything), ``rate(...[range])`` (the counter's rise over the
scrapes inside the range, per second; ``$__rate_interval`` is :data:`WINDOW`), ``sum``,
``sum by (...)`` and ``max`` (``max by (...)``: a gauge every replica reports alike),
``histogram_quantile`` (linear interpolation inside the bucket, as
Prometheus does), ``+`` and ``/`` between series of the same labels, and number literals.
Anything else is a :class:`ValueError` naming it: a panel written in more PromQL than this
fails its test rather than drawing something else.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable, Sequence

#: ``(metric name, sorted label pairs) -> value``: one scrape, as render.scrape parses it
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
#: label pairs -> one value per scrape (NaN where the expression has none)
Series = dict[tuple[tuple[str, str], ...], list[float]]

#: seconds of ``$__rate_interval``: five scrapes at the render's 2 s interval
WINDOW = 10.0

_TOKEN = re.compile(
    r"""\s*(?:(?P<number>\d+(?:\.\d+)?)|(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)|(?P<string>"(?:[^"\\]|\\.)*")"""
    r"""|(?P<range>\[[^\]]*\])|(?P<op>!=|=~|[(){},=/+]))"""
)


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"PromQL this renderer does not read, at {text[pos : pos + 20]!r}")
        kind = m.lastgroup
        assert kind is not None
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens, self.at, self.text = _tokens(text), 0, text

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self, value: str | None = None, kind: str | None = None) -> str:
        token = self.peek()
        if token is None or (value is not None and token[1] != value) or (kind is not None and token[0] != kind):
            raise ValueError(f"PromQL this renderer does not read: {self.text!r} (expected {value or kind})")
        self.at += 1
        return token[1]

    def expr(self) -> tuple[object, ...]:
        return self._chain("+", self.term)

    def term(self) -> tuple[object, ...]:  # "/" binds tighter than "+", as in PromQL
        return self._chain("/", self.atom)

    def _chain(self, op: str, operand: Callable[[], tuple[object, ...]]) -> tuple[object, ...]:
        node = operand()
        while self.peek() == ("op", op):
            self.take(op)
            node = (op, node, operand())
        return node

    def atom(self) -> tuple[object, ...]:
        token = self.peek()
        if token is None:
            raise ValueError(f"PromQL ends early: {self.text!r}")
        kind, value = token
        if kind == "number":
            self.take()
            return ("number", float(value))
        if value == "(":
            self.take("(")
            node = self.expr()
            self.take(")")
            return node
        if value in ("sum", "max"):
            self.take()
            by: tuple[str, ...] | None = None
            if self.peek() == ("name", "by"):
                self.take()
                by = self.labels()
            self.take("(")
            inner = self.expr()
            self.take(")")
            return (value, by, inner)
        if value == "rate":
            self.take()
            self.take("(")
            selector = self.selector()
            window = self.take(kind="range")
            self.take(")")
            return ("rate", selector, WINDOW if "$" in window else _seconds(window[1:-1]))
        if value == "histogram_quantile":
            self.take()
            self.take("(")
            q = float(self.take(kind="number"))
            self.take(",")
            inner = self.expr()
            self.take(")")
            return ("quantile", q, inner)
        if kind == "name":
            return ("gauge", self.selector())
        raise ValueError(f"PromQL this renderer does not read: {self.text!r} (at {value!r})")

    def labels(self) -> tuple[str, ...]:
        self.take("(")
        names = [self.take(kind="name")]
        while self.peek() == ("op", ","):
            self.take(",")
            names.append(self.take(kind="name"))
        self.take(")")
        return tuple(names)

    def selector(self) -> tuple[str, tuple[tuple[str, str, str], ...]]:
        name = self.take(kind="name")
        matchers = []
        if self.peek() == ("op", "{"):
            self.take("{")
            while self.peek() != ("op", "}"):
                label = self.take(kind="name")
                op = self.take()
                if op not in ("=", "!=", "=~"):
                    raise ValueError(f"PromQL matcher {op!r} this renderer does not read: {self.text!r}")
                matchers.append((label, op, self.take(kind="string")[1:-1]))
                if self.peek() == ("op", ","):
                    self.take(",")
            self.take("}")
        return name, tuple(matchers)


def _seconds(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return float(text[:-1]) * units[text[-1]]


def parse(text: str) -> tuple[object, ...]:
    """The expression's tree; :class:`ValueError` for PromQL outside the subset."""
    parser = _Parser(text)
    node = parser.expr()
    if parser.peek() is not None:
        raise ValueError(f"PromQL this renderer does not read: {text!r} (after the expression)")
    return node


def _matches(labels: tuple[tuple[str, str], ...], matchers: Sequence[tuple[str, str, str]]) -> bool:
    have = dict(labels)
    for label, op, value in matchers:
        if "$" in value:  # a dashboard variable: every value
            continue
        got = have.get(label, "")
        if (op == "=" and got != value) or (op == "!=" and got == value):
            return False
        if op == "=~" and re.fullmatch(value, got) is None:
            return False
    return True


Selector = tuple[str, tuple[tuple[str, str, str], ...]]


def _selected(scrapes: Sequence[tuple[float, Samples]], selector: Selector) -> Series:
    name, matchers = selector
    out: Series = defaultdict(lambda: [math.nan] * len(scrapes))
    for i, (_, samples) in enumerate(scrapes):
        for (n, labels), value in samples.items():
            if n == name and _matches(labels, matchers):
                out[labels][i] = value
    return dict(out)


def _rate(scrapes: Sequence[tuple[float, Samples]], raw: Series, window: float) -> Series:
    times = [t for t, _ in scrapes]
    out: Series = {}
    for labels, values in raw.items():
        rates = [math.nan] * len(times)
        for i, t in enumerate(times):
            j = next(k for k in range(i + 1) if t - times[k] <= window)
            if j < i and not (math.isnan(values[i]) or math.isnan(values[j])):
                rates[i] = max(0.0, values[i] - values[j]) / (t - times[j])
        out[labels] = rates
    return out


def _aggregate(series: Series, by: tuple[str, ...] | None, length: int, add: Callable[[float, float], float]) -> Series:
    out: Series = {}
    for labels, values in series.items():
        have = dict(labels)
        key = tuple((k, have.get(k, "")) for k in by) if by else ()
        into = out.setdefault(key, [math.nan] * length)
        for i, v in enumerate(values):
            if not math.isnan(v):
                into[i] = v if math.isnan(into[i]) else add(into[i], v)
    return out


def _quantile(q: float, buckets: Series, length: int) -> Series:
    groups: dict[tuple[tuple[str, str], ...], list[tuple[float, list[float]]]] = defaultdict(list)
    for labels, values in buckets.items():
        rest = tuple(p for p in labels if p[0] != "le")
        le = dict(labels).get("le")
        if le is not None:
            groups[rest].append((float(le), values))
    out: Series = {}
    for rest, les in groups.items():
        les.sort(key=lambda p: p[0])
        values = []
        for i in range(length):
            counts = [(le, v[i]) for le, v in les]
            total = counts[-1][1]
            if math.isnan(total) or total <= 0:
                values.append(math.nan)
                continue
            rank, prev_le, prev_c, value = q * total, 0.0, 0.0, math.nan
            for le, c in counts:
                if c >= rank:
                    inside = (rank - prev_c) / max(c - prev_c, 1e-12)
                    value = prev_le if le == math.inf else prev_le + (le - prev_le) * inside
                    break
                prev_le, prev_c = le, c
            values.append(value)
        out[rest] = values
    return out


def _binary(op: str, left: Series, right: Series) -> Series:
    """``left op right`` between series of the same labels (one side without labels, a
    number or an unlabelled sum, goes with every series of the other)."""
    if set(left) == {()} and set(right) != {()}:
        return {labels: _apply(op, left[()], b) for labels, b in right.items()}
    alone = right.get(()) if set(right) == {()} else None
    out: Series = {}
    for labels, a in left.items():
        b = right.get(labels, alone)
        if b is not None:
            out[labels] = _apply(op, a, b)
    return out


def _apply(op: str, a: list[float], b: list[float]) -> list[float]:
    if op == "+":
        return [x + y for x, y in zip(a, b)]
    return [x / y if y else math.nan for x, y in zip(a, b)]


def evaluate(node: tuple[object, ...], scrapes: Sequence[tuple[float, Samples]]) -> Series:
    """The expression's series, a value a scrape (NaN where it has none)."""
    length = len(scrapes)
    kind = node[0]
    if kind == "number":
        return {(): [float(node[1])] * length}  # type: ignore[arg-type]
    if kind == "gauge":
        return _selected(scrapes, node[1])  # type: ignore[arg-type]
    if kind == "rate":
        return _rate(scrapes, _selected(scrapes, node[1]), float(node[2]))  # type: ignore[arg-type]
    if kind in ("sum", "max"):
        add = (lambda a, b: a + b) if kind == "sum" else max
        return _aggregate(evaluate(node[2], scrapes), node[1], length, add)  # type: ignore[arg-type]
    if kind == "quantile":
        return _quantile(float(node[1]), evaluate(node[2], scrapes), length)  # type: ignore[arg-type]
    if kind in ("+", "/"):
        return _binary(str(kind), evaluate(node[1], scrapes), evaluate(node[2], scrapes))  # type: ignore[arg-type]
    raise ValueError(f"not an expression: {node!r}")


def legend(template: str, labels: tuple[tuple[str, str], ...]) -> str:
    """A Grafana legend format (``{{label}}``) filled from a series' labels."""
    have = dict(labels)
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: have.get(m.group(1), ""), template).strip()


__all__ = ["WINDOW", "Samples", "Series", "evaluate", "legend", "parse"]
