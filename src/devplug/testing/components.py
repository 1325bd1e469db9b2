"""Kubernetes components of a test's or benchmark's own beside a `ControlPlane`: a
kube-scheduler under a scheduler name of its own, whose client rate can be raised and
whose /metrics can be read, and a kube-controller-manager running only the
resourceclaim controller (claims made from ResourceClaimTemplates, released when their
pod goes), which the throwaway control plane has not.

    scheduler = Component.scheduler(folder, kubeconfig, bin_dir, "mine", qps=500)
    claims = Component.claim_controller(folder, kubeconfig, bin_dir, qps=500)
    for part in (scheduler, claims):
        part.wait_ready()
    ...
    summary = scheduler_summary(parse_metrics(scheduler.metrics()), "mine")
    claims.stop(); scheduler.stop()

Both talk to the API server with the kubeconfig's credentials (the control plane's
admin token) and serve HTTPS on a loopback port of their own, with /metrics open.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from devplug.testing.controlplane import decompress, source_dir

READY_TIMEOUT_S = 60.0
OPEN_PATHS = "/healthz,/readyz,/livez,/metrics"
CLAIM_CONTROLLER = "resourceclaim-controller"
# The scheduler's plugin that allocates claims.
DRA_PLUGIN = "DynamicResources"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _insecure() -> ssl.SSLContext:
    """The components' self-signed serving certificates, on loopback."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def controller_manager_binary(root: Path, bin_dir: Path) -> Path | None:
    """kube-controller-manager decompressed into `bin_dir` from the control plane's
    folder; None where that folder has none."""
    name = ("kube-controller-manager",)
    source = source_dir(root, name)
    if source is None:
        return None
    decompress(source, bin_dir, name)
    return bin_dir / name[0]


class Component:
    """One kube-scheduler or kube-controller-manager process, its log in its folder."""

    def __init__(self, name: str, command: list[str], folder: Path, port: int) -> None:
        self.name = name
        self.port = port
        self.log_path = folder / f"{name}.log"
        self._log: IO[bytes] = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    def scheduler(
        cls,
        folder: Path,
        kubeconfig: str,
        bin_dir: Path,
        scheduler_name: str,
        qps: float | None = None,
        burst: int | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> Component:
        """A kube-scheduler that schedules only pods naming `scheduler_name`; its API
        client's rate is `qps`/`burst` (clientConnection in its config; the
        scheduler's own defaults, 50 and 100, when None); `settings`: more top-level
        keys of its KubeSchedulerConfiguration (extenders, percentageOfNodesToScore)."""
        folder.mkdir(parents=True, exist_ok=True)
        limits = ""
        if qps is not None:
            limits += f"\n  qps: {qps}"
        if burst is not None or qps is not None:
            limits += f"\n  burst: {burst if burst is not None else int(qps or 50) * 2}"
        config = folder / f"{scheduler_name}-scheduler.yaml"
        config.write_text(
            "apiVersion: kubescheduler.config.k8s.io/v1\n"
            "kind: KubeSchedulerConfiguration\n"
            f"clientConnection:\n  kubeconfig: {kubeconfig}{limits}\n"
            "leaderElection:\n  leaderElect: false\n"
            f"profiles:\n  - schedulerName: {scheduler_name}\n"
        )
        if settings:
            import yaml

            with config.open("a") as handle:
                yaml.safe_dump(dict(settings), handle, sort_keys=False)
        port = _free_port()
        command = [
            str(bin_dir / "kube-scheduler"),
            f"--config={config}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--authorization-always-allow-paths={OPEN_PATHS}",
        ]
        return cls("kube-scheduler", command, folder, port)

    @classmethod
    def claim_controller(
        cls,
        folder: Path,
        binary: Path,
        kubeconfig: str,
        qps: float | None = None,
        burst: int | None = None,
    ) -> Component:
        """kube-controller-manager with only the resourceclaim controller; its API
        client's rate is `qps`/`burst` (its own defaults, 20 and 30, when None)."""
        folder.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        command = [
            str(binary),
            f"--kubeconfig={kubeconfig}",
            f"--controllers={CLAIM_CONTROLLER}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--authorization-always-allow-paths={OPEN_PATHS}",
        ]
        if qps is not None:
            command.append(f"--kube-api-qps={qps}")
            command.append(f"--kube-api-burst={burst if burst is not None else int(qps) * 2}")
        return cls("kube-controller-manager", command, folder, port)

    def _get(self, path: str) -> str:
        url = f"https://127.0.0.1:{self.port}{path}"
        with urllib.request.urlopen(url, context=_insecure(), timeout=30) as response:
            text: str = response.read().decode()
            return text

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Until /healthz answers; RuntimeError, with the log's end, if the process
        exits or the time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log_tail()}")
            try:
                self._get("/healthz")
                return
            except OSError:
                time.sleep(0.2)  # polling a process's health endpoint: nothing to wait on
        raise RuntimeError(f"{self.name} did not get ready in {timeout:g} s: {self.log_tail()}")

    def metrics(self) -> str:
        """Its /metrics, as text."""
        return self._get("/metrics")

    def log_tail(self, lines: int = 5) -> str:
        self._log.flush()
        return " | ".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def parse_metrics(text: str) -> Samples:
    """Every sample of an exposition: (sample name, its labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _total(samples: Samples, name: str, **labels: str) -> float | None:
    """The sum of the samples `name` whose labels include `labels`; None if none."""
    wanted = set(labels.items())
    found = [v for (n, ls), v in samples.items() if n == name and wanted <= ls]
    return sum(found) if found else None


def _mean_ms(samples: Samples, name: str, **labels: str) -> float | None:
    total, count = (
        _total(samples, f"{name}_sum", **labels),
        _total(samples, f"{name}_count", **labels),
    )
    if total is None or not count:
        return None
    return round(total / count * 1000, 3)


def scheduler_summary(samples: Samples, profile: str) -> dict[str, Any]:
    """What a scheduler's own metrics say of the pods of `profile`: attempts by
    result, the mean attempt and end-to-end (SLI) scheduling durations, and the
    DynamicResources plugin's evaluations and sampled execution time per extension
    point. A key is absent where the scheduler has no such series (yet)."""
    summary: dict[str, Any] = {}
    for result in ("scheduled", "unschedulable", "error"):
        found = _total(samples, "scheduler_schedule_attempts_total", profile=profile, result=result)
        if found is not None:
            summary[result] = found
    attempt = _mean_ms(
        samples,
        "scheduler_scheduling_attempt_duration_seconds",
        profile=profile,
        result="scheduled",
    )
    if attempt is not None:
        summary["attempt_mean_ms"] = attempt
    sli = _total(samples, "scheduler_pod_scheduling_sli_duration_seconds_count")
    if sli is not None:
        summary["sli_pods"] = sli
        summary["sli_mean_ms"] = _mean_ms(samples, "scheduler_pod_scheduling_sli_duration_seconds")
    plugin: dict[str, Any] = {}
    for (name, labels), value in samples.items():
        fields = dict(labels)
        if fields.get("plugin") != DRA_PLUGIN or fields.get("profile", profile) != profile:
            continue
        point = fields.get("extension_point", "")
        if name == "scheduler_plugin_evaluation_total":
            entry = plugin.setdefault(point, {})
            entry["evaluations"] = entry.get("evaluations", 0) + value
    for point, entry in plugin.items():
        mean = _mean_ms(
            samples,
            "scheduler_plugin_execution_duration_seconds",
            plugin=DRA_PLUGIN,
            extension_point=point,
        )
        if mean is not None:
            entry["sampled_mean_ms"] = mean
    if plugin:
        summary["dra_plugin"] = plugin
    return summary


def client_summary(samples: Samples) -> dict[str, Any]:
    """What a component's API client (client-go) says of itself: requests by method,
    and the time requests waited on its own rate limiter (qps/burst) before going out."""
    requests: dict[str, float] = {}
    for (name, labels), value in samples.items():
        if name == "rest_client_requests_total":
            method = dict(labels).get("method", "")
            requests[method] = requests.get(method, 0) + value
    waited = _total(samples, "rest_client_rate_limiter_duration_seconds_sum")
    return {
        "requests": requests,
        "rate_limiter_wait_s": round(waited, 3) if waited is not None else None,
    }


def claim_controller_summary(samples: Samples) -> dict[str, float]:
    """What the resourceclaim controller's metrics say: claims created (by result where
    the series are split) and the claims it sees."""
    summary: dict[str, float] = {}
    for (name, labels), value in samples.items():
        if not name.startswith("resourceclaim_controller_"):
            continue
        key = name.removeprefix("resourceclaim_controller_")
        suffix = ",".join(f"{k}={v}" for k, v in sorted(labels))
        summary[f"{key}{{{suffix}}}" if suffix else key] = value
    return summary
