"""Files as the SDK documents them: write, read, stat, list, mkdir (recursive or not),
move, delete, watch; and the errors for a missing file, a missing parent and an unknown
sandbox."""
import os
import threading

from sandbox0 import APIError, Client

client = Client(token=os.environ["SANDBOX0_TOKEN"], base_url=os.environ["SANDBOX0_BASE_URL"])


def api_error(fn, status):
    try:
        fn()
    except APIError as e:
        assert e.status_code == status, (e, status)
        return e
    raise AssertionError(f"expected APIError {status}")


sandbox = client.sandboxes.claim("default")
try:
    sandbox.write_file("/workspace/hello.txt", b"Hello, Sandbox0!\n")
    assert sandbox.read_file("/workspace/hello.txt") == b"Hello, Sandbox0!\n"
    blob = bytes(range(256)) * 4096
    sandbox.write_file("/workspace/blob.bin", blob)
    assert sandbox.read_file("/workspace/blob.bin") == blob

    info = sandbox.stat_file("/workspace/hello.txt")
    assert (info.name, info.path, info.type_.value, info.size) == (
        "hello.txt", "/workspace/hello.txt", "file", 17), info
    assert not info.is_link and info.mod_time is not None

    sandbox.mkdir("/workspace/a/b/c", recursive=True)
    assert sandbox.stat_file("/workspace/a/b/c").type_.value == "dir"
    api_error(lambda: sandbox.mkdir("/workspace/x/y"), 404)
    sandbox.mkdir("/workspace/x")

    names = sorted(e.name for e in sandbox.list_files("/workspace"))
    assert names == ["a", "blob.bin", "hello.txt", "x"], names

    sandbox.move_file("/workspace/hello.txt", "/workspace/a/moved.txt")
    assert sandbox.read_file("/workspace/a/moved.txt") == b"Hello, Sandbox0!\n"
    api_error(lambda: sandbox.read_file("/workspace/hello.txt"), 404)

    sandbox.delete_file("/workspace/a")
    api_error(lambda: sandbox.stat_file("/workspace/a"), 404)
    api_error(lambda: sandbox.read_file("/no/such/file"), 404)
    api_error(lambda: sandbox.read_file("relative/path"), 400)

    # A watch sees a file written after it subscribed.
    watch = sandbox.watch_files("/workspace", recursive=True)
    assert watch.watch_id
    seen = []

    def follow():
        for ev in watch.iter_events():
            seen.append(ev)
            if ev.path.endswith("watched.txt"):
                return

    t = threading.Thread(target=follow)
    t.start()
    sandbox.write_file("/workspace/watched.txt", b"x")
    t.join(timeout=30)
    assert not t.is_alive(), "no watch event"
    assert seen[-1].type == "event" and seen[-1].path == "/workspace/watched.txt", seen
    assert seen[-1].event in ("create", "write"), seen
    watch.unsubscribe()

    api_error(lambda: client.sandbox("sbx_nosuchsandbox").read_file("/etc/hostname"), 404)
finally:
    client.sandboxes.delete(sandbox.id)
print("files: ok")
