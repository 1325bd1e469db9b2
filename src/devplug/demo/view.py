"""How the demo's events are shown: a readable story on a terminal, or records.

The scenario (`devplug.demo.script`) reports what happens as events, plain dicts with
an `"event"` key; a view turns them into output. `RecordView` prints each as one JSON
object per line or one YAML document; `TextView` prints headings, progress lines and
aligned tables, with ANSI colours only when the stream is a terminal and `NO_COLOR` is
not set.
"""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TextIO

from devplug.ground.formats import MACHINE_FORMATS, render
from devplug.ground.tables import table

Event = Mapping[str, Any]

WIDTH = 80

_RESET = "\033[0m"
_STYLES = {
    "bold": "\033[1m",
    "dim": "\033[2m",
    "red": "\033[31m",
    "green": "\033[32m",
    "yellow": "\033[33m",
    "cyan": "\033[36m",
}

# Text under a step heading.
STEP_INDENT = "   "


class View(Protocol):
    def emit(self, event: Event) -> None:
        """Show one event."""

    def close(self) -> None:
        """Show whatever is still buffered."""


def use_colour(stream: TextIO, environ: Mapping[str, str] | None = None) -> bool:
    """Colour only for a terminal, and never when NO_COLOR is set."""
    env = os.environ if environ is None else environ
    if "NO_COLOR" in env:
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def make_view(output: str, stream: TextIO | None = None, errors: TextIO | None = None) -> View:
    out = sys.stdout if stream is None else stream
    err = sys.stderr if errors is None else errors
    if output in MACHINE_FORMATS:
        return RecordView(out, err, output)
    return TextView(out, err, colour=use_colour(out))


class RecordView:
    """One JSON object per event and line (`json`), or one YAML document per event
    (`yaml`); failures also get a line on stderr."""

    def __init__(self, stream: TextIO, errors: TextIO, output: str = "json") -> None:
        self.stream = stream
        self.errors = errors
        self.output = output

    def emit(self, event: Event) -> None:
        self.stream.write(render(event, self.output))
        self.stream.flush()
        if event["event"] == "error":
            self.errors.write(f"devplug demo: {event['message']}\n")
            self.errors.flush()
        elif event["event"] == "interrupted":
            self.errors.write(f"devplug demo: stopped by {event['signal']}, cleaned up\n")
            self.errors.flush()

    def close(self) -> None:
        self.stream.flush()


def id_range(ids: Sequence[str]) -> str:
    """'a' / 'a, b' / 'a .. d (4)': device IDs in a table cell."""
    if len(ids) <= 2:
        return ", ".join(ids) or "-"
    return f"{ids[0]} .. {ids[-1]} ({len(ids)})"


def _relative(path: str, folder: str) -> str:
    """`path` relative to the work folder, for shorter lines."""
    prefix = folder.rstrip("/") + "/"
    return path[len(prefix) :] if path.startswith(prefix) else path


def device_list(devices: Mapping[str, Sequence[str]]) -> list[str]:
    """'resource: id, id' per resource."""
    return [f"{resource}: {', '.join(ids)}" for resource, ids in devices.items()]


class TextView:
    """The story for people: numbered steps, progress lines, tables."""

    def __init__(self, stream: TextIO, errors: TextIO, *, colour: bool = False) -> None:
        self.stream = stream
        self.errors = errors
        self.colour = colour
        # Rows of consecutive table events ("registered", "reregistered"), shown as one
        # aligned table when another kind of event comes.
        self._rows: list[Event] = []
        self._handlers: dict[str, Callable[[Event], list[str]]] = {
            "begin": self._begin,
            "step": self._step,
            "kubelet_started": self._kubelet_started,
            "plugin_started": self._plugin_started,
            "node": self._node,
            "pod": self._pod,
            "shared_device": self._shared_device,
            "pod_deleted": self._pod_deleted,
            "kubelet_restarted": self._kubelet_restarted,
            "restored": self._restored,
            "summary": self._summary,
            "kept": self._kept,
        }

    # -- plumbing ------------------------------------------------------------------------

    def style(self, text: str, *styles: str) -> str:
        if not self.colour or not styles:
            return text
        return "".join(_STYLES[s] for s in styles) + text + _RESET

    def _write(self, lines: Sequence[str], stream: TextIO | None = None) -> None:
        out = self.stream if stream is None else stream
        if lines:
            out.write("\n".join(lines) + "\n")
        out.flush()

    def emit(self, event: Event) -> None:
        kind = event["event"]
        if kind in ("registered", "reregistered"):
            if self._rows and self._rows[0]["event"] != kind:
                self._flush_rows()
            self._rows.append(event)
            return
        self._flush_rows()
        if kind == "error":
            self._write(self._error(event), self.errors)
            return
        if kind == "interrupted":
            line = f"devplug demo: stopped by {event['signal']}; the plugin process and "
            self._write(
                [self.style(line + "the work folder are cleaned up", "yellow")], self.errors
            )
            return
        handler = self._handlers.get(kind)
        if handler is not None:
            self._write(handler(event))

    def close(self) -> None:
        self._flush_rows()

    def _flush_rows(self) -> None:
        if not self._rows:
            return
        rows, self._rows = self._rows, []
        if rows[0]["event"] == "registered":
            header = ["RESOURCE", "PLUGIN SOCKET", "DEVICES", "AFTER START"]
        else:
            header = ["RESOURCE", "PLUGIN SOCKET", "DEVICES", "AFTER RESTART"]
        cells = [[r["resource"], r["socket"], str(r["devices"]), f"{r['ms']:.0f} ms"] for r in rows]
        lines = table(header, cells, STEP_INDENT)
        lines[0] = self.style(lines[0], "bold")
        lines[1:] = [self.style(line, "green") for line in lines[1:]]
        self._write(lines)

    def _wrap(self, text: str, indent: str = "   ", *styles: str) -> list[str]:
        return [
            self.style(line, *styles)
            for line in textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent)
        ]

    # -- events --------------------------------------------------------------------------

    def _begin(self, event: Event) -> list[str]:
        where = "kept at the end (--keep)" if event["keep"] else "removed at the end"
        return [
            self.style(
                "devplug demo: a simulated Kubernetes node with real device plugins",
                "bold",
            ),
            f"work folder: {event['workdir']} ({where})",
        ]

    def _step(self, event: Event) -> list[str]:
        heading = f"{event['number']}. {event['title']}"
        return ["", self.style(heading, "bold", "cyan"), *self._wrap(event["text"], "   ", "dim")]

    def _kubelet_started(self, event: Event) -> list[str]:
        where = _relative(event["registration_socket"], event["workdir"])
        return [f"   kubelet started in {event['ms']:.0f} ms, serving {where}"]

    def _plugin_started(self, event: Event) -> list[str]:
        where = _relative(event["plugin_dir"], event["workdir"])
        lines = [
            f"   plugin process started (pid {event['pid']}): devplug serve --plugin-dir {where}",
            f"   it serves {event['config']}, one plugin socket per resource:",
        ]
        rows = [[r["resource"], r["what"]] for r in event["resources"]]
        lines += table(None, rows, indent="     ")
        lines.append("   each registers (time since the plugin process started):")
        return lines

    def _node(self, event: Event) -> list[str]:
        rows = [
            [r["resource"], str(r["capacity"]), str(r["allocatable"]), id_range(r["devices"])]
            for r in event["resources"]
        ]
        lines = table(["RESOURCE", "CAPACITY", "ALLOCATABLE", "DEVICE IDS"], rows, STEP_INDENT)
        lines[0] = self.style(lines[0], "bold")
        return lines

    def _pod(self, event: Event) -> list[str]:
        name = self.style(f"pod {event['pod']}", "bold")
        lines = ["", f"   {name}"]
        lines += self._wrap(event["story"], "     ", "dim")
        if not event["admitted"]:
            lines.append("     " + self.style(f"rejected: {event['reason']}", "red", "bold"))
            lines += self._wrap(event["message"], "       ", "red")
            return lines
        for container in event["containers"]:
            lines.append(
                "     "
                + self.style("admitted", "green", "bold")
                + f": container {container['name']} gets"
                + ("" if container["state"] == "Started" else f" ({container['state']})")
            )
            lines += [f"       {line}" for line in device_list(container["devices"])]
            lines.append("     the kubelet adds to its CRI CreateContainer request:")
            lines += self._options(container["options"])
        return lines

    def _options(self, options: Mapping[str, Any]) -> list[str]:
        rows: list[tuple[str, list[str]]] = [
            (
                "device nodes",
                [
                    f"{d['host_path']} -> {d['container_path']} ({d['permissions']})"
                    for d in options["devices"]
                ],
            ),
            (
                "mounts",
                [
                    f"{m['host_path']} -> {m['container_path']} "
                    f"({'ro' if m['read_only'] else 'rw'})"
                    for m in options["mounts"]
                ],
            ),
            ("env vars", [f"{kv['name']}={kv['value']}" for kv in options["envs"]]),
            ("annotations", [f"{kv['name']}={kv['value']}" for kv in options["annotations"]]),
            ("CDI devices", list(options["cdi_devices"])),
        ]
        lines = []
        for key, values in rows:
            for i, value in enumerate(values or [self.style("none", "dim")]):
                lines.append(f"       {key if i == 0 else '':<13}{value}")
        return lines

    def _shared_device(self, event: Event) -> list[str]:
        holders = event["holders"]
        pods = " and ".join(h.split("/")[1] for h in holders)
        replicas = " and ".join(holders.values())
        if event["same_device"]:
            text = (
                f"{pods} share one device, {event['devices'][0]}: they hold its replicas "
                f"{replicas}, so both containers get the same device."
            )
            return ["", *self._wrap(text, "   ", "green")]
        text = f"{pods} hold {replicas}: replicas of different devices."
        return ["", *self._wrap(text)]

    def _pod_deleted(self, event: Event) -> list[str]:
        lines = [f"   deleted pod {event['pod']}; its devices are free again:"]
        lines += [f"     {line}" for line in device_list(event["freed"])]
        rows = [
            [
                r["resource"],
                str(r["allocatable"]),
                f"{r['in_use_before']} -> {r['in_use_after']}",
                f"{r['free_before']} -> {r['free_after']}",
            ]
            for r in event["resources"]
        ]
        body = table(["RESOURCE", "ALLOCATABLE", "IN USE", "FREE"], rows, STEP_INDENT)
        body[0] = self.style(body[0], "bold")
        body[1:] = [
            self.style(line, "green") if r["free_after"] > r["free_before"] else line
            for line, r in zip(body[1:], event["resources"], strict=True)
        ]
        return [*lines, *body]

    def _kubelet_restarted(self, event: Event) -> list[str]:
        plugins = [s for s in event["sockets_before"] if s != "kubelet.sock"]
        return [
            f"   kubelet restarted in {event['ms']:.0f} ms: kubelet.sock and the "
            f"{len(plugins)} plugin sockets removed,",
            "   a new kubelet.sock served",
            "   the plugins notice the new kubelet.sock and register again:",
        ]

    def _restored(self, event: Event) -> list[str]:
        before = sum(event["in_use_before"].values())
        after = sum(event["in_use_after"].values())
        same = "kept" if event["in_use_before"] == event["in_use_after"] else "changed"
        text = (
            f"devices in use: {before} before the restart, {after} after ({same}: the "
            "kubelet read them back from its checkpoint)"
        )
        return self._wrap(text)

    def _summary(self, event: Event) -> list[str]:
        text = (
            f"Done in {event['seconds']:.1f} s: {event['registered']} plugins registered, "
            f"{event['admitted']} pods admitted and {event['rejected']} rejected, "
            f"{event['freed']} devices freed by a delete, and all {event['reregistered']} "
            f"plugins back {event['max_reregistration_ms']:.0f} ms at most after a "
            "kubelet restart."
        )
        more = (
            "Run the pieces yourself: `devplug kubelet`, `devplug serve`, `devplug pods`, "
            "`devplug node` (docs/simulator.md, docs/config.md)."
        )
        return [
            "",
            *self._wrap(text, "", "bold", "green"),
            *self._wrap(more, "", "dim"),
        ]

    def _kept(self, event: Event) -> list[str]:
        return [
            f"kept the work folder {event['workdir']}: kubelet.log, plugin.log, the "
            "checkpoint, the pod list and device-plugins/"
        ]

    def _error(self, event: Event) -> list[str]:
        lines = [self.style(f"devplug demo failed: {event['message']}", "red", "bold")]
        stderr = event.get("plugin_stderr")
        if stderr:
            lines.append(self.style("the plugin process's stderr:", "bold"))
            lines += ["  " + line for line in stderr.rstrip("\n").splitlines()]
        return lines
