"""The Modal document's own examples of `Sandbox.create` and `Sandbox.exec`, unchanged, and
what they print checked: the entrypoint is the sandbox's own process, its output the sandbox's
stdout, its exit the sandbox's returncode."""

import contextlib
import io

import modal

# `Sandbox.create`'s usage example, as the document gives it.
out = io.StringIO()
with contextlib.redirect_stdout(out):
    app = modal.App.lookup('sandbox-hello-world', create_if_missing=True)
    sandbox = modal.Sandbox.create("echo", "hello world", app=app)
    print(sandbox.stdout.read())
    sandbox.wait()
assert out.getvalue() == "hello world\n\n", repr(out.getvalue())
assert sandbox.returncode == 0, sandbox.returncode
assert sandbox.poll() == 0
assert sandbox.object_id.startswith("sb-"), sandbox.object_id
assert app.app_id == modal.App.lookup("sandbox-hello-world").app_id

# `Sandbox.exec`'s usage example, in a sandbox that runs until it is terminated.
sandbox = modal.Sandbox.create(app=app)
try:
    assert sandbox.poll() is None
    assert sandbox.returncode is None
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        process = sandbox.exec("bash", "-c", "for i in $(seq 1 3); do echo foo $i; sleep 0.1; done")
        for line in process.stdout:
            print(line)
    assert out.getvalue() == "foo 1\n\nfoo 2\n\nfoo 3\n\n", repr(out.getvalue())
    assert process.wait() == 0
finally:
    sandbox.terminate()
sandbox.wait(raise_on_termination=False)
assert sandbox.returncode == 137, sandbox.returncode
print("hello.py: ok")
