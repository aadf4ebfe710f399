"""The asyncio client: ``AsyncSandbox`` mirrors ``belljar.Sandbox`` with coroutines
(``await AsyncSandbox.create(...)``, ``async for line in p.stdout``), over httpx's
``AsyncClient``. Request bodies and answers are built and read by the same code as the sync
client (``_common``), and every request-answer operation is the same sans-IO generator
(``_ops``) that this client awaits and the sync one drives blocking."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any, AsyncIterator, Dict, List, Mapping, Optional, Sequence, TypeVar, Union

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


class AsyncClient:
    """One daemon connection (a Unix socket, else 127.0.0.1 with the token)."""

    def __init__(self, endpoint: Optional[Endpoint] = None, *, home: Optional[str] = None) -> None:
        ep = endpoint or find_daemon(home)
        if ep.socket:
            transport = httpx.AsyncHTTPTransport(uds=ep.socket)
            self.http = httpx.AsyncClient(transport=transport, base_url="http://localhost", timeout=_TIMEOUT)
        else:
            headers = {"authorization": f"Bearer {ep.token}"} if ep.token else {}
            self.http = httpx.AsyncClient(base_url=ep.base_url or "", headers=headers, timeout=_TIMEOUT)

    async def request(self, method: str, url: str, **kw: Any) -> httpx.Response:
        try:
            resp = await self.http.request(method, url, **kw)
        except httpx.TransportError as e:
            raise BelljarError("daemon_unavailable", f"Cannot reach the daemon: {e}") from e
        if resp.status_code >= 400:
            raise error_of(resp.status_code, resp.content)
        return resp

    async def json(self, method: str, url: str, body: Any = None, **kw: Any) -> Any:
        if body is not None:
            kw["json"] = body
        resp = await self.request(method, url, **kw)
        return resp.json() if resp.content else None

    async def perform(self, call: _ops.Call) -> Any:
        """One request of an operation (``_ops``): its answer, decoded unless raw."""
        kw: Dict[str, Any] = {"params": call.params, "headers": call.headers}
        if call.body is not None:
            kw["json"] = call.body
        if call.content is not None:
            kw["content"] = call.content
        if call.upload is not None:
            kw["content"] = _read_chunks(call.upload)
        if call.lines is not None:
            await self._stream_lines(call, kw)
            return None
        if call.download is not None:
            await self._download(call.download, call, kw)
            return None
        try:
            resp = await asyncio.wait_for(self.request(call.method, call.url, **kw), call.timeout)
        except asyncio.TimeoutError as e:
            raise BelljarError("timeout", f"{call.method} {call.url} took longer than {call.timeout}s") from e
        if call.raw:
            return resp.content
        return resp.json() if resp.content else None

    async def _stream_lines(self, call: _ops.Call, kw: Dict[str, Any]) -> None:
        assert call.lines is not None
        try:
            async with self.http.stream(call.method, call.url, **kw) as resp:
                if resp.status_code >= 400:
                    raise error_of(resp.status_code, await resp.aread())
                async for line in resp.aiter_lines():
                    if line.strip():
                        call.lines(json.loads(line))
        except httpx.TransportError as e:
            raise BelljarError("connection_lost", f"Stream from the daemon broke: {e}") from e

    async def _download(self, local: Path, call: _ops.Call, kw: Dict[str, Any]) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(local.name + ".belljar-part")
        try:
            async with self.http.stream(call.method, call.url, **kw) as resp:
                if resp.status_code >= 400:
                    raise error_of(resp.status_code, await resp.aread())
                with open(tmp, "wb") as f:
                    async for chunk in resp.aiter_bytes():
                        await asyncio.to_thread(f.write, chunk)
            os.replace(tmp, local)
        except httpx.TransportError as e:
            raise BelljarError("connection_lost", f"Stream from the daemon broke: {e}") from e
        finally:
            tmp.unlink(missing_ok=True)

    async def run(self, op: "_ops.Op[T]") -> T:
        """Runs an operation of ``_ops`` to its result."""
        return await _ops.adrive(op, self.perform)

    async def ndjson(self, url: str) -> AsyncIterator[Dict[str, Any]]:
        try:
            async with self.http.stream("GET", url) as resp:
                if resp.status_code >= 400:
                    raise error_of(resp.status_code, await resp.aread())
                async for line in resp.aiter_lines():
                    if line.strip():
                        yield json.loads(line)
        except httpx.TransportError as e:
            raise BelljarError("connection_lost", f"Stream from the daemon broke: {e}") from e

    async def aclose(self) -> None:
        await self.http.aclose()

    # Images: as ``belljar.Client``'s.

    async def images(self) -> List[Dict[str, Any]]:
        """Every image of the daemon (``GET /v1/images``)."""
        return await self.run(_ops.images())

    async def pull_image(self, reference: str, *, insecure: bool = False, progress: Optional[Progress] = None) -> Dict[str, Any]:
        """Pulls ``reference`` from its registry; the pulled image."""
        return await self.run(_ops.pull_image(reference, insecure, progress))

    async def import_image(
        self, archive: Union[str, Path, bytes], *, tag: Optional[str] = None, progress: Optional[Progress] = None
    ) -> List[Dict[str, Any]]:
        """Imports an image archive (a path, streamed, or bytes); the images it held."""
        return await self.run(_ops.import_image(archive, tag, progress))

    async def remove_image(self, name: str) -> None:
        """Removes an image's name (``conflict`` while something uses it)."""
        await self.run(_ops.remove_image(name))

    async def prune_images(self, *, all: bool = False, build_cache: bool = False) -> Dict[str, Any]:
        """Removes the images nothing stands on; ``{removed, reclaimed_bytes}``."""
        return await self.run(_ops.prune_images(all, build_cache))

    async def export_image(self, name: str, path: Union[str, Path]) -> None:
        """Writes a user's image to ``path`` as an OCI archive, renamed when whole."""
        await self.run(_ops.export_image(name, path))


async def _read_chunks(path: Path) -> AsyncIterator[bytes]:
    """A file's bytes as an upload body, read in a thread."""
    with open(path, "rb") as f:
        while chunk := await asyncio.to_thread(f.read, 1 << 20):
            yield chunk


class AsyncStreamReader:
    """A process's stdout or stderr: ``async for`` lines as they arrive, or ``await read()``."""

    def __init__(self, proc: "AsyncContainerProcess", stream: str) -> None:
        self._proc = proc
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[str]:
        pending = b""
        q = self._proc._queue(self._stream)
        while True:
            data = await q.get()
            if data is None:
                break
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield (line + b"\n").decode("utf-8", "replace")
        if pending:
            yield pending.decode("utf-8", "replace")

    async def read(self) -> str:
        return "".join([line async for line in self])


class AsyncStreamWriter:
    """A process's stdin."""

    def __init__(self, proc: "AsyncContainerProcess") -> None:
        self._proc = proc

    async def write(self, data: Union[str, bytes]) -> None:
        await self._proc._stdin(data.encode() if isinstance(data, str) else bytes(data), close=False)

    async def write_eof(self) -> None:
        await self._proc._stdin(b"", close=True)

    close = write_eof


class AsyncContainerProcess:
    """A command started by ``AsyncSandbox.exec``."""

    def __init__(self, client: AsyncClient, command: Dict[str, Any]) -> None:
        self._client = client
        self._data = command
        self._url = _ops.command_url(command)
        self._queues: Dict[str, "asyncio.Queue[Optional[bytes]]"] = {}
        self._pump: Optional["asyncio.Task[None]"] = None
        self.stdout = AsyncStreamReader(self, "stdout")
        self.stderr = AsyncStreamReader(self, "stderr")
        self.stdin = AsyncStreamWriter(self)

    @property
    def object_id(self) -> str:
        return str(self._data["id"])

    @property
    def returncode(self) -> Optional[int]:
        return returncode_of(self._data)

    async def poll(self) -> Optional[int]:
        self._data = await self._client.run(_ops.command_get(self._url, wait=False))
        return self.returncode

    async def wait(self) -> int:
        self._data = await self._client.run(_ops.command_get(self._url, wait=True))
        code = self.returncode
        assert code is not None
        return code

    async def kill(self, signal: str = "KILL") -> None:
        self._data = await self._client.run(_ops.command_kill(self._url, signal))

    async def _stdin(self, data: bytes, close: bool) -> None:
        await self._client.run(_ops.command_stdin(self._url, data, close))

    def _queue(self, stream: str) -> "asyncio.Queue[Optional[bytes]]":
        if self._pump is None:
            self._queues = {"stdout": asyncio.Queue(), "stderr": asyncio.Queue()}
            self._pump = asyncio.ensure_future(self._run_pump())
        return self._queues[stream]

    async def _run_pump(self) -> None:
        try:
            async for line in self._client.ndjson(self._url + "/logs?follow=true"):
                self._queues[line["stream"]].put_nowait(chunk_bytes(line))
        finally:
            for q in self._queues.values():
                q.put_nowait(None)


class AsyncSandboxFilesystem:
    """A sandbox's files."""

    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._sb = sandbox

    def _url(self, rest: str = "") -> str:
        return f"/v1/sandboxes/{seg(self._sb.object_id)}/files{rest}"

    async def read_bytes(self, remote_path: str) -> bytes:
        return await self._sb._client.run(_ops.read_bytes(self._sb.object_id, remote_path))

    async def read_text(self, remote_path: str) -> str:
        return (await self.read_bytes(remote_path)).decode("utf-8")

    async def write_bytes(self, data: Union[bytes, bytearray, memoryview], remote_path: str, *, mode: Optional[int] = None) -> None:
        await self._sb._client.run(_ops.write_bytes(self._sb.object_id, bytes(data), remote_path, mode))

    async def write_text(self, data: str, remote_path: str) -> None:
        await self.write_bytes(data.encode("utf-8"), remote_path)

    async def copy_from_local(self, local_path: Union[str, Path], remote_path: str) -> None:
        await self.write_bytes(Path(local_path).read_bytes(), remote_path)

    async def copy_to_local(self, remote_path: str, local_path: Union[str, Path]) -> None:
        local = Path(local_path)
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(await self.read_bytes(remote_path))

    async def stat(self, remote_path: str) -> FileEntry:
        return await self._sb._client.run(_ops.stat(self._sb.object_id, remote_path))

    async def list_files(self, remote_path: str) -> List[FileEntry]:
        return await self._sb._client.run(_ops.list_files(self._sb.object_id, remote_path))

    async def ls(self, path: str) -> List[str]:
        return [e.name for e in await self.list_files(path)]

    async def make_directory(self, remote_path: str, *, create_parents: bool = True) -> None:
        await self._sb._client.run(_ops.make_directory(self._sb.object_id, remote_path, create_parents))

    mkdir = make_directory

    async def remove(self, remote_path: str, *, recursive: bool = False) -> None:
        await self._sb._client.run(_ops.remove(self._sb.object_id, remote_path, recursive))

    rm = remove


class AsyncSandbox:
    """A Belljar sandbox, for asyncio code."""

    def __init__(self, client: AsyncClient, data: Dict[str, Any]) -> None:
        self._client = client
        self._data = data
        self.filesystem = AsyncSandboxFilesystem(self)

    @property
    def object_id(self) -> str:
        return str(self._data["id"])

    @property
    def status(self) -> str:
        return str(self._data["status"])

    @staticmethod
    async def create(
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
        client: Optional[AsyncClient] = None,
    ) -> "AsyncSandbox":
        built = isinstance(image, Image)
        body = create_body(
            image=None if built else image, timeout=timeout, idle_timeout=idle_timeout, env=env, tags=tags,
            block_network=block_network, outbound_cidr_allowlist=outbound_cidr_allowlist,
            name=name, cpu=cpu, memory=memory, volumes=volumes,
        )
        check_ports(encrypted_ports, h2_ports)
        c = client or AsyncClient()
        if built:
            body["image"] = await image.build_async(c)
        return AsyncSandbox(c, await c.run(_ops.create(body, list(unencrypted_ports))))

    @staticmethod
    async def from_id(sandbox_id: str, client: Optional[AsyncClient] = None) -> "AsyncSandbox":
        c = client or AsyncClient()
        return AsyncSandbox(c, await c.run(_ops.get(sandbox_id)))

    @staticmethod
    async def list(*, tags: Optional[Mapping[str, str]] = None, client: Optional[AsyncClient] = None) -> AsyncIterator["AsyncSandbox"]:
        c = client or AsyncClient()
        want = dict(tags or {})
        cursor: Optional[str] = None
        while True:
            page = await c.run(_ops.list_page(want, cursor))
            for s in page["sandboxes"]:
                if _ops.matches(s, want):
                    yield AsyncSandbox(c, s)
            cursor = page.get("next_cursor")
            if not cursor:
                return

    async def exec(
        self,
        *args: str,
        workdir: Optional[str] = None,
        env: Optional[Mapping[str, Optional[str]]] = None,
        pty: bool = False,
        sudo: bool = False,
    ) -> AsyncContainerProcess:
        body = exec_body(args, workdir, env, pty, sudo)
        data = await self._client.run(_ops.exec_command(self.object_id, body))
        return AsyncContainerProcess(self._client, data)

    async def get_tags(self) -> Dict[str, str]:
        self._data = await self._client.run(_ops.get(self.object_id))
        return dict(self._data["tags"])

    async def set_tags(self, tags: Mapping[str, str]) -> None:
        self._data = await self._client.run(_ops.update(self.object_id, {"tags": dict(tags)}))

    async def snapshot_filesystem(self, timeout: int = 55) -> SnapshotImage:
        return await self._client.run(_ops.snapshot_filesystem(self.object_id, float(timeout)))

    async def snapshot_directory(self, path: str) -> SnapshotImage:
        """Snapshots one directory (the sandbox keeps running), as Modal's
        ``snapshot_directory``."""
        return await self._client.run(_ops.snapshot_directory(self.object_id, path))

    async def mount_image(self, path: str, image: Union[SnapshotImage, str]) -> None:
        """Mounts a directory snapshot at ``path`` of this running sandbox (Modal's
        ``mount_image``)."""
        snapshot_id = image if isinstance(image, str) else image.object_id
        await self._client.run(_ops.mount_image(self.object_id, path, snapshot_id))

    async def unmount_image(self, path: str) -> None:
        """Unmounts the snapshot mounted at exactly ``path`` (Modal's ``unmount_image``)."""
        await self._client.run(_ops.unmount_image(self.object_id, path))

    async def tunnels(self, timeout: int = 50) -> Dict[int, Tunnel]:
        """The exposed ports (``unencrypted_ports``), by the sandbox's port."""
        return await self._client.run(_ops.tunnels(self.object_id))

    async def network_policy(self) -> Any:
        """The firewall: ``"allow-all"``, ``"deny-all"`` or rules (brokered values redacted)."""
        return await self._client.run(_ops.network_policy(self.object_id))

    async def set_network_policy(self, policy: Any) -> None:
        """Replaces the firewall while the sandbox runs."""
        self._data = await self._client.run(_ops.update(self.object_id, {"network_policy": policy}))

    async def terminate(self) -> None:
        stopped = await self._client.run(_ops.terminate(self.object_id))
        if stopped is not None:
            self._data = stopped

    async def delete(self) -> None:
        await self._client.run(_ops.delete(self.object_id))
