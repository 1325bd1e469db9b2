"""Fixed names and paths of the kubelet's DRA and plugin-registration APIs."""

from typing import Final

PLUGINS_REGISTRY_PATH: Final = "/var/lib/kubelet/plugins_registry"
PLUGINS_PATH: Final = "/var/lib/kubelet/plugins"
CDI_PATH: Final = "/var/run/cdi"
DRA_SOCKET: Final = "dra.sock"
# PluginInfo.type of a DRA driver. Its supported_versions name every gRPC service the
# driver offers as "<proto package>.<service>": the kubelet picks the DRA service from
# them, and calls the device health service only when one of its names is listed.
DRA_PLUGIN_TYPE: Final = "DRAPlugin"
V1: Final = "v1.DRAPlugin"
V1BETA1: Final = "v1beta1.DRAPlugin"
# The device health service: v1 since Kubernetes 1.37, which a kubelet that knows it
# prefers; v1alpha1, the only version in 1.36, served beside it (the same messages)
# until the kubelets that know only v1alpha1 are gone (upstream drops it around 1.40).
HEALTH_V1: Final = "v1.DRAResourceHealth"
HEALTH_V1ALPHA1: Final = "v1alpha1.DRAResourceHealth"
# The kubelet takes the first DRA service of this list that it knows: v1 first.
SUPPORTED_VERSIONS: Final = (V1, V1BETA1, HEALTH_V1, HEALTH_V1ALPHA1)
# The resource.k8s.io API group and the limits of its objects.
RESOURCE_GROUP: Final = "resource.k8s.io"
RESOURCE_API_VERSION: Final = "resource.k8s.io/v1"
# Where its objects are on the API server (namespaced ones under namespaces/NS/ of it).
RESOURCE_API_PATH: Final = f"/apis/{RESOURCE_API_VERSION}"
RESOURCE_SLICES_PATH: Final = f"{RESOURCE_API_PATH}/resourceslices"
MAX_DEVICES_PER_SLICE: Final = 128
# With a device that consumes counters (or has taints), a slice holds at most 64.
MAX_DEVICES_PER_SLICE_ADVANCED: Final = 64
MAX_TAINTS_PER_DEVICE: Final = 16
MAX_COUNTER_SETS_PER_SLICE: Final = 8
MAX_COUNTERS_PER_SET: Final = 32
MAX_VALID_VALUES: Final = 10
MAX_ATTRIBUTES_AND_CAPACITIES: Final = 32
# The standard attribute of a device's NUMA node (Kubernetes 1.37, KEP-6072): one name
# for every driver, so that `matchAttribute` aligns a GPU and a NIC of two drivers.
NUMA_NODE_ATTRIBUTE: Final = "resource.kubernetes.io/numaNode"
# ResourceSliceSpec.skipNodeOperations (1.37, alpha): "NodePrepareResources" (only with
# the next), "NodeUnprepareResources", or "*" for both.
SKIP_ALL_NODE_OPERATIONS: Final = "*"
HEALTHY: Final = "Healthy"
UNHEALTHY: Final = "Unhealthy"
