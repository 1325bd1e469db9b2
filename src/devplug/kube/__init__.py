"""Kubernetes rules devplug applies itself (quantities...), low in the house: every
floor above may use them, and they need nothing but the standard library."""
