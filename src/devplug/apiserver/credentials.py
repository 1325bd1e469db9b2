"""The bearer token of a request, kept current.

A kubeconfig's user gives it one of three ways: written in the file (`token`), in a
file of its own (`tokenFile`; the in-cluster service account's token, which the
kubelet rotates), or printed by a command (`exec`: the client.authentication.k8s.io
ExecCredential protocol of EKS, GKE and OIDC helpers). A token from a file is read
again once a minute; one from a command again at its `expirationTimestamp`; either
again when the API server refused it (401), once, before the refusal counts.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from devplug.apiserver.failures import Permanent

EXEC_TIMEOUT_S = 60.0  # a credential command that does not answer within this fails
TOKEN_FILE_EVERY_S = 60.0  # a token file is read again this often (as client-go does)
EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")


class CredentialError(Permanent):
    """No token could be had (a command that fails, a file that cannot be read)."""


class Credentials:
    """No token: a client certificate, or nothing at all."""

    def authorization(self) -> str | None:
        """The Authorization header's value now (read again when expired)."""
        return None

    def refresh(self) -> bool:
        """After a 401: read the token again; whether a new one may help."""
        return False

    def fresh(self) -> bool:
        """Whether `authorization()` answers now, without reading or running anything."""
        return True


@dataclass
class StaticToken(Credentials):
    token: str

    def authorization(self) -> str | None:
        return f"Bearer {self.token}"


@dataclass
class TokenFile(Credentials):
    path: str
    _token: str = ""
    _read_at: float = -1e9
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def authorization(self) -> str | None:
        with self._lock:
            if time.monotonic() - self._read_at >= TOKEN_FILE_EVERY_S:
                self._read()
            return f"Bearer {self._token}"

    def refresh(self) -> bool:
        with self._lock:
            old = self._token
            self._read()
            return self._token != old

    def fresh(self) -> bool:
        return time.monotonic() - self._read_at < TOKEN_FILE_EVERY_S

    def _read(self) -> None:
        try:
            with open(self.path, encoding="utf-8") as file:
                token = file.read(65536).strip()
        except (OSError, UnicodeDecodeError) as error:
            raise CredentialError(f"token file {self.path}: {_why(error)}") from None
        if not token:
            raise CredentialError(f"token file {self.path}: empty")
        self._token, self._read_at = token, time.monotonic()


@dataclass
class ExecPlugin(Credentials):
    """A token printed by a command, as an ExecCredential, until it expires."""

    where: str  # "kubeconfig K: user U" for messages
    command: str
    args: list[str]
    env: dict[str, str]
    api_version: str
    cluster: Mapping[str, Any] | None = None  # given to the command when it asks
    _token: str | None = None
    _expires: float | None = None  # time.time() of expirationTimestamp
    _lock: threading.Lock = field(default_factory=threading.Lock)
    runs: int = 0  # the command's runs, for tests

    def authorization(self) -> str | None:
        with self._lock:
            if self._token is None or (self._expires is not None and time.time() >= self._expires):
                self._run()
            return f"Bearer {self._token}"

    def refresh(self) -> bool:
        with self._lock:
            self._run()
            return True

    def fresh(self) -> bool:
        return self._token is not None and (self._expires is None or time.time() < self._expires)

    def _run(self) -> None:
        spec: dict[str, Any] = {"interactive": False}
        if self.cluster is not None:
            spec["cluster"] = dict(self.cluster)
        info = {"apiVersion": self.api_version, "kind": "ExecCredential", "spec": spec}
        env = {**os.environ, **self.env, "KUBERNETES_EXEC_INFO": json.dumps(info)}
        what = f"{self.where}: exec command {self.command}"
        try:
            done = subprocess.run(
                [self.command, *self.args],
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=EXEC_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise CredentialError(f"{what}: no answer within {EXEC_TIMEOUT_S:.0f} s") from None
        except (OSError, ValueError) as error:  # not found, not runnable, a NUL in it
            raise CredentialError(f"{what}: {_why(error)}") from None
        self.runs += 1
        if done.returncode != 0:
            said = [ln for ln in done.stderr.decode(errors="replace").splitlines() if ln.strip()]
            tail = f": {said[-1].strip()}" if said else ""
            raise CredentialError(f"{what}: exit status {done.returncode}{tail}")
        self._token, self._expires = _parse_credential(done.stdout, what, self.api_version)


def _parse_credential(raw: bytes, what: str, api_version: str) -> tuple[str, float | None]:
    try:
        answer = json.loads(raw)
    except ValueError:
        raise CredentialError(f"{what}: did not print an ExecCredential (not JSON)") from None
    if not isinstance(answer, dict) or answer.get("kind") != "ExecCredential":
        raise CredentialError(f"{what}: did not print an ExecCredential (kind)")
    if answer.get("apiVersion") != api_version:
        raise CredentialError(
            f"{what}: printed apiVersion {answer.get('apiVersion')!r}, the kubeconfig "
            f"asks for {api_version!r}"
        )
    status = answer.get("status")
    token = status.get("token") if isinstance(status, dict) else None
    if not isinstance(token, str) or not token:
        raise CredentialError(f"{what}: the ExecCredential has no status.token")
    expires = status.get("expirationTimestamp") if isinstance(status, dict) else None
    if expires is None:
        return token, None
    try:
        when = datetime.datetime.fromisoformat(str(expires).replace("Z", "+00:00"))
    except ValueError:
        raise CredentialError(
            f"{what}: status.expirationTimestamp {expires!r} is not an RFC 3339 time"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return token, when.timestamp()


def _why(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error) or type(error).__name__
