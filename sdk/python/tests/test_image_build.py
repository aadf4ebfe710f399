"""``belljar.Image`` built by a real daemon (sdk/run-tests.sh starts one and sets
BELLJAR_HOME): a recipe built on the first create and found again on the second, a changed
last step rebuilt with every earlier one cached, local files and directories, a Dockerfile
extended, an image of a registry on loopback (Debian's docker-registry, fed by buildah)
pulled once and built on, a failing step raising the daemon's code with its output, and the
asyncio client.

The image store outlives the daemon's home, so every recipe here holds this run's id (a
built image of an earlier run would not need building) and the images are removed at the
end. No recipe installs packages: this machine has no network (test_image.py checks the
text of apt_install and pip_install)."""

import asyncio
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, List, Set, Tuple

import pytest

from belljar import BelljarError, Client, Image, ImageBuildError, Sandbox
from belljar import _ops
from belljar._common import seg
from belljar.aio import AsyncClient, AsyncSandbox

RUN = f"{os.getpid()}-{time.time_ns()}"
TAG = {"suite": f"py-image-{os.getpid()}"}
BUILD = ("POST", "/v1/images/build")


#: The images this run built, removed at its end.
BUILT: Set[str] = set()


class Recording(Client):
    """The real client, noting each request it makes and each image it builds."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: List[Tuple[str, str]] = []

    def perform(self, call: _ops.Call) -> Any:
        self.calls.append((call.method, call.url))
        if (call.method, call.url) == BUILD:
            BUILT.add(str((call.params or {})["tag"]))
        return super().perform(call)


@pytest.fixture(scope="module")
def client():
    c = Recording()
    yield c
    for left in Sandbox.list(tags=TAG, client=c):
        left.delete()
    for name in sorted(BUILT):
        try:
            c.request("DELETE", f"/v1/images/{seg(name)}")
        except BelljarError as e:
            assert e.code == "image_not_available", e  # a failed build named nothing


def out(sb: Sandbox, script: str) -> str:
    p = sb.exec("sh", "-c", script)
    text = p.stdout.read()
    assert p.wait() == 0, p.stderr.read()
    return text


def test_a_recipe_is_built_once_and_runs(client: Recording, tmp_path: Path) -> None:
    g = tmp_path / "g.txt"
    g.write_text(f"local {RUN}\n")
    image = Image.base().env({"A": "1"}).workdir("/w").run_commands("echo hi > /w/f").add_local_file(g, "/w/g")
    sb = Sandbox.create(image=image, tags=TAG, client=client)
    assert BUILD in client.calls
    tag = sb._data["image"]
    assert tag.startswith("belljar-sdk/image:")
    assert out(sb, 'echo "$A"; pwd; cat f g') == f"1\n/w\nhi\nlocal {RUN}\n"

    # The second create finds the image by its name: no build.
    client.calls.clear()
    sb2 = Sandbox.create(image=image, tags=TAG, client=client)
    assert BUILD not in client.calls and sb2._data["image"] == tag
    assert out(sb2, "cat /w/f") == "hi\n"
    events: List[Any] = []
    assert image.build(client, progress=events.append) == tag and events == []

    # A changed last step is the only one run again.
    events = []
    tag2 = image.run_commands("echo two > /w/h").build(client, progress=events.append)
    steps = [e for e in events if e["type"] == "step"]
    assert tag2 != tag and len(steps) == 6
    assert [s["cached"] for s in steps[1:]] == [True, True, True, True, False], steps
    assert events[-1]["type"] == "done" and events[-1]["image"]["name"] == tag2


def test_a_failing_step_raises_the_daemons_code_and_output(client: Recording) -> None:
    image = Image.base().run_commands(f"echo failing-{RUN}; exit 3")
    with pytest.raises(ImageBuildError) as e:
        Sandbox.create(image=image, tags=TAG, client=client)
    assert e.value.code == "build_failed"
    assert "exit code 3" in e.value.message and f"failing-{RUN}" in e.value.message
    assert e.value.step == f"RUN echo failing-{RUN}; exit 3"
    assert f"failing-{RUN}" in e.value.output
    # No image was named.
    tag = image.build_context().tag(_base_digest(client))
    assert tag not in [i["name"] for i in client.json("GET", "/v1/images")]


def _base_digest(client: Client) -> str:
    base = next(i for i in client.json("GET", "/v1/images") if i["name"] == "base")
    return str(base.get("digest") or base.get("built_at") or "")


def test_a_local_dir_and_an_extended_dockerfile(client: Recording, tmp_path: Path) -> None:
    d = tmp_path / "proj"
    (d / "sub").mkdir(parents=True)
    (d / "sub" / "a.txt").write_text(RUN + "\n")
    (d / "skip.pyc").write_text("x")
    os.symlink("sub/a.txt", d / "link")
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(f"FROM base\nCOPY . /ctx/\nRUN echo {RUN} > /built\n")
    (ctx / "app.txt").write_text("app\n")
    (ctx / "x.log").write_text("left out")
    (ctx / ".dockerignore").write_text("*.log\n")
    image = Image.from_dockerfile(ctx / "Dockerfile").add_local_dir(d, "/opt/proj", ignore=["*.pyc"]).user("nobody")
    sb = Sandbox.create(image=image, tags=TAG, client=client)
    assert out(sb, "id -un; cat /built /ctx/app.txt; readlink /opt/proj/link; cat /opt/proj/link; ls -A /opt/proj") == (
        f"nobody\n{RUN}\napp\nsub/a.txt\n{RUN}\nlink\nsub\n"
    )
    # The user's .dockerignore applies, and nothing of the SDK's is in what `COPY .` took.
    assert out(sb, "ls -A /ctx") == ".dockerignore\nDockerfile\napp.txt\n"


def test_the_asyncio_client_builds_too(tmp_path: Path) -> None:
    async def scenario() -> None:
        c = AsyncClient()
        image = Image.base().env({"B": f"async-{RUN}"}).run_commands("echo $B > /b")
        sb = await AsyncSandbox.create(image=image, tags=TAG, client=c)
        BUILT.add(sb._data["image"])
        try:
            p = await sb.exec("cat", "/b")
            assert await p.stdout.read() == f"async-{RUN}\n"
            assert await image.build_async(c) == sb._data["image"]
            with pytest.raises(ImageBuildError) as e:
                await Image.base().run_commands(f"exit 4 # {RUN}").build_async(c)
            assert e.value.code == "build_failed" and "exit code 4" in e.value.message
        finally:
            await sb.delete()
            await c.aclose()

    asyncio.run(scenario())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory):
    """A registry on loopback holding a busybox image made by buildah (as
    tests/tests/e2e_oci.rs makes its own); its reference."""
    tools = {t: shutil.which(t) for t in ("docker-registry", "buildah", "busybox")}
    if not all(tools.values()):
        # CI has them: there a missing tool is a failure, not a skip.
        if os.environ.get("CI") == "true":
            pytest.fail(f"not installed (scripts/setup.sh installs them): {tools}")
        pytest.skip(f"not installed (scripts/setup.sh installs them): {tools}")
    work = tmp_path_factory.mktemp("registry")
    port = _free_port()
    (work / "registry.yml").write_text(
        f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {work}/data\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    server = subprocess.Popen(
        [str(tools["docker-registry"]), "serve", str(work / "registry.yml")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        ref = f"127.0.0.1:{port}/sdk/busy:1"
        script = f"""set -euo pipefail
B="buildah --root {work}/storage --runroot {work}/run --storage-driver vfs"
c=$($B from scratch)
m=$($B mount "$c")
mkdir -p "$m/bin" "$m/etc"
cp {tools["busybox"]} "$m/bin/busybox"
for a in sh cat echo env; do ln -s busybox "$m/bin/$a"; done
echo 'root:x:0:0:root:/root:/bin/sh' > "$m/etc/passwd"
$B unmount "$c"
$B config --env PATH=/bin "$c"
$B commit -q "$c" sdk-busy >/dev/null
$B push -q --tls-verify=false sdk-busy docker://{ref}
"""
        done = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        yield ref
    finally:
        server.terminate()
        server.wait()


def test_an_image_of_a_registry_is_pulled_once_and_built_on(client: Recording, registry: str) -> None:
    PULL = ("POST", "/v1/images/pull")
    image = Image.from_registry(registry).env({"X": RUN}).run_commands("echo pulled > /p")
    client.calls.clear()
    sb = Sandbox.create(image=image, tags=TAG, client=client)
    BUILT.add(registry)
    assert PULL in client.calls and BUILD in client.calls
    assert out(sb, "cat /p; echo $X") == f"pulled\n{RUN}\n"
    client.calls.clear()
    Sandbox.create(image=image, tags=TAG, client=client)
    assert PULL not in client.calls and BUILD not in client.calls
