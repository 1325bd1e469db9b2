"""NVIDIA GPUs through NVML: discovery, MIG, time-slicing, Xid health that recovers,
topology-aware preferred allocation and node labels.

Modules, in the order data flows (the `nvidia:` block and NVIDIA's own config file
are devplug.config's `nvidia`, `nvidiacheck` and `nvidiafile`): `nvml` (every NVML
call, behind one small interface), `blocking` (calls off the loop with timeouts),
`discovery` (units, resource names, Devices), `health` (the Xid thread), `source`
(retries and health state), `topology`, `labels`, `plugin`. Nothing here imports
the NVML binding until a resource with an `nvidia:` block is served.
"""
