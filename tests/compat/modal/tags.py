"""Tags and listing: `set_tags`/`get_tags`, `Sandbox.list(app_id=, tags=)` answering the running
sandboxes of an app that carry the tags asked for, and not the ones that have finished."""

import uuid

import modal

app = modal.App.lookup(f"belljar-modal-tags-{uuid.uuid4().hex[:8]}", create_if_missing=True)
a = modal.Sandbox.create(app=app, tags={"role": "web"})
b = modal.Sandbox.create(app=app)
try:
    assert a.get_tags() == {"role": "web"}, a.get_tags()
    b.set_tags({"role": "worker", "n": "1"})
    assert b.get_tags() == {"role": "worker", "n": "1"}, b.get_tags()
    ids = {s.object_id for s in modal.Sandbox.list(app_id=app.app_id)}
    assert ids == {a.object_id, b.object_id}, ids
    workers = [s.object_id for s in modal.Sandbox.list(app_id=app.app_id, tags={"role": "worker"})]
    assert workers == [b.object_id], workers
    a.terminate()
    a.wait(raise_on_termination=False)
    ids = {s.object_id for s in modal.Sandbox.list(app_id=app.app_id)}
    assert ids == {b.object_id}, ids
finally:
    a.terminate()
    b.terminate()
print("tags.py: ok")
