"""The one reader of kubeconfig files, and of the in-cluster service account.

`load(path, context)` reads `path` (else $KUBECONFIG, a list of files joined by ':' as
kubectl merges them: the first file to name an entry wins; else the service account
of the pod it runs in), picks `context` (else the file's current-context) and returns
the `Target`: the server, how to trust it, and the credentials. Anything wrong is a
ValueError of one line naming the file, the entry and the field. Relative paths in a
file are relative to the file's folder, as kubectl reads them.
"""

from __future__ import annotations

import atexit
import base64
import binascii
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devplug.apiserver.credentials import (
    EXEC_API_VERSIONS,
    Credentials,
    ExecPlugin,
    StaticToken,
    TokenFile,
)

if TYPE_CHECKING:
    import ssl

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass
class Target:
    """One API server and how to talk to it."""

    server: str
    source: str  # what it was read from, for messages: "kubeconfig K, context C"
    credentials: Credentials = field(default_factory=Credentials)
    ca_file: str | None = None
    ca_data: bytes | None = None
    insecure: bool = False
    tls_server_name: str | None = None
    cert_file: str | None = None
    cert_data: bytes | None = None
    key_file: str | None = None
    key_data: bytes | None = None
    namespace: str | None = None
    _folder: str | None = None

    def ssl_context(self) -> ssl.SSLContext:
        """A client TLS context for aiohttp (ValueError of one line when the files of
        the kubeconfig cannot be loaded)."""
        from devplug.ground.lazy import allow_ssl

        allow_ssl()
        import ssl

        ca, cert, key = self.files()
        try:
            context = ssl.create_default_context(cafile=ca)
            if cert:
                context.load_cert_chain(cert, keyfile=key)
        except (OSError, ssl.SSLError) as error:
            raise ValueError(f"{self.source}: cannot load its certificates: {error}") from None
        if self.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    def files(self) -> tuple[str | None, str | None, str | None]:
        """The CA, client certificate and key as files (data written to a private
        folder removed at exit), for TLS libraries that read only files."""
        return (
            self._file("ca.crt", self.ca_file, self.ca_data),
            self._file("client.crt", self.cert_file, self.cert_data),
            self._file("client.key", self.key_file, self.key_data),
        )

    def _file(self, name: str, path: str | None, data: bytes | None) -> str | None:
        if data is None:
            return path
        if self._folder is None:
            self._folder = tempfile.mkdtemp(prefix="devplug-kubeconfig-")
            atexit.register(shutil.rmtree, self._folder, True)
        written = os.path.join(self._folder, name)
        with open(os.open(written, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            f.write(data)
        return written


def load(path: str | None = None, context: str | None = None) -> Target:
    """The API server of `path` (else $KUBECONFIG, else in-cluster) at `context`."""
    paths = [path] if path else [p for p in os.environ.get("KUBECONFIG", "").split(":") if p]
    if not paths:
        if context:
            raise ValueError(f"--context {context}: needs a kubeconfig (--kubeconfig)")
        return in_cluster()
    return _Merged([_read(p) for p in paths]).target(context)


def in_cluster() -> Target:
    """The service account of the pod this runs in."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise ValueError(
            "no kubeconfig: give --kubeconfig or set $KUBECONFIG (not in a pod: "
            "KUBERNETES_SERVICE_HOST is not set)"
        )
    token = os.path.join(SERVICE_ACCOUNT, "token")
    if not os.path.isfile(token):
        raise ValueError(f"in-cluster config: no service account token at {token}")
    host = f"[{host}]" if ":" in host else host
    return Target(
        server=f"https://{host}:{port}",
        source="the in-cluster service account",
        credentials=TokenFile(token),
        ca_file=os.path.join(SERVICE_ACCOUNT, "ca.crt"),
    )


@dataclass
class _File:
    path: str
    data: dict[str, Any]

    @property
    def folder(self) -> Path:
        return Path(self.path).resolve().parent


def _read(path: str) -> _File:
    """One kubeconfig file, read within devplug's input limits (size, nesting, YAML
    aliases: devplug.ground.inputs)."""
    from devplug.ground import inputs

    try:
        data = inputs.load_yaml(inputs.read_text(path, what="the kubeconfig"), path)
    except inputs.InputError as error:
        raise ValueError(f"kubeconfig {error}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"kubeconfig {path}: not a kubeconfig (a {type(data).__name__})")
    return _File(path, data)


class _Merged:
    """Several kubeconfig files as one, the first to name an entry winning."""

    def __init__(self, files: list[_File]) -> None:
        self.files = files
        self.source = "kubeconfig " + ":".join(f.path for f in files)
        self.entries: dict[str, dict[str, tuple[dict[str, Any], _File]]] = {}
        for kind in ("clusters", "users", "contexts"):
            named: dict[str, tuple[dict[str, Any], _File]] = {}
            for file in files:
                for name, body in _entries(file, kind):
                    named.setdefault(name, (body, file))
            self.entries[kind] = named

    def target(self, context: str | None) -> Target:
        if not context:
            context = next(
                (
                    str(f.data["current-context"])
                    for f in self.files
                    if f.data.get("current-context")
                ),
                None,
            )
            if not context:
                raise ValueError(f"{self.source}: no current-context; name one with --context")
        contexts = self.entries["contexts"]
        if context not in contexts:
            known = ", ".join(n if n.isprintable() else repr(n) for n in sorted(contexts))
            known = known or "none"
            raise ValueError(f"{self.source}: no context {context!r} (it has: {known})")
        body, file = contexts[context]
        where = f"kubeconfig {file.path}: context {context!r}"
        cluster_name = _text(body, "cluster", where, required=True)
        user_name = _text(body, "user", where)
        clusters = self.entries["clusters"]
        if cluster_name not in clusters:
            raise ValueError(f"{where}: no cluster {cluster_name!r} in {self.source}")
        target = _cluster(*clusters[cluster_name], cluster_name)
        target.source = f"{self.source}, context {context!r}"
        target.namespace = _text(body, "namespace", where)
        if user_name:
            users = self.entries["users"]
            if user_name not in users:
                raise ValueError(f"{where}: no user {user_name!r} in {self.source}")
            _user(target, *users[user_name], user_name)
        return target


def _entries(file: _File, kind: str) -> list[tuple[str, dict[str, Any]]]:
    items = file.data.get(kind)
    if items is None:
        return []
    if not isinstance(items, list):
        raise ValueError(f"kubeconfig {file.path}: {kind}: not a list")
    inner = kind[:-1]  # clusters: [{name, cluster: {...}}]
    found = []
    for index, item in enumerate(items):
        where = f"kubeconfig {file.path}: {kind}[{index}]"
        if not isinstance(item, dict):
            raise ValueError(f"{where}: not a mapping")
        name = _text(item, "name", where, required=True)
        body = item.get(inner)
        if not isinstance(body, dict):
            raise ValueError(f"{where} ({name}): {inner}: missing or not a mapping")
        found.append((name, body))
    return found


def _text(body: dict[str, Any], key: str, where: str, *, required: bool = False) -> str:
    value = body.get(key)
    if value is None or value == "":
        if required:
            raise ValueError(f"{where}: {key}: missing")
        return ""
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise ValueError(f"{where}: {key}: not a string")
    return str(value)


def _data(body: dict[str, Any], key: str, where: str) -> bytes | None:
    text = _text(body, key, where)
    if not text:
        return None
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{where}: {key}: not base64") from None


def _path(body: dict[str, Any], key: str, where: str, folder: Path) -> str | None:
    text = _text(body, key, where)
    if not text:
        return None
    try:
        path = folder / os.path.expanduser(text)
        found = path.is_file()
    except (OSError, ValueError):  # a NUL, a name too long
        raise ValueError(f"{where}: {key}: not a usable path: {text!r}") from None
    if not found:
        raise ValueError(f"{where}: {key}: no file {path}")
    return str(path)


def _cluster(body: dict[str, Any], file: _File, name: str) -> Target:
    where = f"kubeconfig {file.path}: cluster {name!r}"
    server = _text(body, "server", where, required=True)
    if not server.startswith(("https://", "http://")):
        raise ValueError(f"{where}: server {server!r}: not an http(s) URL")
    insecure = body.get("insecure-skip-tls-verify", False)
    if not isinstance(insecure, bool):
        raise ValueError(f"{where}: insecure-skip-tls-verify: not true or false")
    return Target(
        server=server.rstrip("/"),
        source=where,
        ca_file=_path(body, "certificate-authority", where, file.folder),
        ca_data=_data(body, "certificate-authority-data", where),
        insecure=insecure,
        tls_server_name=_text(body, "tls-server-name", where) or None,
    )


def _user(target: Target, body: dict[str, Any], file: _File, name: str) -> None:
    where = f"kubeconfig {file.path}: user {name!r}"
    folder = file.folder
    target.cert_file = _path(body, "client-certificate", where, folder)
    target.cert_data = _data(body, "client-certificate-data", where)
    target.key_file = _path(body, "client-key", where, folder)
    target.key_data = _data(body, "client-key-data", where)
    if bool(target.cert_file or target.cert_data) != bool(target.key_file or target.key_data):
        raise ValueError(f"{where}: a client certificate needs its key, and a key its certificate")
    for unsupported, instead in (
        ("auth-provider", "use an exec credential plugin (exec:)"),
        ("username", "use a token or a client certificate"),
    ):
        if body.get(unsupported):
            raise ValueError(f"{where}: {unsupported}: not supported, {instead}")
    token = _text(body, "token", where)
    token_file = _path(body, "tokenFile", where, folder)
    plugin = body.get("exec")
    if plugin is not None:
        target.credentials = _exec(plugin, where, folder, target)
    elif token:
        target.credentials = StaticToken(token)
    elif token_file:
        target.credentials = TokenFile(token_file)


def _exec(plugin: Any, where: str, folder: Path, target: Target) -> ExecPlugin:
    where = f"{where}: exec"
    if not isinstance(plugin, dict):
        raise ValueError(f"{where}: not a mapping")
    api_version = _text(plugin, "apiVersion", where, required=True)
    if api_version not in EXEC_API_VERSIONS:
        raise ValueError(
            f"{where}: apiVersion {api_version!r}: expected one of {', '.join(EXEC_API_VERSIONS)}"
        )
    command = _text(plugin, "command", where, required=True)
    if os.sep in command and not os.path.isabs(command):
        command = str(folder / command)  # relative to the kubeconfig, as client-go runs it
    args = plugin.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ValueError(f"{where}: args: not a list of strings")
    env: dict[str, str] = {}
    for index, item in enumerate(plugin.get("env") or []):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ValueError(f"{where}: env[{index}]: not a {{name, value}} mapping")
        env[item["name"]] = str(item.get("value", ""))
    if plugin.get("interactiveMode") == "Always":
        raise ValueError(f"{where}: interactiveMode Always: devplug never asks at a terminal")
    cluster = None
    if plugin.get("provideClusterInfo"):
        ca = target.ca_data
        if ca is None and target.ca_file:
            ca = Path(target.ca_file).read_bytes()
        cluster = {"server": target.server, "insecure-skip-tls-verify": target.insecure}
        if ca is not None:
            cluster["certificate-authority-data"] = base64.b64encode(ca).decode()
        if target.tls_server_name:
            cluster["tls-server-name"] = target.tls_server_name
    return ExecPlugin(where[: -len(": exec")], command, list(args), env, api_version, cluster)
