"""The safe defaults of the `limits:` block, which the framework's Limits start from as
well. No msgspec here: a plugin daemon that reads no config imports this too."""

# gRPC's own default receive limit; a kubelet request for 10,000 devices is ~200 KiB.
DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_DEVICES = 10_000
DEFAULT_MAX_IDS_PER_REQUEST = 10_000
# The kubelet holds one ListAndWatch stream; a few more cover `devplug` tools watching.
DEFAULT_MAX_STREAMS = 16
# How long one Register call may take before it is abandoned and retried with backoff
# (the kubelet dials back within 10 s, so a healthy one answers well inside this).
DEFAULT_REGISTER_TIMEOUT_S = 15.0
