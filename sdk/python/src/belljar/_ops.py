"""The operations of both clients, without I/O ("sans-IO"): each is a generator that yields
the requests it needs (``Call``), is sent each answer (the decoded JSON, ``None`` for an
empty one, or the bytes of a ``raw`` call), may have the daemon's error thrown into it at the
point of the request, and returns its result. ``Client.run`` drives one with httpx's blocking
client and ``AsyncClient.run`` awaiting httpx's asyncio one, so the URL, body, paging and
error handling of every operation are written once. An NDJSON answer that ends (a pull's or
a build's progress) is handed line by line to the call's ``lines``; a local file sent whole
(``upload``) or an answer written to one (``download``) is named by the call and read or
written by each client; a followed stream (a command's output) stays with each client."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Generator, List, Mapping, Optional, Sequence, TypeVar, Union

from ._common import BelljarError, FileEntry, SnapshotImage, Tunnel, seg
from .image import BuildContext, ImageBuildError, Progress

T = TypeVar("T")


@dataclass(frozen=True)
class Call:
    """One request: JSON ``body`` or raw ``content``; the answer decoded from JSON unless
    ``raw``; ``timeout`` (seconds) raises ``BelljarError("timeout")`` when it passes. With
    ``lines``, the answer is NDJSON: each line is given to it decoded as it arrives, and the
    answer sent back is ``None``. With ``upload``, that file is the body, streamed; with
    ``download``, the answer is streamed to that file (written beside it and renamed when
    whole), and the answer sent back is ``None``."""

    method: str
    url: str
    body: Any = None
    params: Optional[Dict[str, Any]] = None
    content: Optional[bytes] = None
    headers: Dict[str, str] = field(default_factory=dict)
    raw: bool = False
    timeout: Optional[float] = None
    lines: Optional[Callable[[Dict[str, Any]], None]] = None
    upload: Optional[Path] = None
    download: Optional[Path] = None


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


# Images.


class _Events:
    """The NDJSON events of a pull, an import or a build as they arrive: given to
    ``progress``, and kept as far as the result needs (the image, every image of an import,
    or the error with its step's output)."""

    def __init__(self, progress: Optional[Progress]) -> None:
        self.progress = progress
        self.image: Optional[Dict[str, Any]] = None
        self.images: List[Dict[str, Any]] = []
        self.error: Optional[Dict[str, Any]] = None
        self.step: Optional[str] = None
        self.output: List[str] = []

    def __call__(self, event: Dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "step":
            self.step = str(event.get("instruction"))
            self.output = []
        elif kind == "progress":
            self.output.append(str(event.get("message")))
        elif kind == "done":
            self.image = event.get("image")
            if self.image is not None:
                self.images.append(self.image)
        elif kind == "error":
            self.error = event
        if self.progress is not None:
            self.progress(event)

    def result(self, what: str) -> Dict[str, Any]:
        if self.error is not None:
            code, message = str(self.error.get("code")), str(self.error.get("message"))
            raise ImageBuildError(code, message, self.step, self.output)
        if self.image is None:
            raise BelljarError("connection_lost", f"The {what} ended with neither done nor error")
        return self.image


def _find(images: Sequence[Mapping[str, Any]], name: str) -> Optional[Mapping[str, Any]]:
    """The ready image of ``name`` (a reference without a tag also by its ``:latest``)."""
    last = name.rsplit("/", 1)[-1]
    names = {name} if (":" in last or "@" in name) else {name, f"{name}:latest"}
    return next((i for i in images if i["name"] in names and i["status"] == "ready"), None)


def _identity(image: Optional[Mapping[str, Any]]) -> str:
    if image is None:
        return ""
    return str(image.get("digest") or image.get("built_at") or "")


def build_image(ctx: BuildContext, progress: Optional[Progress], force: bool) -> "Op[str]":
    """The name of the image ``ctx`` builds: found among the daemon's images, else built
    (its base pulled first when it is a registry's and not here, or built first when it is
    the Dockerfile the steps are added to)."""
    if ctx.parent is not None:
        yield from build_image(ctx.parent, progress, force)
    images: List[Dict[str, Any]] = yield Call("GET", "/v1/images")
    base = _find(images, ctx.base) if ctx.base is not None else None
    if ctx.base is not None and base is None and ctx.pull:
        pulled = _Events(progress)
        yield Call("POST", "/v1/images/pull", {"reference": ctx.base}, lines=pulled)
        base = pulled.result("pull")
    tag = ctx.tag(_identity(base))
    if not force and _find(images, tag) is not None:
        return tag
    params: Dict[str, Any] = {"tag": tag, "dockerfile": ctx.dockerfile_path}
    if ctx.build_args:
        params["build_args"] = json.dumps(dict(ctx.build_args))
    if force:
        params["no_cache"] = "true"
    built = _Events(progress)
    yield Call(
        "POST", "/v1/images/build", params=params, content=ctx.tar,
        headers={"content-type": "application/x-tar"}, lines=built,
    )
    built.result("build")
    return tag


def _image(name: str, rest: str = "") -> str:
    return f"/v1/images/{seg(name)}{rest}"


def images() -> "Op[List[Dict[str, Any]]]":
    answer: List[Dict[str, Any]] = yield Call("GET", "/v1/images")
    return answer


def pull_image(reference: str, insecure: bool, progress: Optional[Progress]) -> "Op[Dict[str, Any]]":
    body: Dict[str, Any] = {"reference": reference}
    if insecure:
        body["insecure"] = True
    pulled = _Events(progress)
    yield Call("POST", "/v1/images/pull", body, lines=pulled)
    return pulled.result("pull")


def import_image(
    archive: Union[str, Path, bytes], tag: Optional[str], progress: Optional[Progress]
) -> "Op[List[Dict[str, Any]]]":
    """The images of an archive (``docker save``'s, or an OCI layout as a tar): a file's
    path, streamed, or its bytes."""
    imported = _Events(progress)
    data, upload = (archive, None) if isinstance(archive, bytes) else (None, Path(archive))
    yield Call(
        "POST", "/v1/images/import", params={"tag": tag} if tag else None,
        content=data, upload=upload, headers={"content-type": "application/x-tar"}, lines=imported,
    )
    imported.result("import")
    return imported.images


def remove_image(name: str) -> "Op[None]":
    yield Call("DELETE", _image(name))


def prune_images(all: bool, build_cache: bool) -> "Op[Dict[str, Any]]":
    answer: Dict[str, Any] = yield Call("POST", "/v1/images/prune", {"all": all, "build_cache": build_cache})
    return answer


def export_image(name: str, path: Union[str, Path]) -> "Op[None]":
    yield Call("GET", _image(name, "/export"), download=Path(path))
