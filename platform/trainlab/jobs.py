"""`trainlab submit | status | logs | stop`: trials and sweeps on an existing cluster via Ray Jobs.

    trainlab submit --address http://HEAD:8265 -- model=125m precision=bf16
    trainlab submit --address http://HEAD:8265 -m -- +sweep=precision_shootout
    trainlab status raysubmit_XYZ --address http://HEAD:8265

The job's working directory is this project (conf/, platform/, sweeps/, pyproject.toml; no
virtualenv, outputs or local MLflow files), its entrypoint runs the same Hydra app as
`trainlab train` with `cluster=ray cluster.address=auto` (the job's driver joins the cluster
it runs on), and the tracking configuration travels as environment variables
(MLFLOW_TRACKING_URI and the other MLFLOW_* set here). `submit` prints the job id, streams
the job's logs until it ends and exits with the job's outcome (0 = SUCCEEDED).
The cluster's nodes need the project's dependencies installed (torch, ray, hydra, mlflow),
as for any Ray job; `ray job submit ... -- python -m trainlab.cli train ...` does the same.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from trainlab.config.convert import REPO_ROOT
from trainlab.ray_job import DEFAULT_OUTPUT_ROOT, OUTPUT_ROOT_ENV

EXCLUDES = [".venv", ".git", "outputs", "multirun", "mlruns", "mlartifacts", "mlflow.db",
            "__pycache__", "*.egg-info", ".pytest_cache"]
"""Kept out of the job's working directory upload."""
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


def entrypoint(overrides: list[str], *, multirun: bool) -> str:
    """The shell command the job runs: the Hydra app joining the job's own cluster."""
    import shlex

    args = ["python", "-m", "trainlab.cli", "train", *(["-m"] if multirun else []),
            "cluster=ray", "cluster.address=auto", *overrides]
    return " ".join(shlex.quote(a) for a in args)


def runtime_env(*, output_root: str = "") -> dict:
    """Working dir = this project; the package importable from it; tracking settings and the
    output root (trainlab.ray_job: Ray deletes the working dir) forwarded."""
    env = {k: v for k, v in os.environ.items() if k.startswith("MLFLOW_")}
    env["PYTHONPATH"] = "platform"
    if output_root:
        env[OUTPUT_ROOT_ENV] = output_root
    return {"working_dir": str(REPO_ROOT), "excludes": EXCLUDES, "env_vars": env}


DASHBOARD_TIMEOUT_S = 10.0
"""How long the cluster's dashboard has to answer before `submit`, `status`, ... give up."""
ADDRESS_ENV = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
"""Where the default --address comes from; Ray's client would let them override --address."""


def check_address(address: str, *, field: str = "--address", timeout_s: float = DASHBOARD_TIMEOUT_S) -> None:
    """The Jobs API answers at `address` (an http(s) URL) within timeout_s: Ray's client would
    otherwise retry, wait on a TCP connect for minutes, or look a GCS address up by joining the
    cluster. Any HTTP answer counts (a cluster with token authentication answers 401)."""
    import urllib.error
    import urllib.request
    from urllib.parse import urlparse

    parsed = urlparse(address)
    try:
        port_ok = parsed.port is None or parsed.port > 0
    except ValueError:  # not a number, or past 65535
        port_ok = False
    if parsed.scheme not in ("http", "https") or not parsed.hostname or not port_ok or any(
            c.isspace() for c in address):
        raise ValueError(f"{field}={address!r} is not the URL of a Ray cluster's dashboard; give "
                         "http://HEAD:8265 (the head node's dashboard, which serves the Jobs API)")
    try:
        with urllib.request.urlopen(address.rstrip("/") + "/api/version", timeout=timeout_s) as r:
            r.read()
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        why = f"no answer within {timeout_s:g} s" if isinstance(reason, TimeoutError) else str(reason)
        raise ValueError(f"{field}={address!r}: no Ray dashboard answers there ({why}); start the cluster "
                         "(`ray start --head`, dashboard on port 8265) or fix the address") from None


def _client(address: str):
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(address)
    except AuthenticationError as e:
        # 401: no token sent; 403: a token the head does not hold (another machine's ~/.ray/auth_token)
        what = "refused this machine's Ray auth token" if "Forbidden" in str(e) else "requires a Ray auth token"
        raise ValueError(f"the cluster at {address} {what}; set RAY_AUTH_TOKEN to the head's token "
                         "(`ray get-auth-token` on the head prints it) or copy the head's ~/.ray/auth_token "
                         "to this machine") from None


def _list_command(address: str) -> str:
    """`ray job list` as it works from this shell: Ray's CLI sends the token only in token mode."""
    mode = "RAY_AUTH_MODE=token " if os.environ.get("RAY_AUTH_MODE") == "token" else ""
    return f"{mode}ray job list --address {address}"


def _known_job(client, job_id: str, address: str):
    """The job's info; ValueError naming the job when the cluster has no such job.

    An id that is not one path segment of the Jobs API's URL ('', '.', 'a#b') made Ray's client
    ask for the job list instead and fail on its answer with a TypeError: refused here."""
    unknown = (f"no job {job_id!r} on the cluster at {address}; `{_list_command(address)}` lists its "
               "jobs (ids look like raysubmit_...)")
    if not job_id.strip() or job_id in (".", "..") or any(c in job_id for c in "/?#"):
        raise ValueError(unknown)
    try:
        return client.get_job_info(job_id)
    except RuntimeError as e:
        if "404" not in str(e):
            raise
        raise ValueError(unknown) from None


def follow(client, job_id: str) -> int:
    """Stream a job's logs to stdout until it ends; returns 0 if it SUCCEEDED, else 1."""
    async def tail() -> None:
        async for chunk in client.tail_job_logs(job_id):
            sys.stdout.write(chunk)
            sys.stdout.flush()

    asyncio.run(tail())
    status = str(client.get_job_status(job_id)).rsplit(".", 1)[-1]
    print(f"job {job_id}: {status}")
    return 0 if status == "SUCCEEDED" else 1


def main(command: str, argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog=f"trainlab {command}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", default=os.environ.get("RAY_API_SERVER_ADDRESS")
                        or os.environ.get("RAY_ADDRESS", "http://127.0.0.1:8265"),
                        help="the cluster's dashboard / Jobs API URL (default $RAY_API_SERVER_ADDRESS, "
                             "$RAY_ADDRESS, else http://127.0.0.1:8265)")
    if command == "submit":
        parser.add_argument("-m", "--multirun", action="store_true", help="a Hydra multirun (sweep)")
        parser.add_argument("--no-wait", action="store_true", help="print the job id and return")
        parser.add_argument("--output-root", default=os.environ.get(OUTPUT_ROOT_ENV, ""),
                            help=f"where the job writes outputs and checkpoints, as <root>/<job id>, on the "
                                 f"cluster's nodes (shared storage on a multi-node cluster; default "
                                 f"${OUTPUT_ROOT_ENV}, else {DEFAULT_OUTPUT_ROOT} of the job's driver)")
        parser.add_argument("overrides", nargs="*", help="`trainlab train` overrides (after --)")
    else:
        parser.add_argument("job_id")
    args = parser.parse_args(argv)
    given = "--address" in argv or any(a.startswith("--address=") for a in argv)
    field = "--address" if given else next((k for k in ADDRESS_ENV if os.environ.get(k)), "--address")
    try:
        if command == "submit":  # bad overrides stop here, not on the cluster after an upload
            from trainlab.config.overrides import check_overrides
            from trainlab.plan.derive_layout import plan_layout

            check_overrides([*(["-m"] if args.multirun else []), "cluster=ray", "cluster.address=auto",
                             *args.overrides], check_run=plan_layout, warn_duplicates=False)
            if args.output_root and not args.output_root.startswith(("/", "~")):
                raise ValueError(f"--output-root={args.output_root!r} is relative, but the job runs in a "
                                 "folder of Ray's; give an absolute path the cluster's nodes share")
        check_address(args.address, field=field)
        for k in ADDRESS_ENV:  # the address just checked is the one Ray's client uses
            os.environ.pop(k, None)
        client = _client(args.address)
        if command != "submit":
            info = _known_job(client, args.job_id, args.address)
    except ValueError as e:  # ConfigError (bad overrides) included
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    try:
        if command == "submit":
            job_id = client.submit_job(entrypoint=entrypoint(args.overrides, multirun=args.multirun),
                                       runtime_env=runtime_env(output_root=args.output_root))
            print(f"submitted job {job_id} to {args.address}; its outputs: "
                  f"{args.output_root or DEFAULT_OUTPUT_ROOT}/{job_id} on the node running its driver")
            if not args.no_wait:
                sys.exit(follow(client, job_id))
        elif command == "status":
            print(f"job {args.job_id}: {info.status}" + (f" ({info.message})" if info.message else ""))
        elif command == "logs":
            sys.exit(follow(client, args.job_id))
        elif command == "stop":
            stopped = client.stop_job(args.job_id)
            print(f"job {args.job_id}: {'stop requested' if stopped else 'already ended'}")
    except (RuntimeError, ConnectionError) as e:  # the cluster answered, then refused or went away
        print(f"error: the cluster at {args.address} failed `trainlab {command}`: {str(e).splitlines()[0]}",
              file=sys.stderr)
        sys.exit(1)
