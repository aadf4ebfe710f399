"""The synchronous client: ``Sandbox`` with Modal's ergonomics (create, from_id, list, exec,
filesystem, tags, snapshot_filesystem, terminate) over the daemon's HTTP API through httpx.

A process's output arrives on one followed NDJSON stream that a background thread splits into
stdout and stderr, so ``for line in p.stdout`` yields lines as the command prints them."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import threading
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, TypeVar, Union

import httpx

from . import _ops
from ._common import (
    BelljarError,
    Endpoint,
    FileEntry,
    SnapshotImage,
    Tunnel,
    check_ports,
    chunk_bytes,
    create_body,
    error_of,
    exec_body,
    find_daemon,
    returncode_of,
    seg,
)
from .image import Image, Progress

_TIMEOUT = httpx.Timeout(None, connect=10.0)
T = TypeVar("T")


class Client:
    """One daemon connection (a Unix socket, else 127.0.0.1 with the token)."""

    def __init__(self, endpoint: Optional[Endpoint] = None, *, home: Optional[str] = None) -> None:
        ep = endpoint or find_daemon(home)
        headers = {"authorization": f"Bearer {ep.token}"} if ep.token else {}
        if ep.socket:
            transport = httpx.HTTPTransport(uds=ep.socket)
            self.http = httpx.Client(transport=transport, base_url="http://localhost", timeout=_TIMEOUT)
        else:
            self.http = httpx.Client(base_url=ep.base_url or "", headers=headers, timeout=_TIMEOUT)

    def request(self, method: str, url: str, **kw: Any) -> httpx.Response:
        try:
            resp = self.http.request(method, url, **kw)
        except httpx.TransportError as e:
            raise BelljarError("daemon_unavailable", f"Cannot reach the daemon: {e}") from e
        if resp.status_code >= 400:
            raise error_of(resp.status_code, resp.content)
        return resp

    def json(self, method: str, url: str, body: Any = None, **kw: Any) -> Any:
        resp = self.request(method, url, json=body, **kw) if body is not None else self.request(method, url, **kw)
        return resp.json() if resp.content else None

    def perform(self, call: _ops.Call) -> Any:
        """One request of an operation (``_ops``): its answer, decoded unless raw."""
        kw: Dict[str, Any] = {"params": call.params, "headers": call.headers}
        if call.body is not None:
            kw["json"] = call.body
        if call.content is not None:
            kw["content"] = call.content
        if call.timeout is not None:
            kw["timeout"] = call.timeout
        with contextlib.ExitStack() as stack:
            if call.upload is not None:
                kw["content"] = stack.enter_context(open(call.upload, "rb"))
            if call.lines is not None:
                self._stream_lines(call, kw)
                return None
            if call.download is not None:
                self._download(call.download, call, kw)
                return None
            try:
                resp = self.request(call.method, call.url, **kw)
            except httpx.TimeoutException as e:
                raise BelljarError("timeout", f"{call.method} {call.url} took longer than {call.timeout}s") from e
        if call.raw:
            return resp.content
        return resp.json() if resp.content else None

    def _download(self, local: Path, call: _ops.Call, kw: Dict[str, Any]) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(local.name + ".belljar-part")
        try:
            with self.http.stream(call.method, call.url, **kw) as resp:
                if resp.status_code >= 400:
                    raise error_of(resp.status_code, resp.read())
                with open(tmp, "wb") as f:
                    for chunk in resp.iter_bytes():
                        f.write(chunk)
            os.replace(tmp, local)
        except httpx.TransportError as e:
            raise BelljarError("connection_lost", f"Stream from the daemon broke: {e}") from e
        finally:
            tmp.unlink(missing_ok=True)

    def _stream_lines(self, call: _ops.Call, kw: Dict[str, Any]) -> None:
        assert call.lines is not None
        try:
            with self.http.stream(call.method, call.url, **kw) as resp:
                if resp.status_code >= 400:
                    raise error_of(resp.status_code, resp.read())
                for line in resp.iter_lines():
                    if line.strip():
                        call.lines(json.loads(line))
        except httpx.TransportError as e:
            raise BelljarError("connection_lost", f"Stream from the daemon broke: {e}") from e

    def run(self, op: "_ops.Op[T]") -> T:
        """Runs an operation of ``_ops`` to its result."""
        return _ops.drive(op, self.perform)

    def ndjson(self, url: str) -> Iterator[Dict[str, Any]]:
        try:
            with self.http.stream("GET", url) as resp:
                if resp.status_code >= 400:
                    raise error_of(resp.status_code, resp.read())
                for line in resp.iter_lines():
                    if line.strip():
                        yield json.loads(line)
        except httpx.TransportError as e:
            raise BelljarError("connection_lost", f"Stream from the daemon broke: {e}") from e

    # Images.

    def images(self) -> List[Dict[str, Any]]:
        """Every image of the daemon (``GET /v1/images``: name, status, digest, size_bytes,
        source, used_by, ...)."""
        return self.run(_ops.images())

    def pull_image(self, reference: str, *, insecure: bool = False, progress: Optional[Progress] = None) -> Dict[str, Any]:
        """Pulls ``reference`` from its registry (plain HTTP to a registry off loopback with
        ``insecure``); ``progress`` is given each event. The pulled image."""
        return self.run(_ops.pull_image(reference, insecure, progress))

    def import_image(
        self, archive: Union[str, Path, bytes], *, tag: Optional[str] = None, progress: Optional[Progress] = None
    ) -> List[Dict[str, Any]]:
        """Imports a ``docker save`` archive or an OCI layout as a tar (a path, streamed, or
        bytes), also named ``tag`` when given. The images it held."""
        return self.run(_ops.import_image(archive, tag, progress))

    def remove_image(self, name: str) -> None:
        """Removes a pulled, imported or built image's name (``conflict`` while a sandbox,
        snapshot or template uses it)."""
        self.run(_ops.remove_image(name))

    def prune_images(self, *, all: bool = False, build_cache: bool = False) -> Dict[str, Any]:
        """Removes the images nothing stands on: unnamed ones, with ``all`` every named one of
        the user's, with ``build_cache`` the Dockerfile step cache. ``{removed, reclaimed_bytes}``."""
        return self.run(_ops.prune_images(all, build_cache))

    def export_image(self, name: str, path: Union[str, Path]) -> None:
        """Writes a user's image to ``path`` as an OCI archive (``import_image``, ``podman
        load`` and ``docker load`` read it), streamed beside it and renamed when whole."""
        self.run(_ops.export_image(name, path))


_default: Optional[Client] = None


def _client(client: Optional[Client]) -> Client:
    global _default
    if client is not None:
        return client
    if _default is None:
        _default = Client()
    return _default


class Volume:
    """A named volume (Modal's ``Volume``): files that outlive sandboxes, mounted with
    ``Sandbox.create(volumes={"/data": vol})`` and shared by every sandbox that mounts it."""

    def __init__(self, name: str, *, mounted_read_only: bool = False, size_mib: Optional[int] = None) -> None:
        self.name = name
        self.mounted_read_only = mounted_read_only
        self.size_mib = size_mib

    @staticmethod
    def from_name(
        name: str,
        *,
        create_if_missing: bool = False,
        size_mib: Optional[int] = None,
        client: Optional[Client] = None,
    ) -> "Volume":
        """The volume ``name``; with ``create_if_missing``, made (capped at ``size_mib``) if absent."""
        data = _client(client).run(_ops.volume_from_name(name, create_if_missing, size_mib))
        return Volume(str(data["name"]), size_mib=data.get("size_mib"))

    def read_only(self) -> "Volume":
        """The same volume, mounted read-only."""
        return Volume(self.name, mounted_read_only=True, size_mib=self.size_mib)

    @staticmethod
    def delete(name: str, *, client: Optional[Client] = None) -> None:
        """Deletes the volume and its files (``volume_in_use`` while a sandbox mounts it)."""
        _client(client).run(_ops.volume_delete(name))


class StreamReader:
    """A process's stdout or stderr: iterate lines as they arrive, or ``read()`` it all."""

    def __init__(self, proc: "ContainerProcess", stream: str) -> None:
        self._proc = proc
        self._stream = stream

    def __iter__(self) -> Iterator[str]:
        pending = b""
        for data in self._proc._chunks(self._stream):
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield (line + b"\n").decode("utf-8", "replace")
        if pending:
            yield pending.decode("utf-8", "replace")

    def read(self) -> str:
        return "".join(self)


class StreamWriter:
    """A process's stdin."""

    def __init__(self, proc: "ContainerProcess") -> None:
        self._proc = proc

    def write(self, data: Union[str, bytes]) -> None:
        raw = data.encode() if isinstance(data, str) else bytes(data)
        self._proc._stdin(raw, close=False)

    def write_eof(self) -> None:
        self._proc._stdin(b"", close=True)

    def drain(self) -> None:
        """Writes are sent at once; kept for Modal's API."""

    close = write_eof


class ContainerProcess:
    """A command started by ``Sandbox.exec``."""

    def __init__(self, client: Client, command: Dict[str, Any]) -> None:
        self._client = client
        self._data = command
        self._url = _ops.command_url(command)
        self._queues: Dict[str, "queue.Queue[Optional[bytes]]"] = {"stdout": queue.Queue(), "stderr": queue.Queue()}
        self._pump: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        self.stdout = StreamReader(self, "stdout")
        self.stderr = StreamReader(self, "stderr")
        self.stdin = StreamWriter(self)

    @property
    def object_id(self) -> str:
        return str(self._data["id"])

    @property
    def returncode(self) -> Optional[int]:
        return returncode_of(self._data)

    def poll(self) -> Optional[int]:
        """The exit code if the command ended, else ``None``."""
        self._data = self._client.run(_ops.command_get(self._url, wait=False))
        return self.returncode

    def wait(self) -> int:
        """Waits until the command ends; its exit code (``-signal`` when killed)."""
        self._data = self._client.run(_ops.command_get(self._url, wait=True))
        code = self.returncode
        assert code is not None
        return code

    def kill(self, signal: str = "KILL") -> None:
        self._data = self._client.run(_ops.command_kill(self._url, signal))

    def _stdin(self, data: bytes, close: bool) -> None:
        self._client.run(_ops.command_stdin(self._url, data, close))

    def _chunks(self, stream: str) -> Iterator[bytes]:
        with self._lock:
            if self._pump is None:
                self._pump = threading.Thread(target=self._run_pump, daemon=True)
                self._pump.start()
        q = self._queues[stream]
        while True:
            item = q.get()
            if item is None:
                return
            yield item

    def _run_pump(self) -> None:
        try:
            for line in self._client.ndjson(self._url + "/logs?follow=true"):
                self._queues[line["stream"]].put(chunk_bytes(line))
        finally:
            for q in self._queues.values():
                q.put(None)


class SandboxFilesystem:
    """A sandbox's files (Modal's ``Sandbox.filesystem``)."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sb = sandbox

    def _url(self, rest: str = "") -> str:
        return f"/v1/sandboxes/{seg(self._sb.object_id)}/files{rest}"

    def read_bytes(self, remote_path: str) -> bytes:
        return self._sb._client.run(_ops.read_bytes(self._sb.object_id, remote_path))

    def read_text(self, remote_path: str) -> str:
        return self.read_bytes(remote_path).decode("utf-8")

    def write_bytes(self, data: Union[bytes, bytearray, memoryview], remote_path: str, *, mode: Optional[int] = None) -> None:
        self._sb._client.run(_ops.write_bytes(self._sb.object_id, bytes(data), remote_path, mode))

    def write_text(self, data: str, remote_path: str) -> None:
        self.write_bytes(data.encode("utf-8"), remote_path)

    def copy_from_local(self, local_path: Union[str, Path], remote_path: str) -> None:
        with open(local_path, "rb") as f:
            self._sb._client.request(
                "PUT", self._url(), params={"path": remote_path}, content=f,
                headers={"content-type": "application/octet-stream"},
            )

    def copy_to_local(self, remote_path: str, local_path: Union[str, Path]) -> None:
        local = Path(local_path)
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(local.name + ".belljar-part")
        try:
            with self._sb._client.http.stream("GET", self._url(), params={"path": remote_path}) as resp:
                if resp.status_code >= 400:
                    raise error_of(resp.status_code, resp.read())
                with open(tmp, "wb") as f:
                    for chunk in resp.iter_bytes():
                        f.write(chunk)
            shutil.move(str(tmp), str(local))
        finally:
            tmp.unlink(missing_ok=True)

    def stat(self, remote_path: str) -> FileEntry:
        return self._sb._client.run(_ops.stat(self._sb.object_id, remote_path))

    def list_files(self, remote_path: str) -> List[FileEntry]:
        return self._sb._client.run(_ops.list_files(self._sb.object_id, remote_path))

    def ls(self, path: str) -> List[str]:
        return [e.name for e in self.list_files(path)]

    def make_directory(self, remote_path: str, *, create_parents: bool = True) -> None:
        self._sb._client.run(_ops.make_directory(self._sb.object_id, remote_path, create_parents))

    mkdir = make_directory

    def remove(self, remote_path: str, *, recursive: bool = False) -> None:
        self._sb._client.run(_ops.remove(self._sb.object_id, remote_path, recursive))

    rm = remove


class Sandbox:
    """A Belljar sandbox."""

    def __init__(self, client: Client, data: Dict[str, Any]) -> None:
        self._client = client
        self._data = data
        self.filesystem = SandboxFilesystem(self)

    @property
    def object_id(self) -> str:
        return str(self._data["id"])

    @property
    def status(self) -> str:
        return str(self._data["status"])

    @staticmethod
    def create(
        *,
        image: Any = None,
        timeout: Optional[int] = 300,
        idle_timeout: Optional[int] = None,
        env: Optional[Mapping[str, Optional[str]]] = None,
        tags: Optional[Mapping[str, str]] = None,
        block_network: bool = False,
        outbound_cidr_allowlist: Optional[Sequence[str]] = None,
        name: Optional[str] = None,
        cpu: Optional[float] = None,
        memory: Optional[int] = None,
        unencrypted_ports: Sequence[int] = (),
        encrypted_ports: Sequence[int] = (),
        h2_ports: Sequence[int] = (),
        volumes: Optional[Mapping[str, Any]] = None,
        client: Optional[Client] = None,
    ) -> "Sandbox":
        """Creates a sandbox (``image`` is an image name, an ``Image`` recipe, built first
        when this daemon does not have it yet, or a ``SnapshotImage``); returns once it runs."""
        built = isinstance(image, Image)
        body = create_body(
            image=None if built else image, timeout=timeout, idle_timeout=idle_timeout, env=env, tags=tags,
            block_network=block_network, outbound_cidr_allowlist=outbound_cidr_allowlist,
            name=name, cpu=cpu, memory=memory, volumes=volumes,
        )
        check_ports(encrypted_ports, h2_ports)
        c = _client(client)
        if built:
            body["image"] = image.build(c)
        return Sandbox(c, c.run(_ops.create(body, list(unencrypted_ports))))

    @staticmethod
    def from_id(sandbox_id: str, client: Optional[Client] = None) -> "Sandbox":
        c = _client(client)
        return Sandbox(c, c.run(_ops.get(sandbox_id)))

    @staticmethod
    def list(*, tags: Optional[Mapping[str, str]] = None, client: Optional[Client] = None) -> Iterator["Sandbox"]:
        """Sandboxes carrying at least ``tags``, newest first."""
        c = _client(client)
        want = dict(tags or {})
        cursor: Optional[str] = None
        while True:
            page = c.run(_ops.list_page(want, cursor))
            for s in page["sandboxes"]:
                if _ops.matches(s, want):
                    yield Sandbox(c, s)
            cursor = page.get("next_cursor")
            if not cursor:
                return

    def exec(
        self,
        *args: str,
        workdir: Optional[str] = None,
        env: Optional[Mapping[str, Optional[str]]] = None,
        pty: bool = False,
        sudo: bool = False,
    ) -> ContainerProcess:
        """Starts a command; its output streams while it runs."""
        body = exec_body(args, workdir, env, pty, sudo)
        return ContainerProcess(self._client, self._client.run(_ops.exec_command(self.object_id, body)))

    def get_tags(self) -> Dict[str, str]:
        self._data = self._client.run(_ops.get(self.object_id))
        return dict(self._data["tags"])

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self._data = self._client.run(_ops.update(self.object_id, {"tags": dict(tags)}))

    def snapshot_filesystem(self, timeout: int = 55) -> SnapshotImage:
        """Snapshots the files (the sandbox keeps running); start new sandboxes from it with
        ``Sandbox.create(image=snapshot)``."""
        return self._client.run(_ops.snapshot_filesystem(self.object_id, float(timeout)))

    def snapshot_directory(self, path: str) -> SnapshotImage:
        """Snapshots one directory (the sandbox keeps running), as Modal's
        ``snapshot_directory``; mount it with ``mount_image`` or the API's ``mounts``."""
        return self._client.run(_ops.snapshot_directory(self.object_id, path))

    def mount_image(self, path: str, image: Union[SnapshotImage, str]) -> None:
        """Mounts a directory snapshot at ``path`` of this running sandbox, copy-on-write
        (Modal's ``mount_image``): a missing path is made, an existing one hidden."""
        snapshot_id = image if isinstance(image, str) else image.object_id
        self._client.run(_ops.mount_image(self.object_id, path, snapshot_id))

    def unmount_image(self, path: str) -> None:
        """Unmounts the snapshot mounted at exactly ``path`` (Modal's ``unmount_image``);
        what was there shows again and the writes under the mount are discarded."""
        self._client.run(_ops.unmount_image(self.object_id, path))

    def poll(self) -> Optional[str]:
        """``None`` while the sandbox runs, else its final status."""
        self._data = self._client.run(_ops.get(self.object_id))
        return None if self.status in ("pending", "running", "paused") else self.status

    def tunnels(self, timeout: int = 50) -> Dict[int, Tunnel]:
        """The exposed ports (``unencrypted_ports``), by the sandbox's port."""
        return self._client.run(_ops.tunnels(self.object_id))

    def network_policy(self) -> Any:
        """The firewall: ``"allow-all"``, ``"deny-all"`` or rules (brokered values redacted)."""
        return self._client.run(_ops.network_policy(self.object_id))

    def set_network_policy(self, policy: Any) -> None:
        """Replaces the firewall while the sandbox runs."""
        self._data = self._client.run(_ops.update(self.object_id, {"network_policy": policy}))

    def terminate(self) -> None:
        """Stops the sandbox; a no-op when it already ended."""
        stopped = self._client.run(_ops.terminate(self.object_id))
        if stopped is not None:
            self._data = stopped

    def delete(self) -> None:
        self._client.run(_ops.delete(self.object_id))
