"""The operations of both clients, without I/O ("sans-IO"): each is a generator that yields
the requests it needs (``Call``), is sent each answer (the decoded JSON, ``None`` for an
empty one, or the bytes of a ``raw`` call), may have the daemon's error thrown into it at the
point of the request, and returns its result. ``Client.run`` drives one with httpx's blocking
client and ``AsyncClient.run`` awaiting httpx's asyncio one, so the URL, body, paging and
error handling of every operation are written once. Streams (a command's output) and local
files stay with each client."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Generator, List, Mapping, Optional, TypeVar

from ._common import BelljarError, FileEntry, SnapshotImage, Tunnel, seg

T = TypeVar("T")


@dataclass(frozen=True)
class Call:
    """One request: JSON ``body`` or raw ``content``; the answer decoded from JSON unless
    ``raw``; ``timeout`` (seconds) raises ``BelljarError("timeout")`` when it passes."""

    method: str
    url: str
    body: Any = None
    params: Optional[Dict[str, Any]] = None
    content: Optional[bytes] = None
    headers: Dict[str, str] = field(default_factory=dict)
    raw: bool = False
    timeout: Optional[float] = None


Op = Generator[Call, Any, T]

_OCTET = {"content-type": "application/octet-stream"}


def drive(op: "Op[T]", perform: Any) -> T:
    """Runs ``op`` to its end with ``perform(call) -> answer`` (the blocking driver)."""
    answer: Any = None
    error: Optional[BelljarError] = None
    while True:
        try:
            call = op.throw(error) if error is not None else op.send(answer)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        error = None
        try:
            answer = perform(call)
        except BelljarError as e:
            error = e


async def adrive(op: "Op[T]", perform: Any) -> T:
    """Runs ``op`` to its end, awaiting ``perform(call)`` (the asyncio driver)."""
    answer: Any = None
    error: Optional[BelljarError] = None
    while True:
        try:
            call = op.throw(error) if error is not None else op.send(answer)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        error = None
        try:
            answer = await perform(call)
        except BelljarError as e:
            error = e


def _sbx(sandbox_id: str, rest: str = "") -> str:
    return f"/v1/sandboxes/{seg(sandbox_id)}{rest}"


# Sandboxes.


def create(body: Dict[str, Any], ports: List[int]) -> "Op[Dict[str, Any]]":
    data: Dict[str, Any] = yield Call("POST", "/v1/sandboxes", body)
    for port in ports:
        yield Call("POST", _sbx(data["id"], "/ports"), {"port": port})
    return data


def get(sandbox_id: str) -> "Op[Dict[str, Any]]":
    answer: Dict[str, Any] = yield Call("GET", _sbx(sandbox_id))
    return answer


def list_page(tags: Mapping[str, str], cursor: Optional[str]) -> "Op[Dict[str, Any]]":
    """One page of sandboxes (the daemon filters by the first tag; ``matches`` by all)."""
    params: Dict[str, Any] = {"limit": 200}
    first = next(iter(tags.items()), None)
    if first:
        params["tag"] = f"{first[0]}={first[1]}"
    if cursor:
        params["cursor"] = cursor
    answer: Dict[str, Any] = yield Call("GET", "/v1/sandboxes", params=params)
    return answer


def matches(sandbox: Mapping[str, Any], tags: Mapping[str, str]) -> bool:
    return all(sandbox["tags"].get(k) == v for k, v in tags.items())


def exec_command(sandbox_id: str, body: Dict[str, Any]) -> "Op[Dict[str, Any]]":
    answer: Dict[str, Any] = yield Call("POST", _sbx(sandbox_id, "/commands"), body)
    return answer


def update(sandbox_id: str, fields: Dict[str, Any]) -> "Op[Dict[str, Any]]":
    answer: Dict[str, Any] = yield Call("PATCH", _sbx(sandbox_id), fields)
    return answer


def snapshot_filesystem(sandbox_id: str, timeout: float) -> "Op[SnapshotImage]":
    try:
        snap = yield Call("POST", _sbx(sandbox_id, "/snapshots"), {"keep_running": True}, timeout=timeout)
    except BelljarError as e:
        if e.code != "timeout":
            raise
        raise BelljarError("timeout", f"The snapshot took longer than {timeout:g}s") from e
    return SnapshotImage(snap["id"], snap["source_sandbox_id"], snap["size_bytes"])


def snapshot_directory(sandbox_id: str, path: str) -> "Op[SnapshotImage]":
    snap = yield Call("POST", _sbx(sandbox_id, "/snapshots"), {"path": path})
    return SnapshotImage(snap["id"], snap["source_sandbox_id"], snap["size_bytes"])


def mount_image(sandbox_id: str, path: str, snapshot_id: str) -> "Op[None]":
    yield Call("POST", _sbx(sandbox_id, "/mounts"), {"snapshot_id": snapshot_id, "path": path})


def unmount_image(sandbox_id: str, path: str) -> "Op[None]":
    yield Call("DELETE", _sbx(sandbox_id, "/mounts"), params={"path": path})


def tunnels(sandbox_id: str) -> "Op[Dict[int, Tunnel]]":
    ports = yield Call("GET", _sbx(sandbox_id, "/ports"))
    return {p["port"]: Tunnel("127.0.0.1", p["host_port"], p["url"]) for p in ports["ports"]}


def network_policy(sandbox_id: str) -> "Op[Any]":
    answer: Dict[str, Any] = yield Call("GET", _sbx(sandbox_id, "/network"))
    return answer["policy"]


def terminate(sandbox_id: str) -> "Op[Optional[Dict[str, Any]]]":
    """Stops the sandbox: its new state, or ``None`` when it had already ended."""
    try:
        answer: Dict[str, Any] = yield Call("POST", _sbx(sandbox_id, "/stop"))
        return answer
    except BelljarError as e:
        if e.code != "sandbox_not_running":
            raise
        return None


def delete(sandbox_id: str) -> "Op[None]":
    yield Call("DELETE", _sbx(sandbox_id))


# Commands.


def command_url(command: Mapping[str, Any]) -> str:
    return _sbx(command["sandbox_id"], f"/commands/{seg(command['id'])}")


def command_get(url: str, wait: bool) -> "Op[Dict[str, Any]]":
    answer: Dict[str, Any] = yield Call("GET", url + ("?wait=true" if wait else ""))
    return answer


def command_kill(url: str, signal: str) -> "Op[Dict[str, Any]]":
    answer: Dict[str, Any] = yield Call("POST", url + "/kill", {"signal": signal})
    return answer


def command_stdin(url: str, data: bytes, close: bool) -> "Op[None]":
    call = Call(
        "POST",
        url + "/stdin" + ("?close=true" if close else ""),
        content=data,
        headers=dict(_OCTET) if data else {},
    )
    try:
        yield call
    except BelljarError as e:
        # 409: the command already exited (or its stdin is closed): nothing is left to close.
        if not (close and not data and e.status == 409):
            raise


# Files.


def _files(sandbox_id: str, rest: str = "") -> str:
    return _sbx(sandbox_id, "/files" + rest)


def read_bytes(sandbox_id: str, path: str) -> "Op[bytes]":
    answer: bytes = yield Call("GET", _files(sandbox_id), params={"path": path}, raw=True)
    return answer


def write_bytes(sandbox_id: str, data: bytes, path: str, mode: Optional[int]) -> "Op[None]":
    params: Dict[str, Any] = {"path": path}
    if mode is not None:
        params["mode"] = format(mode, "o")
    yield Call("PUT", _files(sandbox_id), params=params, content=data, headers=dict(_OCTET))


def stat(sandbox_id: str, path: str) -> "Op[FileEntry]":
    return FileEntry.of((yield Call("GET", _files(sandbox_id, "/stat"), params={"path": path})))


def list_files(sandbox_id: str, path: str) -> "Op[List[FileEntry]]":
    out: List[FileEntry] = []
    cursor: Optional[str] = None
    while True:
        params = {"path": path, **({"cursor": cursor} if cursor else {})}
        page = yield Call("GET", _files(sandbox_id, "/list"), params=params)
        out.extend(FileEntry.of(e) for e in page["entries"])
        cursor = page.get("next_cursor")
        if not cursor:
            return out


def make_directory(sandbox_id: str, path: str, create_parents: bool) -> "Op[None]":
    if not create_parents:
        yield from stat(sandbox_id, str(Path(path).parent))
    yield Call("POST", _files(sandbox_id, "/mkdir"), {"path": path})


def remove(sandbox_id: str, path: str, recursive: bool) -> "Op[None]":
    params = {"path": path, **({"recursive": "true"} if recursive else {})}
    yield Call("DELETE", _files(sandbox_id), params=params)


# Volumes.


def volume_from_name(name: str, create_if_missing: bool, size_mib: Optional[int]) -> "Op[Dict[str, Any]]":
    url = f"/v1/volumes/{seg(name)}"
    try:
        answer: Dict[str, Any] = yield Call("GET", url)
        return answer
    except BelljarError as e:
        if e.code != "volume_not_found" or not create_if_missing:
            raise
    body: Dict[str, Any] = {"name": name}
    if size_mib is not None:
        body["size_mib"] = size_mib
    try:
        made: Dict[str, Any] = yield Call("POST", "/v1/volumes", body)
        return made
    except BelljarError as race:
        if race.code != "conflict":
            raise
    theirs: Dict[str, Any] = yield Call("GET", url)
    return theirs


def volume_delete(name: str) -> "Op[None]":
    yield Call("DELETE", f"/v1/volumes/{seg(name)}")
