"""The reader's environment: what the webhook writes is what the reader reads back, and
anything else in those variables is refused with the reason."""

from __future__ import annotations

import json

import pytest

from dsplatform.errors import InvalidInput
from dsplatform.wire import readerenv

DIGEST = "0123456789abcdef0123456789abcdef"


def test_what_the_webhook_writes_the_reader_reads_back() -> None:
    shares = [readerenv.Share("web", DIGEST, "/dsagent-run/datasets/web"), readerenv.Share("c-2", DIGEST, "/s")]
    env = {e["name"]: e for e in readerenv.env(shares, "/dsagent-run/agent.sock")}
    assert set(env) == {"DSAGENT_STRIPES", "DSAGENT_SOCKET", "DSAGENT_NODE_NAME"}
    environ = {"DSAGENT_STRIPES": env["DSAGENT_STRIPES"]["value"], "DSAGENT_SOCKET": "/dsagent-run/agent.sock",
               "DSAGENT_NODE_NAME": "gpu-7"}  # fmt: skip
    assert readerenv.from_environ(environ) == (shares, "/dsagent-run/agent.sock", "gpu-7")
    assert readerenv.from_environ({}) == ([], None, None)
    assert "DSAGENT_SOCKET" not in {e["name"] for e in readerenv.env(shares)}
    assert readerenv.share_named(shares, "c-2") == shares[1]
    with pytest.raises(InvalidInput, match="no dataset 'x'"):
        readerenv.share_named(shares, "x")


def _entry(**fields: object) -> dict[str, object]:
    return {"name": "web", "digest": DIGEST, "shareDir": "/s", **fields}


@pytest.mark.parametrize(
    "text",
    [
        "{}",
        "[1]",
        json.dumps([{"name": "web", "digest": DIGEST}]),
        json.dumps([_entry(x=1)]),
        json.dumps([_entry(name="Web!")]),
        json.dumps([_entry(digest="abc")]),
        json.dumps([_entry(shareDir="relative")]),
        json.dumps([_entry(shareDir="/s\0")]),
        json.dumps([_entry()] * (readerenv.MAX_SHARES + 1)),
        "[" * 10,
        "x" * (readerenv.MAX_BYTES + 1),
    ],
)
def test_anything_else_is_refused_with_the_reason(text: str) -> None:
    with pytest.raises(InvalidInput):
        readerenv.decode(text)


def test_a_pod_not_wired_for_a_striped_dataset_is_told_why_and_what_to_do() -> None:
    import pytest

    from dsplatform.errors import PlatformError
    from dsplatform.wire import readerenv

    with pytest.raises(PlatformError) as unset:
        readerenv.share_named(readerenv.from_environ({})[0], None)
    assert "DSAGENT_STRIPES is not set" in str(unset.value) and "spec.stripe" in (unset.value.hint or "")
    two = [readerenv.Share("a", "d" * 32, "/s/a"), readerenv.Share("b", "e" * 32, "/s/b")]
    with pytest.raises(PlatformError) as several:
        readerenv.share_named(two, None)
    assert "['a', 'b']" in str(several.value) and "from_env('a')" in (several.value.hint or "")
