"""Images built by the daemon's Dockerfile builder from the client's own image definitions:
`debian_slim()` with `run_commands`, `env` and `workdir` on top, what a sandbox of it sees
(in commands and in the entrypoint), the same definition again taking the built image instead
of building it anew, and a failing step and an unknown Dockerfile command raising the
client's `ImageBuildError`."""

import uuid

import modal
from modal.exception import ImageBuildError


def raises(kind, fn):
    try:
        fn()
    except kind as e:
        return e
    raise AssertionError(f"expected {kind.__name__}")


def define(marker):
    return (
        modal.Image.debian_slim(python_version="3.12")
        .run_commands(f"echo {marker} > /marker", "cat /proc/sys/kernel/random/uuid > /built")
        .env({"GREETING": "hello from the image"})
        .workdir("/srv/app")
        .run_commands("pwd > here")
    )


app = modal.App.lookup("belljar-modal-images", create_if_missing=True)
# A definition of its own each run, so that its first build really runs its steps.
marker = uuid.uuid4().hex
image = define(marker)

sb = modal.Sandbox.create(app=app, image=image)
try:
    p = sb.exec("sh", "-c", "cat /marker; echo $GREETING; pwd; cat /srv/app/here")
    got = p.stdout.read()
    assert p.wait() == 0, p.stderr.read()
    assert got == f"{marker}\nhello from the image\n/srv/app\n/srv/app\n", repr(got)
    built = sb.exec("cat", "/built").stdout.read()
finally:
    sb.terminate()
assert image.object_id.startswith("im-"), image.object_id

# The entrypoint runs in the image's environment and working directory too.
sb = modal.Sandbox.create("sh", "-c", "echo $GREETING; pwd", app=app, image=image)
assert sb.stdout.read() == "hello from the image\n/srv/app\n"
sb.wait()
assert sb.returncode == 0, sb.returncode

# The same definition again, as a new Image object: the same image, its RUN steps not rerun.
again = define(marker)
sb = modal.Sandbox.create(app=app, image=again)
try:
    assert sb.exec("cat", "/built").stdout.read() == built
finally:
    sb.terminate()
assert again.object_id == image.object_id, (again.object_id, image.object_id)

# A step that fails: the client's ImageBuildError, with the command's exit code and output.
bad = modal.Image.debian_slim().run_commands(f"echo {marker} went wrong >&2; exit 3")
e = raises(ImageBuildError, lambda: modal.Sandbox.create(app=app, image=bad))
assert "exit code 3" in str(e), e
assert f"{marker} went wrong" in str(e), e
# Asked again, it fails again (a failed build is not kept as an image).
raises(ImageBuildError, lambda: bad.build(app))

# A Dockerfile command the builder does not know.
bad = modal.Image.debian_slim().dockerfile_commands(["FROBNICATE now"])
e = raises(ImageBuildError, lambda: modal.Sandbox.create(app=app, image=bad))
assert "FROBNICATE" in str(e), e

# A registry image that is not here and names no registry to pull it from.
e = raises(ImageBuildError, lambda: modal.Image.from_registry("no-such-image:1").build(app))
assert "no registry" in str(e), e
print("images.py: ok")
