"""Snapshots and forks: snapshot a sandbox, start a new one from it, list and delete the
snapshot, and fork a running sandbox."""

from e2b import Sandbox, SandboxException

with Sandbox.create() as sbx:
    sbx.files.write("/home/user/note.txt", "before the snapshot")
    snap = sbx.create_snapshot()
    assert snap.snapshot_id
    sbx.files.write("/home/user/note.txt", "after the snapshot")

    listed = [s.snapshot_id for s in Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id).next_items()]
    assert snap.snapshot_id in listed, listed

    with Sandbox.create(template=snap.snapshot_id) as restored:
        assert restored.files.read("/home/user/note.txt") == "before the snapshot"
        assert restored.commands.run("whoami").stdout == "user\n"

    forks = sbx.fork()
    assert len(forks) == 1, forks
    fork = forks[0]
    assert not isinstance(fork, Exception), fork
    try:
        assert fork.sandbox_id != sbx.sandbox_id
        assert fork.files.read("/home/user/note.txt") == "after the snapshot"
        fork.files.write("/home/user/note.txt", "the fork's")
        assert sbx.files.read("/home/user/note.txt") == "after the snapshot"
    finally:
        fork.kill()

    assert Sandbox.delete_snapshot(snap.snapshot_id)
    assert not Sandbox.delete_snapshot(snap.snapshot_id)
    try:
        Sandbox.create(template=snap.snapshot_id)
        raise AssertionError("a deleted snapshot starts nothing")
    except SandboxException:
        pass
print("ok")
