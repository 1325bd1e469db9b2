"""`config-manager`: NVIDIA's config manager, as NVIDIA's chart runs it.

With a ConfigMap of named configs, NVIDIA's chart runs `config-manager` twice beside
the plugin: once before it (ONESHOT=true) and as a sidecar. It reads the node label
(NODE_LABEL, `nvidia.com/device-plugin.config`) of NODE_NAME, chooses a config from
CONFIG_FILE_SRCDIR as NVIDIA's does (the label's, DEFAULT_CONFIG, then the
FALLBACK_STRATEGIES), points the symlink CONFIG_FILE_DST at it (at /dev/null for the
empty config) and, when it changed and SEND_SIGNAL is set, sends SIGNAL to the process
PROCESS_TO_SIGNAL. devplug's `nvidia-device-plugin` reloads in place on that signal
(and on the file's change).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from devplug.cli import style
from devplug.config.nvidia import NODE_CONFIG_LABEL

log = logging.getLogger("devplug.config-manager")

_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


def _bool(text: str) -> bool:
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def parser() -> argparse.ArgumentParser:
    """NVIDIA's flags, each defaulting to its environment variable."""
    env = os.environ.get
    p = style.Parser(prog="config-manager", description=__doc__.splitlines()[0])
    p.add_argument("--oneshot", type=_bool, default=_bool(env("ONESHOT", "false")))
    p.add_argument("--kubeconfig", default=env("KUBECONFIG", "") or None)
    p.add_argument("--context", default=None)  # devplug's own: the kubeconfig's context
    p.add_argument("--node-name", default=env("NODE_NAME", ""))
    p.add_argument("--node-label", default=env("NODE_LABEL", NODE_CONFIG_LABEL))
    p.add_argument("--config-file-srcdir", default=env("CONFIG_FILE_SRCDIR", ""))
    p.add_argument("--config-file-dst", default=env("CONFIG_FILE_DST", ""))
    p.add_argument("--default-config", default=env("DEFAULT_CONFIG", ""))
    p.add_argument("--fallback-strategies", default=env("FALLBACK_STRATEGIES", ""))
    p.add_argument("--send-signal", type=_bool, default=_bool(env("SEND_SIGNAL", "true")))
    p.add_argument("--signal", type=int, default=int(env("SIGNAL", "") or signal.SIGHUP))
    p.add_argument("--process-to-signal", default=env("PROCESS_TO_SIGNAL", "nvidia-device-plugin"))
    return p


def update(args: argparse.Namespace, label: str) -> bool:
    """Point CONFIG_FILE_DST at the config `label` chooses; True when it changed.
    ValueError (one line) when no config can be chosen."""
    from devplug.config.nvidiafile import choose, named_configs

    try:
        names = list(named_configs(Path(args.config_file_srcdir)))
    except OSError as error:
        raise ValueError(f"{args.config_file_srcdir}: {error.strerror or error}") from None
    if not names:
        raise ValueError("no configuration files available")
    fallbacks = [f for f in args.fallback_strategies.split(",") if f]
    name, why = choose(names, label, args.default_config, fallbacks)
    source = os.path.join(args.config_file_srcdir, name) if name else os.devnull
    destination = args.config_file_dst
    if os.path.lexists(destination) and os.path.realpath(destination) == os.path.realpath(source):
        log.info("already configured with %s", name or "the empty config")
        return False
    if os.path.lexists(destination) and not os.path.islink(destination):
        raise ValueError(
            f"{destination} exists and is not a link the config manager made: left alone "
            "(remove it, or set another CONFIG_FILE_DST)"
        )
    temporary = f"{destination}.{os.getpid()}.tmp"
    os.symlink(source, temporary)
    os.replace(temporary, destination)  # at once: the plugin never sees no file
    log.info("updated to config %s (%s)", name or "(empty)", why)
    return True


def process_named(name: str) -> int:
    """The process whose command is `name`: its first word, or the script or module a
    Python interpreter runs (devplug's `nvidia-device-plugin`)."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            words = Path(entry.path, "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        found = [w.decode(errors="replace") for w in words[:3]]
        command = found[2] if found[1:2] == ["-m"] and len(found) > 2 else found[-1]
        if found[0] == name or name in (os.path.basename(found[0]), os.path.basename(command)):
            return int(entry.name)
    raise ValueError(f"no process {name!r} to signal")


def apply(args: argparse.Namespace, label: str) -> None:
    if update(args, label) and args.send_signal:
        pid = process_named(args.process_to_signal)
        os.kill(pid, args.signal)
        log.info("sent signal %d to %s (%d)", args.signal, args.process_to_signal, pid)


def follow(args: argparse.Namespace) -> None:
    """Apply the label's config at each change of it, until stopped."""
    from devplug.config import nvidiafile
    from devplug.sources.nvidia.nodelabel import NodeLabelWatch

    def changed() -> None:
        label = (nvidiafile.node_labels or {}).get(args.node_label, "")
        try:
            apply(args, label)
        except ValueError as error:
            log.error("%s=%r: %s", args.node_label, label, error)

    watch = NodeLabelWatch(
        args.node_name, args.kubeconfig, [args.node_label], changed, args.context
    )
    daemon: Any = None  # the watch needs no daemon
    asyncio.run(watch.run(daemon))


def main(argv: Sequence[str] | None = None) -> int:
    from devplug.ground.logs import setup_logging

    setup_logging("info", "text")
    try:
        args = parser().parse_args(argv)
    except argparse.ArgumentTypeError as error:  # a bad variable
        print(f"config-manager: {error}", file=sys.stderr)
        return style.EXIT_USAGE
    for flag in ("node_name", "node_label", "config_file_srcdir", "config_file_dst"):
        if not getattr(args, flag):
            name = flag.replace("_", "-")
            print(f"config-manager: invalid <{name}>: must not be empty string", file=sys.stderr)
            return style.EXIT_USAGE
    from devplug.sources.nvidia.nodelabel import read_labels

    try:
        label = read_labels(args.node_name, args.kubeconfig, args.context).get(args.node_label, "")
        apply(args, label)
    except ValueError as error:
        print(f"config-manager: {error}", file=sys.stderr)
        return 1
    if args.oneshot:
        return style.EXIT_OK
    with contextlib.suppress(KeyboardInterrupt):
        follow(args)
    return style.EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
