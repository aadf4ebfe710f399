"""The asyncio client against a real daemon: the same ergonomics as coroutines."""

import asyncio
import os

from belljar import BelljarError
from belljar.aio import AsyncSandbox

TAG = {"suite": f"py-aio-{os.getpid()}"}


async def scenario(tmp_path):
    sb = await AsyncSandbox.create(timeout=600, tags=TAG)
    try:
        p = await sb.exec("sh", "-c", "echo one; read go; echo two; echo err >&2")
        lines = p.stdout.__aiter__()
        assert await lines.__anext__() == "one\n"
        assert await p.poll() is None
        await p.stdin.write(b"go\n")
        await p.stdin.write_eof()
        assert [line async for line in lines] == ["two\n"]
        assert await p.stderr.read() == "err\n"
        assert await p.wait() == 0

        await sb.filesystem.write_text("x", "/workspace/a/b.txt")
        assert await sb.filesystem.ls("/workspace/a") == ["b.txt"]
        await sb.filesystem.copy_to_local("/workspace/a/b.txt", tmp_path / "b.txt")
        assert (tmp_path / "b.txt").read_text() == "x"
        await sb.set_tags({**TAG, "k": "v"})
        assert await sb.get_tags() == {**TAG, "k": "v"}
        assert [s.object_id async for s in AsyncSandbox.list(tags={**TAG, "k": "v"})] == [sb.object_id]

        snap = await sb.snapshot_filesystem()
        sb2 = await AsyncSandbox.create(image=snap, tags=TAG)
        assert await sb2.filesystem.read_text("/workspace/a/b.txt") == "x"
        await sb2.terminate()
        blocked = await AsyncSandbox.create(block_network=True, unencrypted_ports=[8000], tags=TAG)
        assert await blocked.network_policy() == "deny-all"
        assert list(await blocked.tunnels()) == [8000]
        try:
            await AsyncSandbox.from_id("sbx_nosuch")
            raise AssertionError("expected not_found")
        except BelljarError as e:
            assert e.code == "not_found"
    finally:
        async for s in AsyncSandbox.list(tags=TAG):
            await s.delete()


def test_async_client(tmp_path):
    asyncio.run(scenario(tmp_path))
