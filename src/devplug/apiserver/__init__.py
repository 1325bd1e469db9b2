"""Talking to a Kubernetes API server, the one way every part of devplug does it.

- `kubeconfig`: the one reader of kubeconfig files (contexts, `--context`, TLS,
  tokens, token files, exec credential plugins) and of the in-cluster service account,
  with one-line errors naming the file and the field;
- `credentials`: the bearer token of a request, read again when it expired or the
  server refused it (401);
- `failures`: what a failure means (permanent: not trusted, not authorized; or
  transient: away, overloaded) and one line that says so;
- `backoff`: the one exponential backoff with jitter between attempts;
- `client`: devplug's asyncio client (aiohttp, msgspec), the one stack every module
  that talks to an API server uses (chosen by `make bench`, key `kubeclient`);
- `informer`: the one list and watch of a collection on that client, its view kept
  current (resumed from the last version, listed again when too old, backoff).

The client imports aiohttp only when it is used; the rest is the standard library (and
PyYAML). The test kit's official client (`devplug.testing.official`) is built on the
same kubeconfig reader and credentials.
"""
