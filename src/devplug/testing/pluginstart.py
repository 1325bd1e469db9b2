"""Starting plugins against the kubelet harness, as processes: plugin objects and
references (`devplug.run` in a child), scripts, modules, any command, and `devplug
serve` with a config; each with its own log file."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

import yaml

from devplug.ground.process import ChildProcess
from devplug.testing.pluginprocess import OUTPUT_TAIL, PluginProcess

if TYPE_CHECKING:
    from devplug.framework.plugin import Plugin
    from devplug.simulator import ResourceStatus

T = TypeVar("T")


class PluginStarter:
    """The plugin side of KubeletHarness: its folders, processes and loop calls."""

    root: Path
    plugin_dir: Path
    log_dir: Path
    processes: list[PluginProcess]
    _files: itertools.count[int]
    timeout: float

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        raise NotImplementedError

    def _sync(self, fn: Callable[[], T]) -> T:
        raise NotImplementedError

    def wait_for_resource(
        self,
        name: str,
        *,
        count: int | None = None,
        capacity: int | None = None,
        timeout: float | None = None,
    ) -> ResourceStatus:
        raise NotImplementedError

    def _env(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        env = dict(os.environ)
        # The child imports what this process can: the test's own modules included.
        paths = [p or os.getcwd() for p in sys.path]
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        env["PLUGIN_DIR"] = str(self.plugin_dir)
        env["DEVPLUG_PLUGIN_DIR"] = str(self.plugin_dir)
        env.update(extra or {})
        return env

    def _spawn(
        self,
        args: Sequence[str],
        name: str,
        resources: Sequence[str],
        env: Mapping[str, str] | None,
        cwd: Path | str | None,
    ) -> PluginProcess:
        index = next(self._files)
        log_path = self.log_dir / f"{index}-{_safe(name)}.log"

        async def spawn(log: IO[bytes]) -> ChildProcess:
            return ChildProcess(
                args, env=self._env(env), cwd=cwd, stdout=log, stderr=subprocess.STDOUT
            )

        with open(log_path, "wb") as log:
            child = self._call(spawn(log))
        process = PluginProcess(self, child, name, log_path, resources)
        self.processes.append(process)
        return process

    def _after_start(
        self, process: PluginProcess, wait_for: Sequence[str], timeout: float | None
    ) -> PluginProcess:
        for resource in wait_for:
            self.wait_for_resource(resource, timeout=timeout)
        return process

    def start_plugin(
        self,
        *plugins: Plugin | str,
        wait: bool = True,
        env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None,
        timeout: float | None = None,
    ) -> PluginProcess:
        """Serve plugins in a new process (`devplug.run`) against this kubelet.

        Each of `plugins` is a `Plugin` object (sent to the process by pickle: its class
        must be importable there, i.e. defined at the top level of a module), or a
        reference `"module:attribute"` / `"path/to/file.py:attribute"` to a Plugin, a
        Plugin subclass or a function returning plugins, resolved in the new process.
        With `wait`, returns once every resource is registered and its devices listed.
        """
        from devplug.framework.plugin import Plugin
        from devplug.testing.runner import dump_plugins, resolve

        if not plugins:
            raise ValueError("start_plugin needs at least one plugin")
        objects = [p for p in plugins if isinstance(p, Plugin)]
        references = [p for p in plugins if not isinstance(p, Plugin)]
        specs: list[str] = []
        resources = [p.resource_name for p in objects]
        if objects:
            path = self.root / f"plugins-{next(self._files)}.pickle"
            path.write_bytes(dump_plugins(objects))
            specs.append(f"@{path}")
        for reference in references:
            if not isinstance(reference, str):
                raise TypeError(f"expected a Plugin or a 'module:attribute' string: {reference!r}")
            # Resolved here too, for the resource names to wait for.
            resources += [p.resource_name for p in resolve(reference)]
            specs.append(reference)
        name = ",".join(resources) or "plugins"
        args = [
            sys.executable,
            "-m",
            "devplug.testing.runner",
            "--plugin-dir",
            str(self.plugin_dir),
            *specs,
        ]
        process = self._spawn(args, name, resources, env, cwd)
        return self._after_start(process, resources if wait else (), timeout)

    def start_script(
        self,
        script: Path | str,
        *args: str,
        wait_for: str | Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None,
        timeout: float | None = None,
    ) -> PluginProcess:
        """Run a plugin program, `python SCRIPT ARGS`, as it runs on a node. It finds the
        plugin folder in `$PLUGIN_DIR` (also `$DEVPLUG_PLUGIN_DIR`). Returns once the
        resources of `wait_for` are registered and listed."""
        command = [sys.executable, str(script), *args]
        return self._start_program(command, Path(script).name, wait_for, env, cwd, timeout)

    def start_module(
        self,
        module: str,
        *args: str,
        wait_for: str | Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None,
        timeout: float | None = None,
    ) -> PluginProcess:
        """`python -m MODULE ARGS`, otherwise as `start_script`."""
        command = [sys.executable, "-m", module, *args]
        return self._start_program(command, module, wait_for, env, cwd, timeout)

    def start_command(
        self,
        command: Sequence[str],
        *,
        name: str = "",
        wait_for: str | Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None,
        timeout: float | None = None,
    ) -> PluginProcess:
        """Run any command that serves plugins in this kubelet's folder (a plugin in a
        container's root file system, a binary); otherwise as `start_script`."""
        label = name or Path(command[0]).name
        return self._start_program(list(command), label, wait_for, env, cwd, timeout)

    def _start_program(
        self,
        command: list[str],
        name: str,
        wait_for: str | Sequence[str],
        env: Mapping[str, str] | None,
        cwd: Path | str | None,
        timeout: float | None,
    ) -> PluginProcess:
        resources = [wait_for] if isinstance(wait_for, str) else list(wait_for)
        process = self._spawn(command, name, resources, env, cwd)
        return self._after_start(process, resources, timeout)

    def start_serve(
        self,
        config: Path | str | Mapping[str, Any],
        *args: str,
        wait: bool = True,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> PluginProcess:
        """`devplug serve --config CONFIG --plugin-dir <this kubelet's>`: `config` is a
        file, YAML text (a string with a newline) or a mapping. With `wait`, the config is
        checked first (ConfigError) and the call returns once all its resources are
        registered and listed."""
        if isinstance(config, Mapping) or (isinstance(config, str) and "\n" in config):
            text = config if isinstance(config, str) else yaml.safe_dump(dict(config))
            path = self.root / f"config-{next(self._files)}.yaml"
            path.write_text(text)
        else:
            path = Path(config)
        resources: list[str] = []
        if wait:
            from devplug.sources import load_config, resource_names

            resources = resource_names(load_config(path))
        command = [
            sys.executable,
            "-m",
            "devplug.cli.main",
            "serve",
            "--config",
            str(path),
            "--plugin-dir",
            str(self.plugin_dir),
            *args,
        ]
        process = self._spawn(command, f"serve {path.name}", resources, env, None)
        return self._after_start(process, resources, timeout)

    def plugin_outputs(self) -> str:
        """Every plugin process's command line, exit status and output, for reports."""
        parts = []
        for process in self.processes:
            code = process._child.returncode
            state = "running" if code is None else f"exited with status {code}"
            parts.append(
                f"--- {process.name} (pid {process.pid}, {state}): {' '.join(process.args)}\n"
                + process.output[-OUTPUT_TAIL:]
            )
        return "\n".join(parts)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:60]
