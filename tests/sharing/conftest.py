"""Fixtures of the sharing tests: bundles of the demo runs, and a real S3-compatible server.

The S3 server is moto's (`python -m moto.server`) on 127.0.0.1, in its own process, with IAM
enforced: after the setup below, every request needs the keys of an IAM user. Two users:
`admin` (s3:* everywhere) and `reader` (s3:* on the bucket `runs` only, so the bucket
`secret` answers Access Denied).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time

import pytest

# The IAM calls made without credentials before enforcement starts (see `moto_s3`).
_SETUP_ACTIONS = 6


@dataclasses.dataclass
class MotoS3:
    endpoint: str
    admin: tuple[str, str]
    reader: tuple[str, str]
    region: str = "us-east-1"

    def env(self, keys: tuple[str, str]) -> dict[str, str]:
        return {
            "S3_ENDPOINT": self.endpoint,
            "AWS_ACCESS_KEY_ID": keys[0],
            "AWS_SECRET_ACCESS_KEY": keys[1],
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
        }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(port: int, proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail("moto_server exited at start")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    pytest.fail("moto_server did not start")


@pytest.fixture(scope="session")
def moto_s3(tmp_path_factory):
    """A moto S3 server on loopback with buckets `runs` and `secret` (see the module doc)."""
    pytest.importorskip("moto", reason="pip install 'moto[server]' (the test extra)")
    pytest.importorskip("s3fs", reason="pip install s3fs (the test extra)")
    import boto3

    port = _free_port()
    log = tmp_path_factory.mktemp("moto") / "server.log"
    env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT=str(_SETUP_ACTIONS))
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_listening(port, proc)
        endpoint = f"http://127.0.0.1:{port}"
        anon = {
            "endpoint_url": endpoint,
            "region_name": "us-east-1",
            "aws_access_key_id": "setup",
            "aws_secret_access_key": "setup",
        }
        iam = boto3.client("iam", **anon)
        keys = {}
        for user, resources in (("admin", ["*"]), ("reader", ["arn:aws:s3:::runs*"])):
            iam.create_user(UserName=user)
            k = iam.create_access_key(UserName=user)["AccessKey"]
            keys[user] = (k["AccessKeyId"], k["SecretAccessKey"])
            policy = {
                "Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": resources}],
            }
            iam.put_user_policy(UserName=user, PolicyName="s3", PolicyDocument=json.dumps(policy))
        server = MotoS3(endpoint, keys["admin"], keys["reader"])
        s3 = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name=server.region,
            aws_access_key_id=server.admin[0],
            aws_secret_access_key=server.admin[1],
        )
        for bucket in ("runs", "secret"):
            s3.create_bucket(Bucket=bucket)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def s3_env(moto_s3, monkeypatch):
    """The environment of the admin user (endpoint, keys, region), with a fresh file system
    cache; yields the server."""
    from tessera_tb.trace import remote

    for k, v in moto_s3.env(moto_s3.admin).items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    remote.clear_cache()
    yield moto_s3
    remote.clear_cache()
