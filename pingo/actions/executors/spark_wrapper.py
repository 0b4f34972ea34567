"""Run a command (spark-submit) and report it to Pingo's signed callbacks.

    python -m pingo.actions.executors.spark_wrapper --callback-url URL \
        --attempt N --token T -- spark-submit ...

Reports `running` before starting the command and `success` or `failed` when
it ends. Callbacks are idempotent, so each report is retried a few times.
The wrapper exits with the command's status.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

RETRIES = 5


def report(callback_url: str, kind: str, attempt: int, token: str, body: dict[str, str]) -> bool:
    """POST one callback; True once Pingo answered (any 2xx or a 4xx that retrying won't fix)."""
    query = urllib.parse.urlencode({"attempt": attempt, "token": token})
    request = urllib.request.Request(
        f"{callback_url}/{kind}?{query}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    for n in range(RETRIES):
        try:
            with urllib.request.urlopen(request, timeout=10):
                return True
        except urllib.error.HTTPError as exc:
            if 400 <= exc.code < 500:
                print(f"pingo: {kind} callback refused: {exc.code}", file=sys.stderr)
                return True
        except OSError as exc:
            print(f"pingo: {kind} callback failed ({exc}); retrying", file=sys.stderr)
        time.sleep(min(2**n, 10))
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="spark_wrapper")
    parser.add_argument("--callback-url", required=True)
    parser.add_argument("--attempt", type=int, required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run")
    report(args.callback_url, "running", args.attempt, args.token, {})
    started = time.monotonic()
    try:
        returncode = subprocess.call(command)
    except OSError as exc:
        report(args.callback_url, "failed", args.attempt, args.token, {"error": str(exc)})
        return 127
    runtime_s = time.monotonic() - started
    if returncode == 0:
        report(
            args.callback_url, "success", args.attempt, args.token, {"runtimeS": f"{runtime_s:.3f}"}
        )
    else:
        error = f"{command[0]} exited with status {returncode}; see the action's log"
        report(args.callback_url, "failed", args.attempt, args.token, {"error": error})
    return returncode


if __name__ == "__main__":
    sys.exit(main())
