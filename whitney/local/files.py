"""`RunFiles`: where the server keeps its files (each run's states and samplers, the
artifacts) and which directory a checkpoint URI names; every worker's `RunHooks`."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

from whitney.errors import InvalidRequest, NotFound
from whitney.local.api_errors import not_found
from whitney.local.journal import Journal
from whitney.local.names import new_id, valid_name
from whitney.uris import checkpoint_uri, split_checkpoint


class RunFiles:
    """The disk layout under `data_dir`, and the checkpoints and artifacts of the journal."""

    def __init__(self, data_dir: Path, journal: Journal) -> None:
        self.data_dir = data_dir
        self.journal = journal
        (data_dir / "runs").mkdir(exist_ok=True)
        (data_dir / "artifacts").mkdir(exist_ok=True)

    def state_dir(self, run_id: str, name: str) -> Path:
        return self.data_dir / "runs" / run_id / "states" / name

    def sampler_path(self, run_id: str, sampler_id: str) -> Path:
        return self.data_dir / "runs" / run_id / "samplers" / f"{sampler_id}.safetensors"

    def tinker_record(self, run_id: str) -> Path:
        """A forwarded run's Tinker model and request ids (`whitney.local.tinker_provider`)."""
        return self.data_dir / "runs" / run_id / "tinker-provider.json"

    def checkpoint_uri(self, run_id: str, name: str) -> str:
        return checkpoint_uri(run_id, name)

    def new_artifact_path(self) -> tuple[str, Path]:
        artifact_id = new_id("art")
        return artifact_id, self.data_dir / "artifacts" / f"{artifact_id}.tar"

    def parse_checkpoint(self, tenant: str, uri: str, field: str) -> tuple[str, str]:
        """(run id, state name) of a checkpoint URI naming a run of `tenant`; the refusal
        names `field`."""
        parts = split_checkpoint(uri)
        if parts is None or not valid_name(parts[1]):
            raise InvalidRequest(
                f"{field}: expected whitney://runs/<run_id>/states/<name>, got {uri!r}",
                details={"field": field},
            )
        owner = self.journal.get_run(parts[0])
        if owner is None or owner["tenant"] != tenant:
            raise NotFound(f"{field}: checkpoint {uri!r} not found", details={"field": field})
        return parts

    def resolve_checkpoint(self, tenant: str, uri: str, field: str = "checkpoint") -> Path:
        """The directory of a `whitney://runs/{run_id}/states/{name}` checkpoint of `tenant`."""
        run_id, name = self.parse_checkpoint(tenant, uri, field)
        record = self.journal.get_checkpoint(run_id, name)
        if record is None or not Path(record["path"]).is_dir():
            raise NotFound(f"{field}: checkpoint {uri!r} not found", details={"field": field})
        return Path(record["path"])

    def artifact_path(self, tenant: str, artifact_id: str) -> tuple[Path, dict[str, Any]]:
        """An artifact of `tenant`: its file and its record."""
        artifact = self.journal.get_artifact(artifact_id)
        if artifact is None or artifact["tenant"] != tenant or not Path(artifact["path"]).exists():
            raise not_found("artifact", artifact_id)
        return Path(artifact["path"]), artifact


def archive(files: dict[str, bytes]) -> bytes:
    """`files` as one tar, the form of every `export_lora` artifact: USTAR, sorted, mtime 0,
    mode 0644 (the same files give the same bytes)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(files[name]), 0, 0o644
            tar.addfile(info, io.BytesIO(files[name]))
    return buffer.getvalue()
