"""Named sandboxes: `Sandbox.create(name=)` and `Sandbox.from_name(app_name, name)`; a name is
one running sandbox's in its app (a second is the client's `AlreadyExistsError`), free again
once that sandbox has ended, and an unknown name is `NotFoundError`."""

import uuid

import modal
from modal.exception import AlreadyExistsError, NotFoundError


def raises(kind, fn):
    try:
        fn()
    except kind as e:
        return e
    raise AssertionError(f"expected {kind.__name__}")


app_name = f"belljar-modal-names-{uuid.uuid4().hex[:8]}"
app = modal.App.lookup(app_name, create_if_missing=True)
sb = modal.Sandbox.create(app=app, name="worker-1")
try:
    found = modal.Sandbox.from_name(app_name, "worker-1")
    assert found.object_id == sb.object_id, (found.object_id, sb.object_id)
    assert found.exec("echo", "found").stdout.read() == "found\n"
    raises(AlreadyExistsError, lambda: modal.Sandbox.create(app=app, name="worker-1"))
    raises(NotFoundError, lambda: modal.Sandbox.from_name(app_name, "worker-2"))
finally:
    sb.terminate()
sb.wait(raise_on_termination=False)
raises(NotFoundError, lambda: modal.Sandbox.from_name(app_name, "worker-1"))
again = modal.Sandbox.create(app=app, name="worker-1")
again.terminate()
print("names.py: ok")
