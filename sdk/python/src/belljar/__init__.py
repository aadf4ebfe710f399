"""Belljar's Python SDK: local, disposable Linux sandboxes through the daemon's API, with
Modal-like ergonomics. ``belljar.Sandbox`` is synchronous; ``belljar.aio.AsyncSandbox`` is the
same for asyncio. ``belljar.Image`` is Modal's image builder: a recipe that a sandbox's
create builds once. Errors are ``BelljarError`` with the API's stable ``code``; options the daemon
does not support yet (``encrypted_ports``) raise ``NotSupportedError``."""

from ._common import BelljarError, Endpoint, FileEntry, NotSupportedError, SnapshotImage, find_daemon
from .image import Image, ImageBuildError
from .sandbox import Client, ContainerProcess, Sandbox, SandboxFilesystem, Volume

__all__ = [
    "BelljarError",
    "Client",
    "ContainerProcess",
    "Endpoint",
    "FileEntry",
    "Image",
    "ImageBuildError",
    "NotSupportedError",
    "Sandbox",
    "SandboxFilesystem",
    "SnapshotImage",
    "Volume",
    "find_daemon",
]
