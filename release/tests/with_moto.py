#!/usr/bin/env python3
"""release/tests/with_moto.py — runs a command against moto's server with the CloudFormation
corrections of release/tests/moto_cloudformation.py, on 127.0.0.1, stopped when it ends.

    with_moto.py CMD [ARG...]

The command gets AWS_ENDPOINT_URL and dummy credentials (no AWS account); its exit status is
returned. moto comes from scripts/dynamodb-local's venv (installed there if needed).
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REGION = "us-east-1"


def start_moto(scratch: Path) -> tuple[subprocess.Popen, str]:
    """The corrected moto server on a free port of 127.0.0.1, ready; its log in scratch/moto.log."""
    env = dict(os.environ, FLIGHTLOCK_DDB_BACKEND="moto")
    python = subprocess.run([str(ROOT / "scripts/dynamodb-local"), "install"], env=env, check=True,
                            capture_output=True, text=True).stdout.split()[0]  # moto's venv
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(scratch / "moto.log", "w")
    proc = subprocess.Popen([python, str(ROOT / "release/tests/moto_cloudformation.py"), "-p", str(port)],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=2)
            return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"moto did not start: {(scratch / 'moto.log').read_text()}")
            time.sleep(0.2)


def aws_environment(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")}
    env.update(AWS_ENDPOINT_URL=url, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
               AWS_DEFAULT_REGION=REGION, AWS_REGION=REGION, AWS_EC2_METADATA_DISABLED="true")
    return env


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="flightlock-moto-") as scratch:
        moto, url = start_moto(Path(scratch))
        try:
            code = subprocess.run(sys.argv[1:], env=aws_environment(url)).returncode
            if code != 0:
                print("with_moto: the end of moto's log:\n" + "\n".join(
                    line for line in (Path(scratch) / "moto.log").read_text().splitlines()[-60:]
                    if 'HTTP/1.1" ' not in line), file=sys.stderr)
            return code
        finally:
            moto.terminate()
            moto.wait(10)


if __name__ == "__main__":
    sys.exit(main())
