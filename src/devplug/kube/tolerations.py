"""Whether a toleration tolerates a taint, by the API's rules, which a pod's tolerations
(core/v1) and a device request's (resource.k8s.io/v1 DeviceToleration) share: written
once for the planner's fit step, the DRA driver and the simulated scheduler."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def tolerates(tolerations: Sequence[Mapping[str, object]], taint: Mapping[str, str]) -> bool:
    """Whether one of `tolerations` tolerates `taint`: an empty effect matches every
    effect; Exists with an empty key matches every key; Equal (the default) needs key
    and value to match."""
    for toleration in tolerations:
        effect = toleration.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        key = toleration.get("key") or ""
        if (toleration.get("operator") or "Equal") == "Exists":
            if not key or key == taint.get("key"):
                return True
        elif key == taint.get("key") and (toleration.get("value") or "") == taint.get("value", ""):
            return True
    return False
