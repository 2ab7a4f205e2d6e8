"""The REST client's view of a tenant's Tinker runs and checkpoints, and the download of
external weights (an `export_lora` artifact) through signed URLs.

A run's checkpoints are read from its journal: `save_state` names are `weights`,
`save_weights_for_sampler` ids `sampler_weights`, `export_lora` artifacts `external_weights`.
A download URL carries an HMAC over the tenant, the artifact and the expiry, as the SDK
fetches it with no API key; one file of the artifact's tar per URL. The HMAC key is kept in
the data directory (`tinker-url-key`, mode 0600), so a URL outlives a restart of the server.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import tarfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from whitney.errors import NotFound
from whitney.local.api_errors import not_found
from whitney.local.service import WhitneyService
from whitney.local.tinker import translate

URL_TTL_S = 3600.0
"""How long a signed download URL serves."""
KEY_FILE = "tinker-url-key"
"""The signing key's file in the data directory."""
_KINDS = {
    "save_state": ("training", "weights"),
    "save_weights_for_sampler": ("sampler", "sampler_weights"),
    "export_lora": ("external", "external_weights"),
}


def _iso(timestamp: str | None) -> str:
    return timestamp or datetime.now(UTC).isoformat()


def signing_key(path: Path) -> bytes:
    """The key in `path`; made first (32 random bytes, mode 0600) and linked into place
    whole, so a crash never leaves half a key."""
    if not path.exists():
        draft = path.with_name(f"{path.name}.{secrets.token_hex(8)}")
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(secrets.token_bytes(32))
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(draft, path)
        except FileExistsError:
            pass  # another made it first: theirs is the key
        finally:
            draft.unlink()
    return path.read_bytes()


def _name(kind: str, result: dict[str, Any]) -> str:
    """The name a checkpoint operation's result gives its checkpoint."""
    if kind == "save_state":
        return result["checkpoint"].rsplit("/", 1)[1]
    return result["sampler_id"] if kind == "save_weights_for_sampler" else result["artifact_id"]


class Checkpoints:
    """Runs, checkpoints and downloads of `service`'s Tinker runs."""

    def __init__(self, service: WhitneyService) -> None:
        self.service = service
        self._key = signing_key(service.data_dir / KEY_FILE)

    def checkpoints(self, tenant: str, run_id: str) -> dict[str, Any]:
        self.service.runs.own(tenant, run_id)
        found = []
        after = 0
        while True:
            page = json.loads(self.service.operations.page(tenant, run_id, after, 1000).text)
            for operation in page["operations"]:
                after = operation["seq_id"]
                kind = _KINDS.get(operation["kind"])
                if kind is None or operation["status"] != "succeeded":
                    continue
                name = _name(operation["kind"], operation["result"])
                found.append(
                    {
                        "checkpoint_id": f"{kind[1]}/{name}",
                        "checkpoint_type": kind[0],
                        "time": _iso(operation["finished_at"]),
                        "tinker_path": f"{translate.TINKER_SCHEME}{run_id}/{kind[1]}/{name}",
                        "size_bytes": operation["result"].get("bytes"),
                    }
                )
            if len(page["operations"]) < 1000:
                return {"checkpoints": found}

    def training_run(self, tenant: str, run_id: str) -> dict[str, Any]:
        run = self.service.runs.get(tenant, run_id)
        listed = self.checkpoints(tenant, run_id)["checkpoints"]
        last = {kind: None for kind in ("training", "sampler")}
        for checkpoint in listed:
            if checkpoint["checkpoint_type"] in last:
                last[checkpoint["checkpoint_type"]] = checkpoint
        return {
            "training_run_id": run_id,
            "base_model": run["base_model"],
            "model_owner": tenant,
            "is_lora": True,
            "corrupted": run["status"] == "failed",
            "lora_rank": run["lora_rank"],
            "last_request_time": _iso(run["finished_at"] or run["created_at"]),
            "last_checkpoint": last["training"],
            "last_sampler_checkpoint": last["sampler"],
        }

    def training_runs(self, tenant: str, limit: int, offset: int) -> dict[str, Any]:
        """The tenant's Tinker training runs, oldest first, a page of them."""
        journal = self.service.journal
        run_ids = [
            run_id
            for session in journal.list_sessions(tenant, [])
            for run_id in journal.session_run_ids(session["session_id"])
        ]
        runs = [journal.get_run(run_id) for run_id in run_ids]
        tinker_runs = [r for r in runs if r and r["provider"] == "tinker" and r["trainable"]]
        tinker_runs.sort(key=lambda r: (r["created_at"], r["run_id"]))
        page = tinker_runs[offset : offset + limit]
        return {
            "training_runs": [self.training_run(tenant, r["run_id"]) for r in page],
            "cursor": {"offset": offset, "limit": limit, "total_count": len(tinker_runs)},
        }

    def external_urls(
        self, tenant: str, run_id: str, kind: str, name: str, base_url: str
    ) -> dict[str, Any]:
        """Signed URLs of each file of an `external_weights` checkpoint of `run_id`."""
        if kind != "external_weights":
            raise translate.bad("checkpoint_id", "only external_weights checkpoints have files")
        self.service.runs.own(tenant, run_id)
        path, artifact = self.service.files.artifact_path(tenant, name)
        if artifact["run_id"] != run_id:
            raise not_found("checkpoint", f"{kind}/{name}")
        expires = time.time() + URL_TTL_S
        token = self._token(tenant, name, expires)
        with tarfile.open(path) as tar:
            members = [m.name for m in tar.getmembers() if m.isfile()]
        urls = {m: f"{base_url}/api/v1/external_weights/{token}/{m}" for m in members}
        return {"urls": urls, "expires": datetime.fromtimestamp(expires, UTC).isoformat()}

    def _token(self, tenant: str, artifact_id: str, expires: float) -> str:
        stamp = f"{int(expires)}"
        mac = hmac.new(self._key, f"{tenant}|{artifact_id}|{stamp}".encode(), hashlib.sha256)
        return f"{tenant}.{artifact_id}.{stamp}.{mac.hexdigest()}"

    def file(self, token: str, member: str) -> bytes:
        """One file of a signed URL's artifact (404 for a bad, expired or foreign token)."""
        parts = token.split(".")
        if len(parts) != 4 or not parts[2].isdigit():
            raise NotFound("no such download", details={"field": "token"})
        tenant, artifact_id, stamp, _ = parts
        if not hmac.compare_digest(self._token(tenant, artifact_id, float(stamp)), token):
            raise NotFound("no such download", details={"field": "token"})
        if time.time() > int(stamp):
            raise NotFound("the download URL expired: ask for new ones", details={"field": "token"})
        path, _ = self.service.files.artifact_path(tenant, artifact_id)
        with tarfile.open(path) as tar:
            try:
                extracted = tar.extractfile(member)
            except KeyError:
                extracted = None
            if extracted is None:
                raise not_found("file", member)
            return extracted.read()
