"""What `make dist` checks beyond `twine check`: the wheel and the sdist in FOLDER each
hold the licence text and the py.typed marker, and the wheel's metadata names its
licence file. One line per problem; exit status 1 if any."""

from __future__ import annotations

import sys
import tarfile
import zipfile
from pathlib import Path

WHEEL_NEEDS = ("devplug/py.typed", ".dist-info/licenses/LICENSE")
SDIST_NEEDS = ("/LICENSE", "/src/devplug/py.typed", "/CHANGELOG.md", "/pyproject.toml")


def missing(names: list[str], needs: tuple[str, ...]) -> list[str]:
    return [need for need in needs if not any(name.endswith(need) for name in names)]


def main(folder: Path) -> int:
    problems: list[str] = []
    wheels = sorted(folder.glob("devplug-*.whl"))
    sdists = sorted(folder.glob("devplug-*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        problems.append(f"{folder}: expected one wheel and one sdist, found {wheels + sdists}")
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            names = archive.namelist()
            metadata = next(
                archive.read(n).decode() for n in names if n.endswith(".dist-info/METADATA")
            )
        problems += [f"{wheel.name}: no {need}" for need in missing(names, WHEEL_NEEDS)]
        if "License-File: LICENSE" not in metadata.splitlines():
            problems.append(f"{wheel.name}: METADATA names no License-File: LICENSE")
    for sdist in sdists:
        with tarfile.open(sdist) as archive:
            names = archive.getnames()
        problems += [f"{sdist.name}: no {need}" for need in missing(names, SDIST_NEEDS)]
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems:
        print(f"{folder}: {', '.join(p.name for p in wheels + sdists)} hold LICENSE and py.typed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "dist")))
