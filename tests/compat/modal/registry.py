"""`Image.from_registry` of an image that is not here: the daemon pulls it from the registry
the reference names (a loopback registry, which tests/compat/modal.sh starts) and builds the
steps on top; a tag the registry does not have is the client's `ImageBuildError`."""

import os

import modal
from modal.exception import ImageBuildError


def raises(kind, fn):
    try:
        fn()
    except kind as e:
        return e
    raise AssertionError(f"expected {kind.__name__}")


registry = os.environ["BELLJAR_TEST_REGISTRY"]
app = modal.App.lookup("belljar-modal-registry", create_if_missing=True)

image = modal.Image.from_registry(f"{registry}/modal/busy:1").run_commands("echo built > /built")
sb = modal.Sandbox.create("sh", "-c", "cat /etc/hello /built", app=app, image=image)
assert sb.stdout.read() == "from the registry\nbuilt\n"
sb.wait()
assert sb.returncode == 0, sb.returncode

# The registry image alone, now here.
sb = modal.Sandbox.create("cat", "/etc/hello", app=app, image=modal.Image.from_registry(f"{registry}/modal/busy:1"))
assert sb.stdout.read() == "from the registry\n"
sb.wait()

e = raises(ImageBuildError, lambda: modal.Image.from_registry(f"{registry}/modal/busy:missing").build(app))
assert "missing" in str(e), e
print("registry.py: ok")
