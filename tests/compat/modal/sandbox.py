"""`Sandbox.create` with its options (image, timeout, workdir, env, cpu, memory,
block_network), the entrypoint's stderr, stdin and non-zero exit, `poll`, `from_id` and
`terminate`, each checked against what the sandbox saw or the daemon recorded."""

import json
import os
import subprocess
import time

import modal
from modal.exception import SandboxTimeoutError

app = modal.App.lookup("belljar-modal-sandbox", create_if_missing=True)
belljar = os.environ["BELLJAR_BIN"]


def daemon_view(sb):
    """The daemon's record of a Modal sandbox (its id is the daemon's, wrapped)."""
    sid = "sbx_" + sb.object_id.removeprefix("sb-BelljarSbx")
    out = subprocess.run([belljar, "--json", "info", sid], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


sb = modal.Sandbox.create(
    "sh", "-c", 'pwd; echo "FOO=$FOO"; echo oops >&2; read line; echo "got $line"; exit 3',
    app=app,
    image=modal.Image.debian_slim(),
    timeout=60,
    workdir="/tmp",
    env={"FOO": "bar"},
    cpu=1,
    memory=512,
    block_network=True,
)
view = daemon_view(sb)
assert view["image"] == "python3.13", view["image"]
assert view["vcpus"] == 1, view["vcpus"]
assert view["memory_mib"] == 512, view["memory_mib"]
assert view["timeout_ms"] == 60_000, view["timeout_ms"]
assert view["network_policy"] == "deny-all", view["network_policy"]
assert sb.poll() is None
sb.stdin.write(b"line one\n")
sb.stdin.write_eof()
sb.stdin.drain()
sb.wait()
assert sb.returncode == 3, sb.returncode
assert sb.stdout.read() == "/tmp\nFOO=bar\ngot line one\n", "stdout"
assert sb.stderr.read() == "oops\n", "stderr"

# The same sandbox found by its id: its result is there, and so is its output.
again = modal.Sandbox.from_id(sb.object_id)
assert again.returncode == 3, again.returncode
assert again.poll() == 3

# `from_registry` of an image Belljar has locally.
sb = modal.Sandbox.create("cat", "/etc/os-release", app=app, image=modal.Image.from_registry("base"))
assert "Debian" in sb.stdout.read()
sb.wait()
assert sb.returncode == 0

# A sandbox that outlives its timeout.
sb = modal.Sandbox.create("sleep", "60", app=app, timeout=2)
started = time.monotonic()
try:
    sb.wait()
    raise AssertionError("expected SandboxTimeoutError")
except SandboxTimeoutError:
    pass
assert time.monotonic() - started < 30
assert sb.returncode == 124, sb.returncode

# Terminated with wait=True: the exit code comes back.
sb = modal.Sandbox.create("sleep", "60", app=app)
assert sb.terminate(wait=True) == 137
print("sandbox.py: ok")
