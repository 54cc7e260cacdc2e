"""Debian's redis-server (scripts/redis.sh) for the kind tests, on this machine's address on
the kind network: the pods reach it there, and so do the tests."""

from __future__ import annotations

import os
import re
import socket
import subprocess
from pathlib import Path

from conftest import eventually

ROOT = Path(__file__).resolve().parents[2]


def gateway_address() -> str:
    """The IPv4 address of this machine on the kind network (its gateway)."""
    out = subprocess.run(["docker", "network", "inspect", "kind", "-f", "{{range .IPAM.Config}}{{.Gateway}} {{end}}"],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    return next(a for a in out.split() if re.fullmatch(r"\d+\.\d+\.\d+\.\d+", a))


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Redis:
    """Debian's redis-server (scripts/redis.sh) on the kind network's gateway address."""

    def __init__(self, host: str, tmp: Path):
        binary = os.environ.get("QUIVER_REDIS_SERVER") or subprocess.run(
            [str(ROOT / "scripts" / "redis.sh")], check=True, capture_output=True, text=True, timeout=300,
        ).stdout.strip().splitlines()[-1]
        self.host, self.port = host, free_port(host)
        self.log = open(tmp / "redis.log", "w")  # noqa: SIM115 - the child keeps it open
        self.proc = subprocess.Popen(
            [binary, "--bind", host, "--port", str(self.port), "--protected-mode", "no", "--save", "",
             "--appendonly", "no", "--dir", str(tmp)],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        eventually("redis to answer PING", self.answers, 30, 0.1)

    def answers(self) -> bool:
        try:
            return self.command(b"PING") == b"+PONG\r\n"
        except OSError:
            return False  # not listening yet

    def command(self, *args: bytes) -> bytes:
        with socket.create_connection((self.host, self.port), timeout=5) as s:
            s.sendall(b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args))
            return s.recv(65536)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


