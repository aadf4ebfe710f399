"""``belljar.Image`` without a daemon: the Dockerfile text each method writes, the build
context it packs (deterministic: sorted, mtime 0, owner 0), the names the built images get,
the refusals of bad arguments before any request, and the build operation (``_ops``) against
scripted answers. The builds themselves run against a real daemon in test_image_build.py.

``apt_install`` and ``pip_install`` are tested here for their text only: this machine has no
network, so no test builds them."""

import io
import json
import os
import tarfile
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Dict, List, Tuple

import pytest

from belljar import BelljarError, Image, ImageBuildError
from belljar import _ops
from belljar.image import CONTEXT_DIR, DOCKERFILE


def lines(image: Image) -> List[str]:
    return image.dockerfile().splitlines()


def members(image: Image) -> Dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(image.build_context().tar)) as tar:
        return {m.name: m for m in tar.getmembers()}


def read(image: Image, name: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(image.build_context().tar)) as tar:
        f = tar.extractfile(name)
        assert f is not None
        return f.read()


def test_constructors_write_from() -> None:
    assert lines(Image.base()) == ["FROM base"]
    assert lines(Image.from_image("python3.13")) == ["FROM python3.13"]
    assert lines(Image.debian_slim(python_version="3.13")) == ["FROM python3.13"]
    assert lines(Image.from_registry("127.0.0.1:5000/tools/cli:1.2")) == ["FROM 127.0.0.1:5000/tools/cli:1.2"]
    ctx = Image.from_registry("127.0.0.1:5000/tools/cli:1.2").build_context()
    assert (ctx.base, ctx.pull) == ("127.0.0.1:5000/tools/cli:1.2", True)
    assert (Image.base().build_context().base, Image.base().build_context().pull) == ("base", False)


def test_each_step_and_its_quoting() -> None:
    img = (
        Image.base()
        .env({"A": "1", "B": 'two words $HOME "q" \\', "E": ""})
        .workdir("/w d")
        .run_commands("echo hi > /w/f", ["printf", "%s", "it's"])
        .user("app")
        .entrypoint(["/bin/sh", "-c"])
        .cmd(["echo $A"])
    )
    assert lines(img) == [
        "FROM base",
        'ENV A=1 B="two words \\$HOME \\"q\\" \\\\" E=""',
        'WORKDIR "/w d"',
        "RUN echo hi > /w/f",
        "RUN printf %s 'it'\"'\"'s'",
        "USER app",
        'ENTRYPOINT ["/bin/sh", "-c"]',
        'CMD ["echo $A"]',
    ]


def test_a_command_the_shell_form_would_change_is_written_in_the_exec_form() -> None:
    img = Image.base().run_commands("echo a\necho b", "echo tail \\", "[ -f /x ] || true", "--weird")
    assert lines(img)[1:] == [
        'RUN ["/bin/sh", "-c", "echo a\\necho b"]',
        'RUN ["/bin/sh", "-c", "echo tail \\\\"]',
        'RUN ["/bin/sh", "-c", "[ -f /x ] || true"]',
        'RUN ["/bin/sh", "-c", "--weird"]',
    ]
    # A list is one command of those words, each quoted for the shell.
    assert lines(Image.base().run_commands(["echo", "a b", "$HOME", "it's"]))[1] == (
        "RUN echo 'a b' '$HOME' 'it'\"'\"'s'"
    )


def test_apt_and_pip_text() -> None:
    # Text only: building these needs a network this machine does not have.
    assert lines(Image.base().apt_install("git", "curl"))[1] == (
        "RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y"
        " --no-install-recommends git curl && rm -rf /var/lib/apt/lists/*"
    )
    assert lines(Image.from_image("python3.13").pip_install("httpx==0.28.1", "pkg[x]>=1"))[1] == (
        "RUN python3 -m pip install --no-cache-dir httpx==0.28.1 'pkg[x]>=1'"
    )
    assert lines(
        Image.base().pip_install(
            "a", index_url="https://pypi.example/simple", extra_index_url="https://x/s p", pre=True
        )
    )[1] == (
        "RUN python3 -m pip install --no-cache-dir --index-url https://pypi.example/simple"
        " --extra-index-url 'https://x/s p' --pre a"
    )


def test_each_method_returns_a_new_image() -> None:
    base = Image.base()
    a = base.env({"A": "1"})
    b = base.run_commands("true")
    assert lines(base) == ["FROM base"]
    assert lines(a) == ["FROM base", "ENV A=1"]
    assert lines(b) == ["FROM base", "RUN true"]


@pytest.mark.parametrize(
    "make",
    [
        lambda t: Image.base().add_local_file(t / "f", "w/g"),
        lambda t: Image.base().add_local_file(t / "f", ""),
        lambda t: Image.base().add_local_file(t / "nosuch", "/w/g"),
        lambda t: Image.base().add_local_file(t, "/w/g"),
        lambda t: Image.base().add_local_dir(t, "relative"),
        lambda t: Image.base().add_local_dir(t / "f", "/d"),
        lambda t: Image.base().add_local_dir(t, "/d", ignore="*.pyc"),
        lambda t: Image.base().add_local_file(t / "f", "/w/a\nb"),
        lambda t: Image.base().apt_install(),
        lambda t: Image.base().apt_install("git", ""),
        lambda t: Image.base().apt_install("-y"),
        lambda t: Image.base().apt_install("a\nb"),
        lambda t: Image.base().pip_install(" "),
        lambda t: Image.base().pip_install("a", index_url="http://x\n"),
        lambda t: Image.base().run_commands(),
        lambda t: Image.base().run_commands(""),
        lambda t: Image.base().run_commands([]),
        lambda t: Image.base().env({}),
        lambda t: Image.base().env({"1A": "x"}),
        lambda t: Image.base().env({"A-B": "x"}),
        lambda t: Image.base().env({"A": 1}),
        lambda t: Image.base().env({"A": "two\nlines"}),
        lambda t: Image.base().workdir(""),
        lambda t: Image.base().user("a b"),
        lambda t: Image.base().entrypoint("/bin/sh -c"),
        lambda t: Image.base().entrypoint([]),
        lambda t: Image.base().cmd(["a", 1]),
        lambda t: Image.from_image(""),
        lambda t: Image.from_image("a b"),
        lambda t: Image.from_registry("alpine\nFROM x"),
        lambda t: Image.from_dockerfile(t / "nosuch"),
        lambda t: Image.from_dockerfile(t / "f", context_dir=t / "nosuch"),
        lambda t: Image.debian_slim(python_version="3.8"),
    ],
)
def test_bad_arguments_are_refused_when_given(tmp_path: Path, make: Callable[[Path], Image]) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(BelljarError) as e:
        make(tmp_path)
    assert e.value.code == "bad_request"
    assert e.value.message


def test_a_local_file_goes_into_the_context_under_its_content_digest(tmp_path: Path) -> None:
    f = tmp_path / "g.txt"
    f.write_text("from host\n")
    f.chmod(0o640)
    img = Image.base().add_local_file(f, "/w/g").add_local_file(f, "/etc/")
    copy1, copy2 = lines(img)[1:]
    name = copy1.split()[1]
    assert copy1 == f"COPY {name} /w/g" and copy2 == f"COPY {name} /etc/g.txt"
    assert name.startswith(CONTEXT_DIR + "/") and len(name.split("/")[1]) == 64
    got = members(img)
    assert sorted(got) == sorted([CONTEXT_DIR, DOCKERFILE, name])
    assert read(img, name) == b"from host\n"
    assert read(img, DOCKERFILE).decode() == img.dockerfile()
    for m in got.values():
        assert (m.mtime, m.uid, m.gid, m.uname, m.gname) == (0, 0, 0, "", "")
    assert got[name].mode == 0o640
    # Another content, another name; the same content, the same bytes of context.
    same = Image.base().add_local_file(f, "/w/g").add_local_file(f, "/etc/")
    assert same.build_context().tar == img.build_context().tar
    f.write_text("changed\n")
    assert lines(img)[1].split()[1] != name


def test_a_local_dir_keeps_links_and_leaves_out_what_ignore_matches(tmp_path: Path) -> None:
    d = tmp_path / "proj"
    (d / "src" / "__pycache__").mkdir(parents=True)
    (d / "src" / "a.py").write_text("print(1)\n")
    (d / "src" / "__pycache__" / "a.pyc").write_bytes(b"\0")
    (d / "src" / "b.pyc").write_bytes(b"\0")
    (d / "run.sh").write_text("#!/bin/sh\n")
    (d / "run.sh").chmod(0o755)
    os.symlink("src/a.py", d / "main.py")
    os.mkfifo(d / "pipe")
    img = Image.base().add_local_dir(d, "/app", ignore=["*.pyc", "__pycache__"])
    copy = lines(img)[1]
    name = copy.split()[1]
    assert copy == f"COPY {name} /app"
    got = members(img)
    inside = sorted(k[len(name) + 1 :] for k in got if k.startswith(name + "/"))
    assert inside == ["main.py", "run.sh", "src", "src/a.py"]
    assert got[f"{name}/main.py"].issym() and got[f"{name}/main.py"].linkname == "src/a.py"
    assert got[f"{name}/run.sh"].mode == 0o755
    # The entries are sorted, every parent before what it holds.
    names = list(got)
    assert names == sorted(names, key=lambda n: PurePosixPath(n).parts)
    # A function of the relative path works as well.
    only_py = Image.base().add_local_dir(d, "/app", ignore=lambda p: p.suffix not in (".py", ""))
    got2 = members(only_py)
    name2 = lines(only_py)[1].split()[1]
    assert sorted(k[len(name2) + 1 :] for k in got2 if k.startswith(name2 + "/")) == [
        "main.py", "src", "src/__pycache__", "src/a.py",
    ]
    # What ignore leaves out does not change the name; what it keeps does.
    (d / "src" / "c.pyc").write_bytes(b"\1")
    assert lines(Image.base().add_local_dir(d, "/app", ignore=["*.pyc", "__pycache__"]))[1] == copy
    (d / "src" / "a.py").write_text("print(2)\n")
    assert lines(Image.base().add_local_dir(d, "/app", ignore=["*.pyc", "__pycache__"]))[1] != copy


def test_from_dockerfile_sends_its_context_and_builds_the_steps_on_its_image(tmp_path: Path) -> None:
    ctx = tmp_path / "ctx"
    (ctx / "docker").mkdir(parents=True)
    (ctx / "docker" / "Dockerfile").write_text("FROM base\nCOPY . /app/\n")
    (ctx / "app.txt").write_text("app")
    (ctx / ".dockerignore").write_text("*.log\n")
    (ctx / "x.log").write_text("log")
    (ctx / CONTEXT_DIR).mkdir()
    (ctx / CONTEXT_DIR / "stale").write_text("not sent")
    extra = tmp_path / "extra"
    extra.write_text("extra")
    plain = Image.from_dockerfile(ctx / "docker" / "Dockerfile", context_dir=ctx, build_args={"V": "1"})
    alone = plain.build_context()
    assert alone.dockerfile == "FROM base\nCOPY . /app/\n"
    assert alone.parent is None and alone.base is None and dict(alone.build_args) == {"V": "1"}
    got = members(plain)
    assert {".dockerignore", "app.txt", "x.log", "docker/Dockerfile", DOCKERFILE} <= set(got)
    assert f"{CONTEXT_DIR}/stale" not in got
    # The daemon applies the user's ignore rules, and leaves the SDK's Dockerfile out of a
    # `COPY .` (it still reads it).
    assert read(plain, DOCKERFILE + ".dockerignore").decode() == f"*.log\n{CONTEXT_DIR}\n"

    # Steps added are a second build on the Dockerfile's image, with a context of their own.
    img = plain.env({"A": "1"}).add_local_file(extra, "/extra")
    built = img.build_context()
    assert built.parent is not None and built.parent.tar == alone.tar
    assert built.base == alone.tag() and not built.pull and dict(built.build_args) == {}
    assert built.dockerfile.splitlines()[:2] == [f"FROM {alone.tag()}", "ENV A=1"]
    assert not {"app.txt", "docker/Dockerfile"} & set(members(img))
    # The context defaults to the Dockerfile's directory.
    (tmp_path / "Dockerfile").write_text("FROM base\n")
    assert "extra" in members(Image.from_dockerfile(tmp_path / "Dockerfile"))


def test_the_dockerfile_is_built_before_the_steps_on_it(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM base\n")
    ctx = Image.from_dockerfile(tmp_path / "Dockerfile").run_commands("true").build_context()
    assert ctx.parent is not None
    inner = ctx.parent.tag("")
    done = [{"type": "done", "image": {"name": inner, "status": "ready"}}]
    calls, perform = script([BASE], done, [BASE, {"name": inner, "status": "ready", "digest": "sha256:i"}], done)
    assert _ops.drive(_ops.build_image(ctx, None, False), perform) == ctx.tag("sha256:i")
    assert [(c.method, c.url, (c.params or {}).get("tag")) for c in calls] == [
        ("GET", "/v1/images", None),
        ("POST", "/v1/images/build", inner),
        ("GET", "/v1/images", None),
        ("POST", "/v1/images/build", ctx.tag("sha256:i")),
    ]


def test_the_name_follows_the_recipe_and_the_base(tmp_path: Path) -> None:
    a = Image.base().env({"A": "1"}).build_context()
    assert a.tag() == Image.base().env({"A": "1"}).build_context().tag()
    assert a.tag().startswith("belljar-sdk/image:") and len(a.tag().split(":")[1]) == 16
    assert a.tag() != Image.base().env({"A": "2"}).build_context().tag()
    assert a.tag("sha256:1") != a.tag("sha256:2")


# The build operation against scripted answers (as test_ops.py does).


def script(*answers: Any) -> Tuple[List[_ops.Call], Callable[[_ops.Call], Any]]:
    calls: List[_ops.Call] = []
    pending = list(answers)

    def perform(call: _ops.Call) -> Any:
        calls.append(call)
        answer = pending.pop(0)
        if isinstance(answer, Exception):
            raise answer
        if call.lines is not None:
            for line in answer:
                call.lines(line)
            return None
        return answer

    return calls, perform


BASE = {"name": "base", "status": "ready", "digest": "sha256:b"}


def test_an_image_the_daemon_has_is_not_built_again() -> None:
    ctx = Image.base().run_commands("true").build_context()
    tag = ctx.tag("sha256:b")
    calls, perform = script([BASE, {"name": tag, "status": "ready"}])
    assert _ops.drive(_ops.build_image(ctx, None, False), perform) == tag
    assert [(c.method, c.url) for c in calls] == [("GET", "/v1/images")]


def test_a_missing_image_is_built_with_progress() -> None:
    ctx = Image.base().run_commands("true").build_context()
    tag = ctx.tag("sha256:b")
    events = [
        {"type": "step", "step": 1, "steps": 2, "instruction": "FROM base", "cached": False},
        {"type": "step", "step": 2, "steps": 2, "instruction": "RUN true", "cached": True},
        {"type": "done", "image": {"name": tag, "status": "ready"}},
    ]
    seen: List[Any] = []
    calls, perform = script([BASE], events)
    assert _ops.drive(_ops.build_image(ctx, seen.append, False), perform) == tag
    build = calls[1]
    assert (build.method, build.url) == ("POST", "/v1/images/build")
    assert build.params == {"tag": tag, "dockerfile": DOCKERFILE}
    assert build.content == ctx.tar and build.headers == {"content-type": "application/x-tar"}
    assert seen == events
    # force_build rebuilds what is there, every step run.
    calls, perform = script([BASE, {"name": tag, "status": "ready"}], events)
    _ops.drive(_ops.build_image(ctx, None, True), perform)
    assert calls[1].params == {"tag": tag, "dockerfile": DOCKERFILE, "no_cache": "true"}


def test_a_registry_base_is_pulled_when_missing() -> None:
    ref = "127.0.0.1:5000/tools/cli"
    ctx = Image.from_registry(ref).build_context()
    pulled = {"name": ref + ":latest", "status": "ready", "digest": "sha256:p"}
    calls, perform = script([BASE], [{"type": "progress", "message": "layer"}, {"type": "done", "image": pulled}], [
        {"type": "done", "image": {}}
    ])
    tag = _ops.drive(_ops.build_image(ctx, None, False), perform)
    assert tag == ctx.tag("sha256:p")
    assert [(c.method, c.url, c.body) for c in calls[:2]] == [
        ("GET", "/v1/images", None),
        ("POST", "/v1/images/pull", {"reference": ref}),
    ]
    # Found by its `:latest` name, it is not pulled again.
    calls, perform = script([BASE, pulled, {"name": tag, "status": "ready"}])
    assert _ops.drive(_ops.build_image(ctx, None, False), perform) == tag
    assert len(calls) == 1


def test_a_failed_step_raises_with_its_code_and_output() -> None:
    ctx = Image.base().run_commands("echo oops; exit 3").build_context()
    events = [
        {"type": "step", "step": 1, "steps": 2, "instruction": "FROM base", "cached": True},
        {"type": "step", "step": 2, "steps": 2, "instruction": "RUN echo oops; exit 3", "cached": False},
        {"type": "progress", "message": "oops"},
        {"type": "error", "code": "build_failed", "message": "The command failed with exit code 3"},
    ]
    _, perform = script([BASE], events)
    with pytest.raises(ImageBuildError) as e:
        _ops.drive(_ops.build_image(ctx, None, False), perform)
    assert (e.value.code, e.value.step, e.value.output) == ("build_failed", "RUN echo oops; exit 3", ["oops"])
    assert isinstance(e.value, BelljarError) and "exit code 3" in str(e.value)
    # A stream that ends with neither done nor error is an error too.
    _, perform = script([BASE], events[:2])
    with pytest.raises(BelljarError) as e2:
        _ops.drive(_ops.build_image(ctx, None, False), perform)
    assert e2.value.code == "connection_lost"
