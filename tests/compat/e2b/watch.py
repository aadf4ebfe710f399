"""Watching a directory (the README's watch_dir example): the events of files made, written
and removed under it, then the watcher stopped."""

import time

from e2b import FilesystemEventType, Sandbox

with Sandbox.create() as sbx:
    sbx.files.make_dir("/home/user/watched")
    handle = sbx.files.watch_dir("/home/user/watched")
    sbx.files.write("/home/user/watched/a.txt", "one")
    sbx.commands.run("rm /home/user/watched/a.txt")
    seen = []
    # The events arrive as the sandbox's kernel reports them; poll for them as the SDK's
    # docstring does, for at most ten seconds.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        seen += handle.get_new_events()
        if any(e.type == FilesystemEventType.REMOVE for e in seen):
            break
        time.sleep(0.2)
    names = {(e.name, e.type) for e in seen}
    assert ("a.txt", FilesystemEventType.CREATE) in names or (
        "a.txt",
        FilesystemEventType.WRITE,
    ) in names, seen
    assert ("a.txt", FilesystemEventType.REMOVE) in names, seen
    handle.stop()
    try:
        handle.get_new_events()
        raise AssertionError("a stopped watcher has no events")
    except Exception as e:
        assert "stopped" in str(e), e
print("ok")
