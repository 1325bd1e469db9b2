"""Every shell block of README.md and docs/ runs as written, as a newcomer would paste it:
in a fresh folder holding the files the page gives (a YAML block whose first line is
`# NAME.yaml`) and the repository's examples/ and tools/, with `devplug` on the PATH.

A block that cannot run here says why on the line before it: `<!-- not run: WHY -->`
(a cluster of one's own, a GPU host...). Paths under /tmp/ are moved into the test's
folder, so that runs in several checkouts never meet.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(
    r"(?:^<!-- not run: (?P<why>[^>]*?) -->\n)?^```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^```",
    re.S | re.M,
)
FILE_BLOCK = re.compile(r"\A# ([\w.-]+\.ya?ml)\n")
BLOCK_TIMEOUT_S = 240


@dataclass
class Block:
    page: Path
    index: int
    body: str
    why: str | None
    files: dict[str, str]

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}#{self.index}"


def blocks() -> list[Block]:
    found = []
    for page in PAGES:
        matches = list(BLOCK.finditer(page.read_text()))
        files = {
            m.group(1): b.group("body")
            for b in matches
            if b.group("lang") == "yaml" and (m := FILE_BLOCK.match(b.group("body")))
        }
        for index, block in enumerate(b for b in matches if b.group("lang") == "sh"):
            found.append(Block(page, index, block.group("body"), block.group("why"), files))
    return found


BLOCKS = blocks()


def test_blocks_that_are_not_run_say_why() -> None:
    assert len(BLOCKS) > 10
    assert all(b.why is None or b.why.strip() for b in BLOCKS)
    assert len([b for b in BLOCKS if b.why is None]) >= 7


@pytest.mark.timeout(BLOCK_TIMEOUT_S + 30)
@pytest.mark.parametrize("block", [b for b in BLOCKS if b.why is None], ids=lambda b: b.name)
def test_shell_block_runs(block: Block, short_tmp: Path) -> None:
    work = short_tmp / "work"
    work.mkdir()
    for name, text in block.files.items():
        (work / name).write_text(text)
    for shared in ("examples", "tools"):
        (work / shared).symlink_to(ROOT / shared)
    script = block.body.replace("/tmp/", f"{short_tmp}/tmp/")
    env = {key: value for key, value in os.environ.items() if not key.startswith("DEVPLUG_")}
    env |= {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        "TMPDIR": str(short_tmp),
        "NO_COLOR": "1",
    }
    process = subprocess.Popen(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its background jobs too are ended below
    )
    try:
        output, _ = process.communicate(timeout=BLOCK_TIMEOUT_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert process.returncode == 0, f"{block.name} exited {process.returncode}:\n{output}"
    assert "Traceback" not in output, output
