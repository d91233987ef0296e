"""Real servers, fakes and harnesses that both the test suite and the tools run the platform's parts with.

Who calls it: the tests under ``tests/`` and the tools that drive the platform for real
(``tools/bench/extender.py``: the fake API server; ``tools/faults/sweep.py``: the fault
injection, the agent processes and the S3 and HTTP sources). It owns what both need, in
one place: a tool imports nothing from ``tests/`` (``tests/tools/test_tools_imports.py``),
and the tests import these from here.

- :mod:`tools.support.fake_apiserver`: a fake Kubernetes API server over real HTTP;
- :mod:`tools.support.s3server`: a real S3 server (moto) on loopback;
- :mod:`tools.support.versioned_http`: an HTTP source whose files change between requests;
- :mod:`tools.support.harness`: a loopback HTTP server and real ``dsagent serve`` processes,
  forked from :mod:`tools.support.agentfork`;
- :mod:`tools.support.faults`: fault injection for the agent's data path.
"""
