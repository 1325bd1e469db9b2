"""Fixed names and values of the device plugin API v1beta1, as the kubelet uses them."""

from typing import Final

VERSION: Final = "v1beta1"
SUPPORTED_VERSIONS: Final = (VERSION,)
DEVICE_PLUGIN_PATH: Final = "/var/lib/kubelet/device-plugins"
KUBELET_SOCKET: Final = "kubelet.sock"
CHECKPOINT_FILE: Final = "kubelet_internal_checkpoint"
POD_RESOURCES_PATH: Final = "/var/lib/kubelet/pod-resources"
POD_RESOURCES_SOCKET: Final = "/var/lib/kubelet/pod-resources/kubelet.sock"
HEALTHY: Final = "Healthy"
UNHEALTHY: Final = "Unhealthy"
MAX_DEVICE_ID_LENGTH: Final = 63
# The kubelet waits this long for PreStartContainer and for its dial back during Register.
PRE_START_TIMEOUT_S: Final = 30.0
REGISTER_DIAL_TIMEOUT_S: Final = 10.0
# How long the kubelet keeps the devices of a plugin whose ListAndWatch stream ended.
ENDPOINT_GRACE_PERIOD_S: Final = 300.0
