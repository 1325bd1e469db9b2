"""The five-minute proof on a host with NVIDIA GPUs, no Kubernetes needed: what devplug
sees against what the driver's own tools say, and each Allocate answer used for real.

    tools/gpu-check.sh                       # the real driver; a JSON report at the end
    tools/gpu-check.sh --mps                 # also MPS (sets EXCLUSIVE_PROCESS while it runs)
    tools/gpu-check.sh --fake                # the fake NVML (8 GPUs), to try the check anywhere

Steps, each a section of the report (`--report FILE`, JSON):
1. preflight: Python, devplug, pynvml's path and version, the libnvidia-ml it loaded,
   nvmlInit's time, the driver, persistence mode per GPU (off: every start is slow);
2. compare: `devplug gpus --output json` field by field against `nvidia-smi
   --query-gpu=...`, and, where MIG is on, its profile names against `nvidia-smi -L`;
3. allocate: `devplug serve` (`nvidia: {}`) against the kubelet simulator; for each
   GPU a pod gets one, and a process started with that answer's environment (as the
   container toolkit would expose NVIDIA_VISIBLE_DEVICES: as CUDA_VISIBLE_DEVICES) must
   see exactly that GPU through the CUDA driver API (cuInit, cuDeviceGetCount,
   cuDeviceGetUuid); the device nodes of the answer must exist;
4. health: the devices watched for `--watch-seconds` (60): none may turn Unhealthy;
5. time-slicing: 2 replicas per GPU, two pods on one GPU, both see it;
6. mps (with --mps): 2 MPS replicas per GPU; a process with the answer's environment
   sees its memory limit (cuMemGetInfo);
7. latency: Allocate of one GPU, p50/p99.

It never changes MIG mode or any GPU setting, except the compute mode MPS needs, and
only with --mps (given back afterwards). It needs devplug's runtime dependencies only
(no test extras): `tools/gpu-check.sh` makes a virtual environment with them when the
repository has none.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import grpc
import yaml

from devplug.api.v1beta1 import api_pb2 as pb
from devplug.api.v1beta1 import api_pb2_grpc as pb_grpc
from devplug.testing import KubeletHarness

GPU = "nvidia.com/gpu"
ALLOCATE_CALLS = 200
SMI_FIELDS = "index,uuid,name,memory.total,pci.bus_id,compute_cap,mig.mode.current"

# Run in a child process with an Allocate answer's environment: what CUDA sees.
CUDA_PROBE = r"""
import ctypes, json, sys
out = {}
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError as error:
    print(json.dumps({"error": f"libcuda.so.1: {error}"})); sys.exit()
def check(name, code):
    if code:
        text = ctypes.c_char_p()
        cuda.cuGetErrorString(code, ctypes.byref(text))
        print(json.dumps({"error": f"{name}: {code} {(text.value or b'').decode()}"}))
        sys.exit()
check("cuInit", cuda.cuInit(0))
count = ctypes.c_int()
check("cuDeviceGetCount", cuda.cuDeviceGetCount(ctypes.byref(count)))
get_uuid = getattr(cuda, "cuDeviceGetUuid_v2", None) or cuda.cuDeviceGetUuid
uuids, totals = [], []
for i in range(count.value):
    device = ctypes.c_int()
    check("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(device), i))
    raw = (ctypes.c_ubyte * 16)()
    check("cuDeviceGetUuid", get_uuid(raw, device))
    uuids.append(bytes(raw).hex())
    if "--memory" in sys.argv:
        context = ctypes.c_void_p()
        check("cuCtxCreate", cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device))
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        check("cuMemGetInfo", cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)))
        totals.append(total.value)
        cuda.cuCtxDestroy_v2(context)
print(json.dumps({"count": count.value, "uuids": uuids, "memory": totals}))
"""


class Report:
    """The sections of the JSON report, and the problems found (each a line)."""

    def __init__(self) -> None:
        self.sections: dict[str, Any] = {}
        self.problems: list[str] = []

    def section(self, name: str, body: Any) -> None:
        self.sections[name] = body

    def problem(self, text: str) -> None:
        self.problems.append(text)
        print(f"  PROBLEM: {text}")

    def document(self) -> dict[str, Any]:
        return {"ok": not self.problems, "problems": self.problems, **self.sections}


def say(text: str) -> None:
    print(text, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fake", action="store_true", help="use the fake NVML (8 GPUs)")
    parser.add_argument("--mps", action="store_true", help="also check MPS sharing")
    parser.add_argument(
        "--watch-seconds", type=float, default=60.0, help="how long health is watched"
    )
    parser.add_argument("--report", default="gpu-check.json", help="where the JSON report goes")
    args = parser.parse_args()
    report = Report()
    with (
        tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp,
        fake_host(args, Path(tmp)) as host,
    ):
        root, env, host_root = Path(tmp), host[0], host[1]
        steps: list[tuple[str, Callable[[], Any]]] = [
            ("preflight", lambda: preflight(env, report)),
            ("compare", lambda: compare(env, host_root, report)),
            ("serve", lambda: served(root, env, host_root, args, report)),
        ]
        for name, step in steps:
            say(f"== {name}")
            try:
                report.section(name, step())
            except Exception as error:  # one step failing does not hide the others
                report.problem(f"{name}: {type(error).__name__}: {error}")
    Path(args.report).write_text(json.dumps(report.document(), indent=2) + "\n")
    say(f"== report {args.report}: {'OK' if not report.problems else 'PROBLEMS'}")
    for line in report.problems:
        say(f"  {line}")
    return 0 if not report.problems else 1


@contextlib.contextmanager
def fake_host(args: argparse.Namespace, root: Path) -> Iterator[tuple[dict[str, str], str]]:
    """(the environment devplug runs in, the host root): the real host, or the fake
    NVML's 8 GPUs with a stand-in nvidia-smi first on PATH."""
    if not args.fake:
        yield {}, "/"
        return
    from devplug.fakes.gpus import FakeGpuHost, eight_gpus, gpu
    from devplug.fakes.mps import script as mps_script
    from devplug.fakes.smi import script as smi_script

    description = eight_gpus()
    # GPU 7 in MIG mode: its names are compared with the published profile table.
    links = description["gpus"][7]["nvlinks"]
    description["gpus"][7] = gpu(7, numa=1, mig=["3g.40gb", "2g.20gb", "1g.10gb+me"])
    description["gpus"][7]["nvlinks"] = links
    host = FakeGpuHost(root / "fake", description)
    bin_dir = root / "bin"
    smi_script(bin_dir)
    mps_script(bin_dir)
    yield {**host.env, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}, host.host_root


def child_env(env: dict[str, str], extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, **env, **(extra or {})}


# -- 1. preflight ---------------------------------------------------------------------------


def preflight(env: dict[str, str], report: Report) -> dict[str, Any]:
    os.environ.update(env)  # the NVML module devplug loads (the fake with --fake)
    module_name = os.environ.get("DEVPLUG_NVML_MODULE") or "pynvml"
    lib: Any = importlib.import_module(module_name)
    body: dict[str, Any] = {
        "python": sys.version.split()[0],
        "devplug": _version("devplug"),
        "nvmlModule": module_name,
        "nvmlModulePath": getattr(lib, "__file__", ""),
        "nvidiaMlPy": _version("nvidia-ml-py"),
    }
    started = time.perf_counter()
    try:
        lib.nvmlInit()
    except Exception as error:
        report.problem(f"nvmlInit failed: {error}")
        return body
    body["nvmlInitMs"] = round((time.perf_counter() - started) * 1000, 1)
    body["libnvidiaMl"] = _loaded("libnvidia-ml") or ("(fake)" if module_name != "pynvml" else "")
    if module_name == "pynvml" and not body["libnvidiaMl"]:
        report.problem("libnvidia-ml is not among the loaded libraries")
    try:
        body["driver"] = _text(lib.nvmlSystemGetDriverVersion())
        count = int(lib.nvmlDeviceGetCount())
        persistence = {}
        for i in range(count):
            handle = lib.nvmlDeviceGetHandleByIndex(i)
            try:
                on = int(lib.nvmlDeviceGetPersistenceMode(handle)) == lib.NVML_FEATURE_ENABLED
            except lib.NVMLError as error:
                persistence[i] = f"unknown ({error})"
                continue
            persistence[i] = "on" if on else "off"
        body["gpus"] = count
        body["persistenceMode"] = persistence
    finally:
        lib.nvmlShutdown()
    say(f"  {module_name} {body['nvidiaMlPy']} ({body['nvmlModulePath']})")
    say(f"  libnvidia-ml: {body['libnvidiaMl']}; nvmlInit {body['nvmlInitMs']} ms")
    say(f"  driver {body['driver']}, {body['gpus']} GPU(s), persistence {persistence}")
    if any(v == "off" for v in persistence.values()):
        say(
            "  note: persistence mode off: each NVML start wakes the GPUs (slow); "
            "nvidia-persistenced or `nvidia-smi -pm 1` keeps them up"
        )
    return body


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "(not installed)"


def _loaded(name: str) -> str:
    with contextlib.suppress(OSError), open("/proc/self/maps") as maps:
        for line in maps:
            if name in line and "/" in line:
                return line.split(maxsplit=5)[-1].strip()
    return ""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# -- 2. compare with nvidia-smi ----------------------------------------------------------------


def devplug_gpus(env: dict[str, str], host_root: str) -> dict[str, Any]:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "devplug.cli.main",
            "gpus",
            "--output",
            "json",
            "--host-root",
            host_root,
        ],
        env=child_env(env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if result.returncode != 0:
        raise RuntimeError(f"devplug gpus exited {result.returncode}: {result.stderr.strip()}")
    [source] = json.loads(result.stdout)["sources"]
    nvml: dict[str, Any] = source["nvml"]
    return nvml


def smi(env: dict[str, str], *args: str) -> list[str]:
    result = subprocess.run(
        ["nvidia-smi", *args], env=child_env(env), capture_output=True, text=True, timeout=60
    )
    if result.returncode != 0:
        raise RuntimeError(f"nvidia-smi {' '.join(args)}: {result.stderr.strip()}")
    return [line for line in result.stdout.splitlines() if line.strip()]


def bus(address: str) -> str:
    """'00000000:18:00.0' (nvidia-smi) and '0000:18:00.0' (sysfs) compare equal."""
    domain, _, rest = address.lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}"


def compare(env: dict[str, str], host_root: str, report: Report) -> dict[str, Any]:
    if shutil.which("nvidia-smi", path=child_env(env).get("PATH")) is None:
        report.problem("nvidia-smi is not on PATH: nothing to compare with")
        return {}
    nvml = devplug_gpus(env, host_root)
    ours = {g["index"]: g for g in nvml["gpus"]}
    rows = {}
    for line in smi(env, f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"):
        index, uuid, name, memory, address, cc, mig = (v.strip() for v in line.split(","))
        rows[int(index)] = {
            "uuid": uuid,
            "model": name,
            "memoryMiB": int(memory),
            "pciAddress": bus(address),
            "computeCapability": cc,
            "mig": {"Enabled": "on"}.get(mig, "off"),
        }
    checked = 0
    for index, theirs in rows.items():
        mine = ours.get(index)
        if mine is None:
            report.problem(f"GPU {index}: nvidia-smi shows it, devplug does not")
            continue
        for key, value in theirs.items():
            got = bus(mine[key]) if key == "pciAddress" else mine[key]
            if key == "mig" and got == "capable":
                got = "off"
            checked += 1
            if got != value:
                report.problem(f"GPU {index} {key}: devplug {got!r}, nvidia-smi {value!r}")
    if set(ours) - set(rows):
        report.problem(f"GPUs {sorted(set(ours) - set(rows))}: devplug shows, nvidia-smi does not")
    say(f"  {len(rows)} GPU(s), {checked} fields compared with nvidia-smi")
    profiles = mig_names(env)
    for g in nvml["gpus"]:
        for device in g["migDevices"]:
            theirs_name = profiles.get(device["uuid"])
            checked += 1
            if theirs_name != device["profile"]:
                report.problem(
                    f"MIG device {device['uuid']}: devplug {device['profile']!r}, "
                    f"nvidia-smi -L {theirs_name!r}"
                )
    if profiles:
        say(f"  {len(profiles)} MIG device(s) named as nvidia-smi -L names them")
    return {"gpus": rows, "migProfiles": profiles, "fieldsCompared": checked}


_MIG_LINE = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+\d+:\s+\(UUID:\s+(MIG-[^)\s]+)\)")


def mig_names(env: dict[str, str]) -> dict[str, str]:
    """MIG UUID -> profile name, from `nvidia-smi -L`."""
    return {m[2]: m[1] for line in smi(env, "-L") if (m := _MIG_LINE.match(line))}


# -- 3-7. served: allocate and use, health, time-slicing, MPS, latency -----------------------


def served(
    root: Path, env: dict[str, str], host_root: str, args: argparse.Namespace, report: Report
) -> dict[str, Any]:
    body: dict[str, Any] = {}
    features = root / "features.d" / "devplug"
    nvidia: dict[str, Any] = {"hostRoot": host_root}
    config = {"nodeFeatures": {"path": str(features)}, "resources": [{"nvidia": nvidia}]}
    with KubeletHarness(timeout=60) as kubelet:
        serve = kubelet.start_serve(yaml.safe_dump(config), env=env)
        status = kubelet.wait_for_resource(GPU)
        say(f"== allocate: {status.capacity} device(s), {status.allocatable} allocatable")
        if not status.allocatable:
            report.problem("no GPU to allocate")
            say(serve.output.rstrip())
            return body
        # One pod per GPU, all held at once: each GPU's answer is used.
        body["allocate"] = [
            allocate_one(kubelet, host_root, args.fake, report) for _ in range(status.allocatable)
        ]
        for record in body["allocate"]:
            kubelet.delete(record["pod"])
        say(f"== health: watching {args.watch_seconds:g} s")
        body["health"] = watch_health(kubelet, args.watch_seconds, report)
        say("== latency")
        pod = kubelet.admit({GPU: 1})
        [uuid] = pod.devices()[GPU]
        body["latency"] = allocate_latency(kubelet.plugin_dir, uuid)
        kubelet.delete(pod)
        say(f"  {body['latency']}")
        kubelet.wait_until(features.exists, what="the labels file")
        body["labels"] = features.read_text().splitlines()
        serve.stop()
        say("== time-slicing: 2 replicas per GPU")
        body["timeSlicing"] = shared(kubelet, config, env, args.fake, report, {"replicas": 2})
        if args.mps:
            say("== mps: 2 replicas per GPU")
            mps: dict[str, Any] = {"sharing": "mps", "replicas": 2}
            if args.fake:
                mps["mps"] = {"root": str(root / "mps"), "control": "nvidia-cuda-mps-control"}
            body["mps"] = shared(kubelet, config, env, args.fake, report, mps)
    return body


def allocate_one(
    kubelet: KubeletHarness, host_root: str, fake: bool, report: Report
) -> dict[str, Any]:
    pod = kubelet.admit({GPU: 1})
    if not pod.admitted:
        report.problem(f"pod {pod.name} not admitted: {pod.message}")
        return {"pod": pod.name, "admitted": False}
    [uuid] = pod.devices()[GPU]
    env = pod.env()
    nodes = pod.device_nodes()
    missing = [h for h in nodes.values() if not os.path.exists(host_path(host_root, h))]
    for path in missing:
        report.problem(f"{uuid}: device node {path} of the answer does not exist")
    seen = cuda_sees(env, fake)
    if seen.get("uuids") is not None and seen["uuids"] != [uuid_hex(uuid)]:
        report.problem(f"{uuid}: a process with the answer's environment sees {seen}")
    if "error" in seen:
        report.problem(f"{uuid}: CUDA in a process with the answer's environment: {seen}")
    say(f"  {pod.name}: {uuid} env {env} nodes {len(nodes)} cuda {seen}")
    return {"pod": pod.name, "device": uuid, "env": env, "nodes": nodes, "cuda": seen}


def host_path(root: str, path: str) -> str:
    return path if root == "/" else root + path


def uuid_hex(uuid: str) -> str:
    """'GPU-0b1c...-...' -> the 32 hex digits CUDA gives (cuDeviceGetUuid)."""
    return uuid.partition("-")[2].replace("-", "").lower()


def cuda_sees(env: dict[str, str], fake: bool, memory: bool = False) -> dict[str, Any]:
    """What CUDA sees in a process with an Allocate answer's environment: the container
    toolkit would expose the NVIDIA_VISIBLE_DEVICES GPUs; here CUDA_VISIBLE_DEVICES does."""
    if fake:
        return {"skipped": "no CUDA with the fake NVML"}
    visible = {"CUDA_VISIBLE_DEVICES": env.get("NVIDIA_VISIBLE_DEVICES", "")}
    args = [sys.executable, "-c", CUDA_PROBE] + (["--memory"] if memory else [])
    result = subprocess.run(
        args, env={**os.environ, **env, **visible}, capture_output=True, text=True, timeout=120
    )
    try:
        seen: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        seen = {"error": result.stderr.strip()[-300:] or f"exit {result.returncode}"}
    return seen


def watch_health(kubelet: KubeletHarness, seconds: float, report: Report) -> dict[str, Any]:
    """Every device-list event for `seconds`: an Unhealthy GPU is a problem (nothing is
    wrong with a GPU that is being checked)."""
    start = kubelet.last_event_seq
    deadline = time.monotonic() + seconds
    with contextlib.suppress(TimeoutError):
        kubelet.wait_until(
            lambda: bool(kubelet.device_ids(GPU, healthy=False)),
            timeout=max(seconds, 0.001),
            what="an Unhealthy GPU",
        )
    unhealthy = kubelet.device_ids(GPU, healthy=False)
    events = [e.detail for e in kubelet.events() if e.seq > start and e.kind == "devices"]
    if unhealthy:
        report.problem(f"turned Unhealthy while watched: {unhealthy}")
    left = deadline - time.monotonic()
    return {"seconds": seconds, "unhealthy": unhealthy, "events": events, "early": left > 0}


def shared(
    kubelet: KubeletHarness,
    config: dict[str, Any],
    env: dict[str, str],
    fake: bool,
    report: Report,
    sharing: dict[str, Any],
) -> dict[str, Any]:
    entry = dict(config["resources"][0]["nvidia"]) | sharing
    text = yaml.safe_dump({"resources": [{"nvidia": entry}]})
    process = kubelet.start_serve(text, env=env)
    status = kubelet.wait_for_resource(GPU)
    gpus = status.capacity // 2
    body: dict[str, Any] = {"capacity": status.capacity}
    with contextlib.suppress(TimeoutError):
        kubelet.wait_for_resource(GPU, count=status.capacity, timeout=30)
    pods = [kubelet.admit({GPU: 1}) for _ in range(2)]
    body["pods"] = []
    memory = {
        g["uuid"]: g["memoryMiB"] * 2**20 for g in devplug_gpus(env, entry["hostRoot"])["gpus"]
    }
    for pod in pods:
        if not pod.admitted:
            report.problem(f"{sharing}: pod {pod.name} not admitted: {pod.message}")
            continue
        [replica] = pod.devices()[GPU]
        env_of = pod.env()
        mps = sharing.get("sharing") == "mps"
        # The container's paths (the MPS pipe folder) are the mounts' host paths here.
        mounts = pod.mounts()
        on_host = {k: mounts.get(v, v) for k, v in env_of.items()}
        seen = cuda_sees(on_host, fake, memory=mps)
        total = memory.get(replica.partition("::")[0], 0)
        if mps and seen.get("memory") and total:
            allowed = total // 2  # 2 replicas per GPU: the daemon's limit per client
            if seen["memory"][0] > allowed * 1.01:
                report.problem(f"{replica}: CUDA sees {seen['memory'][0]} B, MPS limit {allowed}")
        if "error" in seen:
            report.problem(f"{sharing}: {replica}: CUDA: {seen}")
        say(f"  {pod.name}: {replica} env {env_of} cuda {seen}")
        body["pods"].append({"device": replica, "env": env_of, "cuda": seen})
        kubelet.delete(pod)
    if status.capacity != 2 * gpus or not gpus:
        report.problem(f"{sharing}: {status.capacity} replicas served")
    process.stop()
    return body


def allocate_latency(plugin_dir: Path, uuid: str) -> dict[str, float]:
    socket = plugin_dir / ("devplug-" + GPU.replace("/", "-") + ".sock")
    request = pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=[uuid])]
    )
    samples = []
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = pb_grpc.DevicePluginStub(channel)
        stub.Allocate(request, wait_for_ready=True, timeout=10)
        for _ in range(ALLOCATE_CALLS):
            started = time.perf_counter()
            stub.Allocate(request, timeout=10)
            samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return {
        "p50Ms": round(samples[len(samples) // 2], 3),
        "p99Ms": round(samples[int(len(samples) * 0.99)], 3),
        "maxMs": round(samples[-1], 3),
    }


if __name__ == "__main__":
    sys.exit(main())
