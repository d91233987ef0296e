"""``dsctl plan``: ask the scheduler extender which resource plan the deadline design gives a job.

Who calls it: a person. It sends ``GET /v1/plan`` to the extender (scheduler_plugin, which
owns the time model and the cluster view) and prints the answer; it computes nothing itself.
An extender that cannot be reached or fails is a :class:`TransientError` (exit 7), a refused
query an :class:`InvalidInput` (exit 2); ``dsctl``'s edge prints them.
"""

from __future__ import annotations

import json
from typing import Any

import click

from dsagent.cli.options import output_option
from dsagent.errors import InvalidInput, TransientError


@click.command()
@click.option(
    "--extender",
    envvar="DSCTL_EXTENDER",
    default="http://127.0.0.1:8888",
    show_default=True,
    help="The extender's URL (with its base path) [DSCTL_EXTENDER].",
)
@click.option("--params", default=None, help="Parameter count, e.g. 350M, 7B (fp32 gradients).")
@click.option("--gradient-bytes", default=None, help="Gradient size instead of --params, e.g. 1.4GB.")
@click.option("--step-seconds", default=None, help="Compute time of one batch on one GPU, e.g. 250ms.")
@click.option(
    "--profiled-steps", default=None, help="Instead of --step-seconds: DURATION/STEPS timed on one GPU, e.g. 30s/100."
)
@click.option("--steps", required=True, help="Batches on one GPU for the whole run, e.g. 1e5.")
@click.option("--deadline", default=None, help="RFC 3339 time or a duration from now, e.g. 6h.")
@click.option(
    "--deadline-factor",
    default=None,
    help="Instead of --deadline: high, normal, low or a number; deadline = now + factor x run time on one GPU.",
)
@click.option("--max-gpus", type=int, required=True, help="Most GPUs the job may use.")
@click.option("--json", "as_json", is_flag=True, hidden=True, help="Same as -o json.")
@output_option
def plan(
    extender: str,
    params: str | None,
    gradient_bytes: str | None,
    step_seconds: str | None,
    profiled_steps: str | None,
    steps: str,
    deadline: str | None,
    deadline_factor: str | None,
    max_gpus: int,
    as_json: bool,
    output: str,
) -> None:
    """Which plan (GPUs per node) meets the job's deadline on the cluster as it is now."""
    import httpx

    query = {
        k: v
        for k, v in {
            "params": params,
            "gradient-bytes": gradient_bytes,
            "step-seconds": step_seconds,
            "profiled-steps": profiled_steps,
            "steps": steps,
            "deadline": deadline,
            "deadline-factor": deadline_factor,
            "max-gpus": str(max_gpus),
        }.items()
        if v is not None
    }
    try:
        response = httpx.get(extender.rstrip("/") + "/v1/plan", params=query, timeout=30)
    except httpx.HTTPError as exc:
        raise TransientError(f"cannot reach the extender at {extender}: {exc}") from exc
    try:
        body: Any = response.json()
    except ValueError:
        raise TransientError(f"the extender answered {response.status_code} without JSON") from None
    if response.status_code != 200:
        refused = InvalidInput if response.status_code < 500 else TransientError
        if not isinstance(body, dict):
            raise refused(f"the extender answered {response.status_code}: {str(body)[:200]}")
        raise refused(str(body.get("message", body)), hint=body.get("hint") or None)
    if as_json or output == "json":
        click.echo(json.dumps(body, indent=2))
        return
    click.echo(format_answer(body))


def format_answer(body: dict[str, Any]) -> str:
    """The answer for a person: the chosen plan, then every candidate."""

    def one(p: dict[str, Any]) -> str:
        nodes = ", ".join(f"{n['node']}x{n['gpus']}" for n in p["nodes"])
        met = "meets the deadline" if p["meetsDeadline"] else "misses the deadline"
        return f"{p['gpus']} GPUs on {nodes}: runs {p['runSeconds']:.0f} s, ends in {p['endInSeconds']:.0f} s, {met}"

    lines = []
    chosen = body.get("plan")
    ranked = f", ranked by {body['formula']}" if body.get("formula") else ""
    lines.append(f"plan ({body.get('branch')}{ranked}): {one(chosen)}" if chosen else "no plan: no free GPUs known")
    for name, p in sorted((body.get("candidates") or {}).items()):
        lines.append(f"  {name}: {one(p)}")
    return "\n".join(lines)
