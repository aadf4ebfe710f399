"""The filesystem: write_files, list with depth, exists, get_info, make_dir, rename, remove."""

from e2b import FileType, Sandbox
from e2b.sandbox.filesystem.filesystem import WriteEntry

with Sandbox.create() as sbx:
    infos = sbx.files.write_files(
        [
            WriteEntry(path="/home/user/project/a.txt", data="A"),
            WriteEntry(path="/home/user/project/src/b.py", data=b"print('b')\n"),
        ]
    )
    assert sorted(i.path for i in infos) == [
        "/home/user/project/a.txt",
        "/home/user/project/src/b.py",
    ], infos
    top = sbx.files.list("/home/user/project")
    assert sorted(e.name for e in top) == ["a.txt", "src"], top
    deep = sbx.files.list("/home/user/project", depth=2)
    assert sorted(e.path for e in deep) == [
        "/home/user/project/a.txt",
        "/home/user/project/src",
        "/home/user/project/src/b.py",
    ], deep
    info = sbx.files.get_info("/home/user/project/a.txt")
    assert info.type == FileType.FILE and info.size == 1, info
    assert sbx.files.get_info("/home/user/project/src").type == FileType.DIR

    assert sbx.files.make_dir("/home/user/new/nested")
    assert not sbx.files.make_dir("/home/user/new/nested")
    moved = sbx.files.rename("/home/user/project/a.txt", "/home/user/new/a.txt")
    assert moved.path == "/home/user/new/a.txt", moved
    assert not sbx.files.exists("/home/user/project/a.txt")
    assert sbx.files.read("/home/user/new/a.txt") == "A"
    sbx.files.remove("/home/user/project")
    assert not sbx.files.exists("/home/user/project")
    out = sbx.commands.run("python3 -c 'print(1 + 1)' 2>/dev/null || echo 2")
    assert out.stdout.strip() == "2"
print("ok")
