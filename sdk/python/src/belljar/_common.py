"""What the sync and asyncio clients share: finding the daemon (as the CLI does, see
crates/client/src/paths.rs), the error type, and turning Modal-style arguments into the API's
request bodies. Nothing here does I/O on the network."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence
from urllib.parse import quote


class BelljarError(Exception):
    """An error from the daemon (its stable ``code``, e.g. ``not_found``) or from talking to it
    (a local code: ``daemon_unavailable``, ``connection_lost``, ``bad_response``)."""

    def __init__(self, code: str, message: str, status: Optional[int] = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status

    def __str__(self) -> str:
        return f"{self.message} ({self.code})"


class NotSupportedError(BelljarError):
    """An option this daemon does not support yet: raised, never silently ignored."""

    def __init__(self, message: str) -> None:
        super().__init__("not_supported", message)


@dataclass(frozen=True)
class Endpoint:
    """Where the daemon answers: its Unix socket, else 127.0.0.1 with the bearer token."""

    socket: Optional[str] = None
    base_url: Optional[str] = None
    token: Optional[str] = None


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def find_daemon(home: Optional[str] = None) -> Endpoint:
    """The daemon of ``home`` (default ``BELLJAR_HOME``), else of the user's XDG directories."""
    home = home or os.environ.get("BELLJAR_HOME") or None
    if home:
        runtime, config = Path(home, "run"), Path(home, "config")
    else:
        data = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local/share", "belljar")
        config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config", "belljar")
        xdg_runtime = os.environ.get("XDG_RUNTIME_DIR")
        runtime = Path(xdg_runtime, "belljar") if xdg_runtime else data / "run"
    socket = runtime / "belljard.sock"
    if socket.exists():
        return Endpoint(socket=str(socket))
    port = _read(runtime / "port")
    if port:
        return Endpoint(base_url=f"http://127.0.0.1:{port}", token=_read(config / "token"))
    raise BelljarError(
        "daemon_unavailable",
        f"No daemon found (no {socket}): start it with `belljar daemon start`",
    )


def error_of(status: int, body: bytes) -> BelljarError:
    """The API's ``{"error":{"code","message"}}``, or one naming the status."""
    import json

    try:
        e = json.loads(body)["error"]
        return BelljarError(str(e["code"]), str(e["message"]), status)
    except (ValueError, KeyError, TypeError):
        text = body.decode("utf-8", "replace").strip()[:300]
        return BelljarError(f"http_{status}", text or f"HTTP {status}", status)


def seg(s: str) -> str:
    """One percent-encoded path segment: an id cannot reach another route."""
    return quote(s, safe="")


def volumes_body(volumes: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """``volumes={"/guest/path": v}`` (Modal's form) as the API's list: ``v`` a ``Volume``, a
    volume's name, or a host folder (a path starting with ``/``, ``.`` or ``~``)."""
    out: List[Dict[str, Any]] = []
    for path, v in volumes.items():
        if isinstance(v, str):
            host = v.startswith(("/", ".", "~"))
            source, read_only = (os.path.realpath(os.path.expanduser(v)) if host else v), False
        else:
            source, read_only = str(v.name), bool(getattr(v, "mounted_read_only", False))
        entry: Dict[str, Any] = {"source": source, "path": path}
        if read_only:
            entry["read_only"] = True
        out.append(entry)
    return out


def create_body(
    *,
    image: Any,
    timeout: Optional[int],
    idle_timeout: Optional[int],
    env: Optional[Mapping[str, Optional[str]]],
    tags: Optional[Mapping[str, str]],
    block_network: bool,
    outbound_cidr_allowlist: Optional[Sequence[str]],
    name: Optional[str],
    cpu: Optional[float],
    memory: Optional[int],
    volumes: Optional[Mapping[str, Any]] = None,
) -> Dict[str, Any]:
    """The body of ``POST /v1/sandboxes`` for ``Sandbox.create``'s arguments."""
    body: Dict[str, Any] = {}
    if volumes:
        body["volumes"] = volumes_body(volumes)
    if idle_timeout is not None:
        # Modal's idle_timeout is in seconds; the daemon pauses the idle sandbox, and the next
        # exec or file call resumes it.
        body["idle_timeout_ms"] = int(idle_timeout * 1000)
    if block_network and outbound_cidr_allowlist:
        raise BelljarError("bad_request", "block_network and outbound_cidr_allowlist exclude each other")
    if block_network:
        body["network_policy"] = "deny-all"
    elif outbound_cidr_allowlist is not None:
        # Only these ranges: no domain is allowed, so DNS answers nothing either.
        body["network_policy"] = {"subnets": {"allow": list(outbound_cidr_allowlist), "deny": []}}
    snapshot_id = getattr(image, "snapshot_id", None)
    if snapshot_id is not None:
        body["source"] = {"type": "snapshot", "snapshot_id": snapshot_id}
    elif isinstance(image, str) and image.startswith("snap_"):
        body["source"] = {"type": "snapshot", "snapshot_id": image}
    elif image is not None:
        body["image"] = str(image)
    if timeout is not None:
        body["timeout_ms"] = int(timeout * 1000)
    if env:
        body["env"] = {k: v for k, v in env.items() if v is not None}
    if tags:
        body["tags"] = dict(tags)
    if name is not None:
        body["name"] = name
    if cpu is not None:
        body["vcpus"] = max(1, int(round(cpu)))
    if memory is not None:
        body["memory_mib"] = int(memory)
    return body


def exec_body(
    args: Sequence[str],
    workdir: Optional[str],
    env: Optional[Mapping[str, Optional[str]]],
    pty: bool,
    sudo: bool,
) -> Dict[str, Any]:
    """The body of ``POST .../commands`` for ``sb.exec``: always detached, with stdin open."""
    if not args:
        raise BelljarError("bad_request", "exec needs a program to run")
    body: Dict[str, Any] = {"argv": list(args), "detached": True, "stdin": True, "sudo": sudo}
    if workdir is not None:
        body["cwd"] = workdir
    if env:
        body["env"] = {k: v for k, v in env.items() if v is not None}
    if pty:
        body["pty"] = {"rows": 24, "cols": 80}
    return body


def returncode_of(command: Mapping[str, Any]) -> Optional[int]:
    """The exit code of an ended command; ``-signal`` when a signal ended it (as
    ``subprocess`` reports it); ``None`` while it runs."""
    if command["status"] in ("pending", "running"):
        return None
    if command.get("exit_code") is not None:
        return int(command["exit_code"])
    if command.get("signal") is not None:
        return -int(command["signal"])
    return -1


def chunk_bytes(line: Mapping[str, Any]) -> bytes:
    import base64

    if line.get("data_base64") is not None:
        return base64.b64decode(line["data_base64"])
    return str(line.get("data") or "").encode()


@dataclass(frozen=True)
class FileEntry:
    """A file's metadata (``FileEntry`` of the API)."""

    name: str
    path: str
    type: str
    size: int
    mode: int
    mtime: int

    @staticmethod
    def of(e: Mapping[str, Any]) -> "FileEntry":
        return FileEntry(e["name"], e["path"], e["kind"], e["size"], e["mode"], e["mtime"])


@dataclass(frozen=True)
class Tunnel:
    """An exposed port of the sandbox, reachable from this host."""

    host: str
    port: int
    url: str

    @property
    def tcp_socket(self) -> "tuple[str, int]":
        return (self.host, self.port)


def check_ports(encrypted_ports: Sequence[int], h2_ports: Sequence[int]) -> None:
    if encrypted_ports or h2_ports:
        raise NotSupportedError(
            "encrypted_ports/h2_ports: Belljar forwards plain TCP on 127.0.0.1; use unencrypted_ports"
        )


@dataclass(frozen=True)
class SnapshotImage:
    """A filesystem snapshot; pass it as ``Sandbox.create(image=...)`` to start from it."""

    snapshot_id: str
    source_sandbox_id: str
    size_bytes: int

    @property
    def object_id(self) -> str:
        return self.snapshot_id
