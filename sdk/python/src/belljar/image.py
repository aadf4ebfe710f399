"""Modal's image builder: an ``Image`` is an immutable recipe (a base and the steps on it),
each method returning a new one. Only when a sandbox needs it is it rendered to a Dockerfile
and a build context, a tar made in memory with sorted entries, mtime 0 and owner 0, so the
same recipe always gives the same bytes. The built image is named after their digest
(``belljar-sdk/image:<16 hex>``): a recipe is built once and found again by its name, and
the daemon's step cache makes a recipe that changed only its last step cheap to build.

Nothing here talks to the daemon: ``_ops.build_image`` does, driven by the sync and the
asyncio client alike. Bad arguments are refused here, when the method is called, before any
request is made."""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import os
import re
import shlex
import stat as st
import tarfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ._common import BelljarError

if TYPE_CHECKING:
    from .aio import AsyncClient
    from .sandbox import Client

#: The SDK's part of a build context: its Dockerfile and the local files it adds.
CONTEXT_DIR = ".belljar-sdk"
DOCKERFILE = CONTEXT_DIR + "/Dockerfile"
#: The repository the built images are named in.
TAG_REPOSITORY = "belljar-sdk/image"

#: What ``add_local_dir`` leaves out: patterns (``fnmatch``, on the path relative to the
#: directory; one without ``/`` also matches a name at any depth), or a function of that
#: relative path that answers True for what to leave out.
Ignore = Union[Sequence[str], Callable[[PurePosixPath], bool]]
#: Called with each NDJSON event of a pull or build (``{"type": "step", ...}``, ...).
Progress = Callable[[Mapping[str, Any]], None]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_PLAIN_WORD = re.compile(r"[A-Za-z0-9_./:@%+,=-]+\Z")


def _refuse(message: str) -> BelljarError:
    return BelljarError("bad_request", message)


def _one_line(what: str, text: str) -> str:
    if not isinstance(text, str):
        raise _refuse(f"{what} must be a string, not {type(text).__name__}")
    if not text.strip():
        raise _refuse(f"{what} must not be empty")
    if any(c in text for c in "\n\r\0"):
        raise _refuse(f"{what} must be one line: {text!r}")
    return text


def _word(text: str) -> str:
    """One Dockerfile word (ENV, WORKDIR, USER, COPY): as it is when that is unambiguous,
    else double-quoted, with the three characters the builder reads there escaped."""
    if _PLAIN_WORD.match(text):
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    return f'"{escaped}"'


def _argv(what: str, argv: Sequence[str]) -> str:
    """The exec form (a JSON array) of ENTRYPOINT and CMD."""
    if isinstance(argv, str):
        raise _refuse(f"{what} takes a list of arguments, not a string: [{argv!r}]")
    args = list(argv)
    if not all(isinstance(a, str) for a in args):
        raise _refuse(f"{what}: every argument must be a string")
    if what == "entrypoint" and not args:
        raise _refuse("entrypoint needs a program")
    return json.dumps(args)


def _run(cmd: str) -> str:
    """A ``RUN`` of ``cmd`` by ``/bin/sh -c``: the shell form when the text reads back as
    written, else the exec form, which keeps a newline, a trailing backslash or a leading
    ``[`` or ``--`` that the shell form would turn into something else."""
    if not isinstance(cmd, str):
        raise _refuse(f"run_commands takes strings, not {type(cmd).__name__}")
    if not cmd.strip():
        raise _refuse("run_commands: a command must not be empty")
    if "\0" in cmd:
        raise _refuse(f"run_commands: a command must not hold NUL: {cmd!r}")
    text = cmd.strip()
    if "\n" in text or "\r" in text or text.endswith("\\") or text.startswith(("[", "--")):
        return "RUN " + json.dumps(["/bin/sh", "-c", cmd])
    return "RUN " + text


def _packages(what: str, pkgs: Sequence[str]) -> List[str]:
    names: List[str] = []
    for p in pkgs:
        if not isinstance(p, str) or not p.strip():
            raise _refuse(f"{what}: a package name must be a non-empty string, not {p!r}")
        p = _one_line(what, p).strip()
        if p.startswith("-"):
            raise _refuse(f"{what}: {p!r} is an option, not a package name")
        names.append(p)
    if not names:
        raise _refuse(f"{what} needs at least one package")
    return names


def _remote(what: str, path: str) -> str:
    _one_line(what, path)
    if not path.startswith("/"):
        raise _refuse(f"{what}: the path in the image must be absolute, not {path!r}")
    return path


@dataclass(frozen=True)
class _AddLocal:
    """A local file or directory, copied into the context under a name made from its
    content, then ``COPY``'d to ``remote``."""

    local: str
    remote: str
    is_dir: bool
    ignore: Any = ()


_Step = Union[str, _AddLocal]


@dataclass(frozen=True)
class _Entry:
    kind: str  # "dir", "file" or "link"
    mode: int
    data: bytes = b""
    target: str = ""


@dataclass(frozen=True)
class BuildContext:
    """A recipe rendered: the Dockerfile's text and the context's tar (which holds it at
    ``dockerfile_path``), and the base image when the recipe names one (``pull``: from a
    registry, pulled when this daemon does not have it)."""

    dockerfile: str
    tar: bytes
    dockerfile_path: str = DOCKERFILE
    base: Optional[str] = None
    pull: bool = False
    build_args: Mapping[str, str] = field(default_factory=dict)
    #: What must be built first: the Dockerfile these steps are added to (``base`` is its name).
    parent: Optional["BuildContext"] = None

    def tag(self, base_id: str = "") -> str:
        """The built image's name: from the Dockerfile, the context, the build arguments and
        the base image's identity (its digest, so a base built again makes a new name)."""
        h = hashlib.sha256()
        for part in (
            "belljar-sdk image 1",
            self.dockerfile,
            hashlib.sha256(self.tar).hexdigest(),
            json.dumps(dict(self.build_args), sort_keys=True),
            base_id,
        ):
            h.update(part.encode())
            h.update(b"\0")
        return f"{TAG_REPOSITORY}:{h.hexdigest()[:16]}"


class Image:
    """An image recipe, in Modal's shape: ``Image.base().apt_install("git").env({"A": "1"})``.
    Every method returns a new ``Image``; pass one as ``Sandbox.create(image=...)``, which
    builds it when this daemon has not yet, or build it with ``build()``."""

    def __init__(
        self,
        *,
        base: Optional[str] = None,
        pull: bool = False,
        dockerfile: Optional[str] = None,
        context_dir: Optional[str] = None,
        build_args: Optional[Mapping[str, str]] = None,
        steps: Tuple[_Step, ...] = (),
    ) -> None:
        self._base = base
        self._pull = pull
        self._dockerfile = dockerfile
        self._context_dir = context_dir
        self._build_args: Dict[str, str] = dict(build_args or {})
        self._steps = steps

    def __repr__(self) -> str:
        start = f"from_dockerfile({self._dockerfile!r})" if self._dockerfile else f"FROM {self._base}"
        return f"Image({start}, {len(self._steps)} steps)"

    def _with(self, *steps: _Step) -> "Image":
        new = Image.__new__(Image)
        new.__dict__.update(self.__dict__)
        new._steps = self._steps + steps
        return new

    # Constructors.

    @staticmethod
    def from_registry(ref: str) -> "Image":
        """An image of a registry (``[host[:port]/]repository[:tag][@sha256:…]``), pulled by
        the daemon when it does not have it yet."""
        _one_line("from_registry", ref)
        if any(c.isspace() for c in ref):
            raise _refuse(f"from_registry: {ref!r} is not an image reference")
        return Image(base=ref, pull=True)

    @staticmethod
    def from_image(name: str) -> "Image":
        """An image this daemon has: one of Belljar's own (``base``, ``python3.13``,
        ``node24``, ``node22``) or one pulled, imported or built."""
        _one_line("from_image", name)
        if any(c.isspace() for c in name):
            raise _refuse(f"from_image: {name!r} is not an image name")
        return Image(base=name)

    @staticmethod
    def base() -> "Image":
        """Belljar's ``base`` image (Debian)."""
        return Image.from_image("base")

    @staticmethod
    def debian_slim(python_version: Optional[str] = None) -> "Image":
        """Modal's name for a Debian image: ``base``, or ``python3.13`` with that Python."""
        if python_version is None:
            return Image.base()
        if python_version != "3.13":
            raise _refuse(f"debian_slim: Belljar's Python image is 3.13, not {python_version!r}")
        return Image.from_image("python3.13")

    @staticmethod
    def from_dockerfile(
        path: Union[str, "os.PathLike[str]"],
        context_dir: Union[str, "os.PathLike[str]", None] = None,
        *,
        build_args: Optional[Mapping[str, str]] = None,
    ) -> "Image":
        """The image a Dockerfile builds, from ``context_dir`` (default: the Dockerfile's
        directory), which is sent whole (its ``.dockerignore`` applies, in the daemon); the
        methods add steps on the image it makes."""
        file = Path(path).expanduser().resolve()
        if not file.is_file():
            raise _refuse(f"from_dockerfile: {str(path)!r} is not a file")
        ctx = Path(context_dir).expanduser().resolve() if context_dir is not None else file.parent
        if not ctx.is_dir():
            raise _refuse(f"from_dockerfile: the context {str(context_dir)!r} is not a directory")
        for k, v in (build_args or {}).items():
            if not isinstance(k, str) or not _ENV_NAME.match(k) or not isinstance(v, str):
                raise _refuse(f"from_dockerfile: build_args must map names to strings: {k!r}")
        return Image(dockerfile=str(file), context_dir=str(ctx), build_args=build_args)

    # Steps.

    def run_commands(self, *commands: Union[str, Sequence[str]]) -> "Image":
        """One ``RUN`` per command, by ``/bin/sh -c``; a list is one command of those words,
        each quoted for the shell."""
        cmds: List[str] = []
        for c in commands:
            if isinstance(c, str):
                cmds.append(c)
            else:
                words = list(c)
                if not words or not all(isinstance(w, str) for w in words):
                    raise _refuse("run_commands: a list command must be a non-empty list of strings")
                cmds.append(shlex.join(words))
        if not cmds:
            raise _refuse("run_commands needs at least one command")
        return self._with(*[_run(c) for c in cmds])

    def env(self, vars: Mapping[str, str]) -> "Image":
        """Environment variables of the image (and of the later steps)."""
        if not vars:
            raise _refuse("env needs at least one variable")
        pairs = []
        for k, v in vars.items():
            if not isinstance(k, str) or not _ENV_NAME.match(k):
                raise _refuse(f"env: {k!r} is not a variable name")
            if not isinstance(v, str):
                raise _refuse(f"env: the value of {k} must be a string, not {type(v).__name__}")
            if any(c in v for c in "\n\r\0"):
                raise _refuse(f"env: the value of {k} must be one line")
            pairs.append(f"{k}=" + (_word(v) if v else '""'))
        return self._with("ENV " + " ".join(pairs))

    def workdir(self, path: Union[str, PurePosixPath]) -> "Image":
        """Where the later steps and the sandbox's commands start (made when missing)."""
        return self._with("WORKDIR " + _word(_one_line("workdir", str(path))))

    def user(self, user: Union[str, int]) -> "Image":
        """Who runs the later steps and the sandbox's commands: a name or ``uid[:gid]``."""
        text = _one_line("user", str(user))
        if any(c.isspace() for c in text):
            raise _refuse(f"user: {text!r} is not a user name or id")
        return self._with("USER " + _word(text))

    def entrypoint(self, argv: Sequence[str]) -> "Image":
        """What a sandbox of the image runs when given no command (with ``cmd``)."""
        return self._with("ENTRYPOINT " + _argv("entrypoint", argv))

    def cmd(self, argv: Sequence[str]) -> "Image":
        """The default command (the entrypoint's arguments when there is one)."""
        return self._with("CMD " + _argv("cmd", argv))

    def apt_install(self, *packages: str) -> "Image":
        """Debian packages, with ``apt-get`` (the image's lists are updated first)."""
        names = " ".join(shlex.quote(p) for p in _packages("apt_install", packages))
        return self._with(
            "RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y"
            f" --no-install-recommends {names} && rm -rf /var/lib/apt/lists/*"
        )

    def pip_install(
        self,
        *packages: str,
        index_url: Optional[str] = None,
        extra_index_url: Optional[str] = None,
        pre: bool = False,
    ) -> "Image":
        """Python packages, with the image's ``python3 -m pip``; each a requirement
        (``httpx==0.28.1``, ``pkg[extra]>=1``)."""
        args = ["python3", "-m", "pip", "install", "--no-cache-dir"]
        if index_url is not None:
            args += ["--index-url", _one_line("pip_install index_url", index_url)]
        if extra_index_url is not None:
            args += ["--extra-index-url", _one_line("pip_install extra_index_url", extra_index_url)]
        if pre:
            args.append("--pre")
        args += _packages("pip_install", packages)
        return self._with("RUN " + shlex.join(args))

    def add_local_file(self, local_path: Union[str, "os.PathLike[str]"], remote_path: str) -> "Image":
        """A file of this machine, at ``remote_path`` (absolute; ending in ``/``: in that
        directory, under its own name). Its content is read when the image is built."""
        local = Path(local_path).expanduser().resolve()
        remote = _remote("add_local_file", remote_path)
        if not local.is_file():
            raise _refuse(f"add_local_file: {str(local_path)!r} is not a file")
        if remote.endswith("/"):
            remote += local.name
        return self._with(_AddLocal(str(local), remote, is_dir=False))

    def add_local_dir(
        self,
        local_path: Union[str, "os.PathLike[str]"],
        remote_path: str,
        *,
        ignore: Ignore = (),
    ) -> "Image":
        """A directory of this machine: what it holds, at ``remote_path`` (absolute).
        Symbolic links are copied as links; what ``ignore`` matches is left out."""
        local = Path(local_path).expanduser().resolve()
        remote = _remote("add_local_dir", remote_path)
        if not local.is_dir():
            raise _refuse(f"add_local_dir: {str(local_path)!r} is not a directory")
        if isinstance(ignore, str):
            raise _refuse("add_local_dir: ignore takes a list of patterns, not a string")
        if not callable(ignore):
            ignore = tuple(ignore)
            if not all(isinstance(p, str) and p for p in ignore):
                raise _refuse("add_local_dir: every ignore pattern must be a non-empty string")
        return self._with(_AddLocal(str(local), remote, is_dir=True, ignore=ignore))

    # Rendering.

    def build_context(self) -> BuildContext:
        """The Dockerfile and the context's tar this recipe is built from (it reads the
        local files now). A Dockerfile with steps added is two builds: the Dockerfile with
        its own context (``parent``), then the steps on the image it made, so that nothing
        the SDK adds is in the context a ``COPY .`` of that Dockerfile reads."""
        entries: Dict[str, _Entry] = {}
        lines: List[str] = []
        ignore_text: Optional[str] = None
        parent: Optional[BuildContext] = None
        base, pull, build_args = self._base, self._pull, self._build_args
        if self._dockerfile is not None and self._steps:
            parent = Image(
                dockerfile=self._dockerfile, context_dir=self._context_dir, build_args=self._build_args
            ).build_context()
            base, pull, build_args = parent.tag(), False, {}
        if self._dockerfile is not None and parent is None:
            assert self._context_dir is not None
            lines.append(Path(self._dockerfile).read_text().rstrip())
            for rel, e in _walk(Path(self._context_dir), ()):
                if rel.parts[0] != CONTEXT_DIR:
                    entries[str(rel)] = e
            ignore_text = _ignore_file(Path(self._dockerfile), Path(self._context_dir))
        else:
            lines.append(f"FROM {base}")
        for step in self._steps:
            if isinstance(step, str):
                lines.append(step)
                continue
            name = _add(entries, step)
            lines.append(f"COPY {_word(name)} {_word(step.remote)}")
        text = "\n".join(lines) + "\n"
        entries[DOCKERFILE] = _Entry("file", 0o644, text.encode())
        if ignore_text is not None:
            entries[DOCKERFILE + ".dockerignore"] = _Entry("file", 0o644, ignore_text.encode())
        return BuildContext(
            dockerfile=text,
            tar=_tar(entries),
            base=base,
            pull=pull,
            build_args=dict(build_args),
            parent=parent,
        )

    def dockerfile(self) -> str:
        """The Dockerfile this recipe is built from."""
        return self.build_context().dockerfile

    # Building.

    def build(
        self,
        client: Optional["Client"] = None,
        *,
        progress: Optional[Progress] = None,
        force_build: bool = False,
    ) -> str:
        """Builds the image unless this daemon has it (``force_build``: again, every step
        run); its name, to pass as ``Sandbox.create(image=...)``. A failed step raises
        ``ImageBuildError`` with the daemon's code (``build_failed``, ...) and its output."""
        from . import _ops
        from .sandbox import _client

        return _client(client).run(_ops.build_image(self.build_context(), progress, force_build))

    async def build_async(
        self,
        client: Optional["AsyncClient"] = None,
        *,
        progress: Optional[Progress] = None,
        force_build: bool = False,
    ) -> str:
        """``build`` for asyncio: the local files are read in a thread."""
        import asyncio

        from . import _ops
        from .aio import AsyncClient

        ctx = await asyncio.get_running_loop().run_in_executor(None, self.build_context)
        return await (client or AsyncClient()).run(_ops.build_image(ctx, progress, force_build))


class ImageBuildError(BelljarError):
    """A pull or build that failed: the daemon's ``code`` (``build_failed``,
    ``dockerfile_invalid``, ``image_not_found``, ...) and message (for a failed ``RUN``, its
    exit code and last lines), the ``step`` it failed at and that step's ``output``."""

    def __init__(self, code: str, message: str, step: Optional[str] = None, output: Sequence[str] = ()) -> None:
        super().__init__(code, message)
        self.step = step
        self.output = list(output)

    def __str__(self) -> str:
        at = f" at {self.step}" if self.step else ""
        return f"Image build failed{at}: {self.message} ({self.code})"


def _ignored(ignore: Any, rel: PurePosixPath) -> bool:
    if callable(ignore):
        return bool(ignore(rel))
    text = str(rel)
    return any(fnmatch.fnmatchcase(text, p) or ("/" not in p and fnmatch.fnmatchcase(rel.name, p)) for p in ignore)


def _raise(e: OSError) -> None:
    # A directory that cannot be read is an error, not a directory left out.
    raise e


def _walk(root: Path, ignore: Any) -> List[Tuple[PurePosixPath, _Entry]]:
    """What the directory ``root`` holds, sorted, without following links: directories,
    regular files and links (sockets, pipes and devices are left out)."""
    out: List[Tuple[PurePosixPath, _Entry]] = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=_raise, followlinks=False):
        here = Path(dirpath)
        base = PurePosixPath(here.relative_to(root).as_posix())
        kept = []
        for d in sorted(dirnames):
            rel = base / d
            if _ignored(ignore, rel):
                continue
            full = here / d
            if full.is_symlink():
                out.append((rel, _Entry("link", 0o777, target=os.readlink(full))))
                continue
            kept.append(d)
            out.append((rel, _Entry("dir", st.S_IMODE(full.lstat().st_mode))))
        dirnames[:] = kept
        for f in sorted(filenames):
            rel = base / f
            if _ignored(ignore, rel):
                continue
            full = here / f
            mode = full.lstat().st_mode
            if st.S_ISLNK(mode):
                out.append((rel, _Entry("link", 0o777, target=os.readlink(full))))
            elif st.S_ISREG(mode):
                out.append((rel, _Entry("file", st.S_IMODE(mode), full.read_bytes())))
    out.sort(key=lambda e: e[0].parts)
    return out


def _add(entries: Dict[str, _Entry], step: _AddLocal) -> str:
    """Puts a local file or directory into the context under a name made from its content,
    modes and (for a directory) names; that name in the context."""
    local = Path(step.local)
    h = hashlib.sha256()
    if not step.is_dir:
        if not local.is_file():
            raise _refuse(f"add_local_file: {step.local!r} is not a file any more")
        data = local.read_bytes()
        mode = st.S_IMODE(local.stat().st_mode)
        h.update(f"file {mode:o}\0".encode())
        h.update(data)
        name = f"{CONTEXT_DIR}/{h.hexdigest()}"
        entries[name] = _Entry("file", mode, data)
        return name
    if not local.is_dir():
        raise _refuse(f"add_local_dir: {step.local!r} is not a directory any more")
    tree = _walk(local, step.ignore)
    for rel, e in tree:
        digest = hashlib.sha256(e.data).hexdigest() if e.kind == "file" else e.target
        h.update(f"{e.kind} {e.mode:o} {json.dumps(str(rel))} {digest}\n".encode())
    name = f"{CONTEXT_DIR}/{h.hexdigest()}"
    entries[name] = _Entry("dir", 0o755)
    for rel, e in tree:
        entries[f"{name}/{rel}"] = e
    return name


def _ignore_file(dockerfile: Path, context: Path) -> str:
    """The ignore file of a ``from_dockerfile`` build: the user's (beside their Dockerfile,
    else the context's), then the SDK's own files, which the daemon reads but no ``COPY``
    takes."""
    theirs = ""
    for candidate in (dockerfile.with_name(dockerfile.name + ".dockerignore"), context / ".dockerignore"):
        if candidate.is_file():
            theirs = candidate.read_text()
            break
    return theirs.rstrip("\n") + ("\n" if theirs.strip() else "") + CONTEXT_DIR + "\n"


def _tar(entries: Mapping[str, _Entry]) -> bytes:
    """The context as a tar: sorted, every parent directory present, mtime 0, owner 0."""
    full: Dict[str, _Entry] = dict(entries)
    for path in entries:
        parent = PurePosixPath(path).parent
        while str(parent) != ".":
            full.setdefault(str(parent), _Entry("dir", 0o755))
            parent = parent.parent
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(full, key=lambda p: PurePosixPath(p).parts):
            e = full[path]
            info = tarfile.TarInfo(path)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            info.mode = e.mode
            if e.kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif e.kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, e.target
                tar.addfile(info)
            else:
                info.size = len(e.data)
                tar.addfile(info, io.BytesIO(e.data))
    return buf.getvalue()
