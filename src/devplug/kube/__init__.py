"""Kubernetes rules devplug applies itself (names, quantities, a pod's requests, scoring,
tolerations), low in the house: every floor above may use them, and they need nothing
but the standard library."""
