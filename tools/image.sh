#!/usr/bin/env bash
# Build the Dockerfile into build/devplug-image.tar (OCI archive, localhost/devplug:VERSION)
# with buildah: no docker engine, no registry. The base image is made from Debian
# packages by mmdebstrap and kept in build/ under a key of its package list; wheels are
# built on the host, so the build fetches nothing. BUILDAH_FLAGS adds global buildah
# flags (e.g. "--storage-driver vfs"), passed on every call.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-.venv/bin/python}
SUITE=bookworm
PACKAGES=python3,python3-venv
# (the key below also covers the hook: bump HOOK when the way the base is made changes)
HOOK=merged-usr
# Documentation, man pages and translations have no use in a node daemon's image.
EXCLUDES=('/usr/share/doc/*' '/usr/share/man/*' '/usr/share/info/*' '/usr/share/locale/*' '/usr/share/lintian/*')
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
# The DaemonSet's image: a name no registry resolves by accident (pulled `Never`), so
# `ctr -n k8s.io images import` of the archive makes it usable as it is.
NAME=localhost/devplug:$VERSION
# The OCI labels: the source URL from pyproject.toml, the commit of this checkout.
SOURCE=$(sed -n 's/^Source = "\(.*\)"/\1/p' pyproject.toml)
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$REVISION" != unknown ] && [ -n "$(git status --porcelain -- src pyproject.toml Dockerfile 2>/dev/null)" ]; then
    REVISION=$REVISION-dirty
fi
OUT=build/devplug-image.tar
read -r -a FLAGS <<<"${BUILDAH_FLAGS:-}"
bah() { buildah "${FLAGS[@]}" "$@"; }

mkdir -p build/wheels
key=$(printf '%s\n' "$SUITE" "$PACKAGES" "$HOOK" "${EXCLUDES[@]}" | sha256sum | cut -c1-12)
base=localhost/devplug-base:$key
base_tar=build/base-$key.tar
if ! bah inspect --type image "$base" >/dev/null 2>&1; then
    if [ ! -s "$base_tar" ]; then
        echo "image: making the base ($SUITE: $PACKAGES) with mmdebstrap" >&2
        dpkgopts=()
        for path in "${EXCLUDES[@]}"; do dpkgopts+=(--dpkgopt="path-exclude=$path"); done
        # merged-usr hook: /usr merged without the usrmerge package (and the perl it needs).
        mmdebstrap --quiet --format=tar --variant=minbase --include="$PACKAGES" "${dpkgopts[@]}" \
            --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
            "$SUITE" "$base_tar.part" >build/base.log 2>&1 || { cat build/base.log >&2; exit 1; }
        mv "$base_tar.part" "$base_tar"
    fi
    c=$(bah from scratch)
    bah add --quiet "$c" "$base_tar" /
    bah commit --quiet --rm "$c" "$base" >/dev/null
fi

echo "image: wheels for devplug[udev,dra]" >&2
rm -rf build/wheels/devplug-*.whl build/lib build/bdist.*  # no stale file in the wheel
"$PYTHON" -m pip wheel --quiet --disable-pip-version-check --find-links build/wheels \
    -w build/wheels '.[udev,dra]' 2>&1 | grep -v '^WARNING: Location' >&2 || true
ls build/wheels/devplug-*.whl >/dev/null

echo "image: building $NAME" >&2
# Pushed by image ID: other checkouts may build and tag the same name in this store.
bah bud --quiet --isolation chroot --pull=never --layers --build-arg "BASE=$base" \
    --build-arg "VERSION=$VERSION" --build-arg "SOURCE=$SOURCE" --build-arg "REVISION=$REVISION" \
    --iidfile build/image.id -t "$NAME" -f Dockerfile . >/dev/null
rm -f "$OUT"
bah push --quiet "$(cat build/image.id)" "oci-archive:$OUT:$NAME"
echo "image: $OUT ($NAME, $(du -m "$OUT" | cut -f1) MiB archive)" >&2
