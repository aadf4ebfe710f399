"""`Sandbox.exec` and its ContainerProcess: read, iteration, stderr, stdin write/drain/
write_eof, wait, poll, returncode, workdir, env and a per-command timeout."""

import time

import modal

app = modal.App.lookup("belljar-modal-exec", create_if_missing=True)
sb = modal.Sandbox.create(app=app, workdir="/srv")
try:
    p = sb.exec("sh", "-c", 'pwd; echo "A=$A"; echo err >&2; exit 5', env={"A": "b"})
    assert p.stdout.read() == "/srv\nA=b\n"
    assert p.stderr.read() == "err\n"
    assert p.wait() == 5
    assert p.returncode == 5

    p = sb.exec("pwd", workdir="/tmp")
    assert p.stdout.read() == "/tmp\n"

    p = sb.exec("sh", "-c", "echo $S", secrets=[modal.Secret.from_dict({"S": "from a secret"})])
    assert p.stdout.read() == "from a secret\n"

    # A command past its timeout is ended (the client gives up on it at the same time).
    started = time.monotonic()
    p = sb.exec("sleep", "30", timeout=1)
    p.wait()
    assert time.monotonic() - started < 10

    p = sb.exec("cat")
    p.stdin.write(b"one\n")
    p.stdin.drain()
    p.stdin.write("two\n")
    p.stdin.write_eof()
    p.stdin.drain()
    assert p.stdout.read() == "one\ntwo\n"
    assert p.wait() == 0

    p = sb.exec("sleep", "30")
    assert p.poll() is None
    sb.exec("pkill", "-x", "sleep").wait()
    assert p.wait() == 128 + 15, p.returncode

    p = sb.exec("python3", "-c", "import sys; sys.stdout.buffer.write(bytes(range(256)))", text=False)
    assert p.stdout.read() == bytes(range(256))

    lines = list(sb.exec("sh", "-c", "printf 'a\\nb\\nc'", bufsize=1).stdout)
    assert lines == ["a\n", "b\n", "c"], lines
finally:
    sb.terminate()
print("exec.py: ok")
