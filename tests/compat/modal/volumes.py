"""Volumes: `Volume.from_name(name, create_if_missing=True)` is the daemon's named volume of
that name, mounted by `Sandbox.create(volumes=)`; what one sandbox writes another sees, read-only
mounts refuse writes, `reload_volumes()` succeeds while the sandbox runs, and an unknown name
without `create_if_missing` is the client's `NotFoundError`."""

import uuid

import modal
from modal.exception import NotFoundError


def raises(kind, fn):
    try:
        fn()
    except kind as e:
        return e
    raise AssertionError(f"expected {kind.__name__}")


app = modal.App.lookup("belljar-modal-volumes", create_if_missing=True)
name = f"belljar-{uuid.uuid4().hex[:12]}"
raises(NotFoundError, lambda: modal.Volume.from_name(name).hydrate())
vol = modal.Volume.from_name(name, create_if_missing=True)

writer = modal.Sandbox.create(app=app, volumes={"/mnt/data": vol})
try:
    p = writer.exec("sh", "-c", "echo kept > /mnt/data/note && cat /mnt/data/note")
    assert p.stdout.read() == "kept\n"
    assert p.wait() == 0
    writer.reload_volumes()
finally:
    writer.terminate()

reader = modal.Sandbox.create(
    app=app, volumes={"/mnt/ro": modal.Volume.from_name(name).read_only()}
)
try:
    assert reader.exec("cat", "/mnt/ro/note").stdout.read() == "kept\n"
    p = reader.exec("sh", "-c", "echo no > /mnt/ro/other")
    assert p.wait() != 0
finally:
    reader.terminate()
print("volumes.py: ok")
