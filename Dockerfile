# The devplug node daemon. Any OCI builder builds it (`docker build -t REGISTRY/devplug:TAG .`);
# `make image` builds this same file with buildah, without a docker engine or a registry,
# as localhost/devplug:VERSION, with the build arguments of the OCI labels below.
#
# BASE: a Debian bookworm with CPython 3.11 (`make image` passes one made by mmdebstrap
# from Debian packages: python3, python3-venv). Both stages use it, so the venv's
# interpreter link is valid in the final stage.
ARG BASE=docker.io/library/python:3.11-slim-bookworm

FROM ${BASE} AS build
# The context holds pyproject.toml, README.md, src/ and, when `make image` built them
# on the host, wheels in build/wheels/ (then nothing is fetched from a package index).
COPY . /src
# A throw-away venv holds pip; the runtime venv gets none (smaller, nothing to update).
RUN python3 -m venv /opt/pip \
 && python3 -m venv --without-pip /opt/devplug \
 && if [ -d /src/build/wheels ]; then \
      from="--no-index --find-links /src/build/wheels devplug[udev,dra]"; \
    else \
      from="/src[udev,dra]"; \
    fi \
 && /opt/pip/bin/pip --python /opt/devplug/bin/python install \
      --no-cache-dir --disable-pip-version-check --no-warn-script-location $from \
 && find /opt/devplug -name 'tests' -path '*/site-packages/*/tests' -prune -exec rm -rf {} + \
 # NVIDIA's chart runs its config manager as `config-manager`.
 && ln -s nvidia-config-manager /opt/devplug/bin/config-manager

FROM ${BASE}
COPY --from=build /opt/devplug /opt/devplug
# The config used when none is mounted; the DaemonSet mounts a ConfigMap over /etc/devplug.
COPY src/devplug/config/default.yaml /etc/devplug/config.yaml
ENV PATH=/opt/devplug/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# root, without capabilities (the DaemonSet drops them all): the kubelet's
# device-plugins folder and kubelet.sock belong to root and are not group-writable,
# so only uid 0 can create a plugin socket there and connect to the kubelet.
USER 0:0
ENTRYPOINT ["devplug"]
CMD ["serve", "--config", "/etc/devplug/config.yaml"]
# What was built from where: `make image` passes the project's version, its source URL
# (pyproject.toml) and the git commit (with -dirty for uncommitted changes).
ARG VERSION=unknown
ARG SOURCE=unknown
ARG REVISION=unknown
LABEL org.opencontainers.image.title="devplug" \
      org.opencontainers.image.description="Kubernetes device plugins from a YAML config" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.revision="${REVISION}"
