"""Image management on both clients against a real daemon (sdk/run-tests.sh starts one and
sets BELLJAR_HOME): a tiny OCI layout made here imported, listed with its source, exported
and imported back under another name with the same files, its removal refused while a
sandbox uses it, then removed; a prune's answer; a pull from a port nothing listens on
failing with a code.

The image store outlives the daemon's home and other runs share it, so every name here holds
this run's id and the images are removed at the end."""

import asyncio
import hashlib
import io
import json
import os
import tarfile
import time
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from belljar import BelljarError, Client, Sandbox
from belljar.aio import AsyncClient

RUN = f"{os.getpid()}-{time.time_ns()}"
TAG = {"suite": f"py-images-{os.getpid()}"}
FILE, CONTENT = "belljar-sdk.txt", b"from the layout\n"


def _tar(files: Dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            t.addfile(info, io.BytesIO(data))
    return out.getvalue()


def oci_layout_tar() -> bytes:
    """An OCI image layout, as a tar, of one image with one layer holding one file."""
    blobs: Dict[str, bytes] = {}

    def blob(media_type: str, data: bytes) -> Dict[str, object]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[f"blobs/sha256/{digest[7:]}"] = data
        return {"mediaType": media_type, "digest": digest, "size": len(data)}

    layer = blob("application/vnd.oci.image.layer.v1.tar", _tar({FILE: CONTENT}))
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": [layer["digest"]]},
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": blob("application/vnd.oci.image.config.v1+json", json.dumps(config).encode()),
        "layers": [layer],
    }
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [blob("application/vnd.oci.image.manifest.v1+json", json.dumps(manifest).encode())],
    }
    return _tar({
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index).encode(),
        **blobs,
    })


def name(which: str) -> str:
    return f"localhost/belljar-sdk-py-{RUN}/{which}:1"


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    c = Client()
    yield c
    for left in Sandbox.list(tags=TAG, client=c):
        left.delete()
    for image in c.images():
        if RUN in image["name"]:
            c.remove_image(image["name"])


def by_name(c: Client, n: str) -> Dict[str, object]:
    return next(i for i in c.images() if i["name"] == n)


def test_import_list_export_import_back_remove(client: Client, tmp_path: Path) -> None:
    layout = tmp_path / "layout.tar"
    layout.write_bytes(oci_layout_tar())
    events: List[object] = []
    imported = client.import_image(layout, tag=name("a"), progress=events.append)
    assert name("a") in [i["name"] for i in imported]
    assert events and events[-1]["type"] == "done"  # type: ignore[index]
    listed = by_name(client, name("a"))
    assert listed["status"] == "ready"
    assert str(listed["source"]).startswith("import")
    assert str(listed["digest"]).startswith("sha256:")
    assert listed["used_by"] == {"sandboxes": [], "snapshots": [], "templates": []}

    archive = tmp_path / "out" / "a.tar"
    client.export_image(name("a"), archive)
    assert sorted(p.name for p in archive.parent.iterdir()) == ["a.tar"]
    with tarfile.open(archive) as t:
        assert {"oci-layout", "index.json", "manifest.json"} <= set(t.getnames())

    # The archive records the name it was exported under: both names now name the image it
    # holds, a new one (each layer written anew), and the first image is left unnamed.
    back = client.import_image(archive.read_bytes(), tag=name("b"))
    assert [i["name"] for i in back] == [name("a")]
    assert back[0]["digest"] != listed["digest"]
    assert by_name(client, name("b"))["digest"] == back[0]["digest"]
    sb = Sandbox.create(image=name("b"), timeout=300, tags=TAG, client=client)
    try:
        assert sb.filesystem.read_bytes("/" + FILE) == CONTENT
        assert by_name(client, name("b"))["used_by"]["sandboxes"] == [sb.object_id]  # type: ignore[index]
        client.remove_image(name("a"))
        with pytest.raises(BelljarError) as refused:
            client.remove_image(name("b"))
        assert refused.value.code == "conflict", refused.value
    finally:
        sb.delete()
    client.remove_image(name("b"))
    assert not [i for i in client.images() if RUN in i["name"]]
    with pytest.raises(BelljarError) as gone:
        client.remove_image(name("a"))
    assert gone.value.code == "image_not_available", gone.value
    with pytest.raises(BelljarError) as not_exported:
        client.export_image(name("a"), archive)
    assert not_exported.value.code == "image_not_available", not_exported.value


def test_prune_answers_what_it_removed(client: Client) -> None:
    pruned = client.prune_images()
    assert set(pruned) == {"removed", "reclaimed_bytes"}
    assert isinstance(pruned["reclaimed_bytes"], int)
    for r in pruned["removed"]:
        assert set(r) >= {"id", "names", "build_step", "size_bytes"}


def test_pull_from_nothing_fails_with_a_code(client: Client) -> None:
    started = time.monotonic()
    with pytest.raises(BelljarError) as failed:
        client.pull_image("127.0.0.1:1/none:1")
    assert failed.value.code == "registry_unavailable", failed.value
    assert time.monotonic() - started < 60


def test_async_client(tmp_path: Path) -> None:
    async def scenario() -> None:
        c = AsyncClient()
        try:
            layout = tmp_path / "layout.tar"
            layout.write_bytes(oci_layout_tar())
            imported = await c.import_image(layout, tag=name("aio"))
            assert name("aio") in [i["name"] for i in imported]
            assert name("aio") in [i["name"] for i in await c.images()]
            await c.export_image(name("aio"), tmp_path / "aio.tar")
            assert (tmp_path / "aio.tar").stat().st_size > 0
            assert set(await c.prune_images()) == {"removed", "reclaimed_bytes"}
            await c.remove_image(name("aio"))
            with pytest.raises(BelljarError) as gone:
                await c.remove_image(name("aio"))
            assert gone.value.code == "image_not_available"
            with pytest.raises(BelljarError) as failed:
                await c.pull_image("127.0.0.1:1/none:1")
            assert failed.value.code == "registry_unavailable"
        finally:
            await c.aclose()

    asyncio.run(scenario())
