"""Talking to a Kubernetes API server, the one way every part of devplug does it.

- `kubeconfig`: the one reader of kubeconfig files (contexts, `--context`, TLS,
  tokens, token files, exec credential plugins) and of the in-cluster service account,
  with one-line errors naming the file and the field;
- `credentials`: the bearer token of a request, read again when it expired or the
  server refused it (401);
- `failures`: what a failure means (permanent: not trusted, not authorized; or
  transient: away, overloaded) and one line that says so;
- `backoff`: the one exponential backoff with jitter between attempts;
- `official`: the official `kubernetes` client set up from a kubeconfig, with
  timeouts on every request.

Standard library (and PyYAML) only, so that the fleet's aiohttp client and the DRA
driver's official client share it without importing each other.
"""
