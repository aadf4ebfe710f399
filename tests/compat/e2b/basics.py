"""The SDK README's first steps: create a sandbox, run a command, read and write files,
list the sandbox, and kill it."""

from e2b import Sandbox, SandboxQuery

sbx = Sandbox.create(metadata={"suite": "e2b-basics"})
try:
    result = sbx.commands.run("echo hello && echo oops >&2")
    assert result.exit_code == 0, result
    assert result.stdout == "hello\n", repr(result.stdout)
    assert result.stderr == "oops\n", repr(result.stderr)

    who = sbx.commands.run("whoami && pwd")
    assert who.stdout == "user\n/home/user\n", repr(who.stdout)
    root = sbx.commands.run("whoami", user="root")
    assert root.stdout == "root\n", repr(root.stdout)

    env = sbx.commands.run("echo $GREETING; pwd", envs={"GREETING": "hi"}, cwd="/tmp")
    assert env.stdout == "hi\n/tmp\n", repr(env.stdout)

    chunks = []
    sbx.commands.run("for i in 1 2 3; do echo $i; done", on_stdout=chunks.append)
    assert "".join(chunks) == "1\n2\n3\n", chunks

    info = sbx.files.write("/home/user/hello.txt", "Hello, world!")
    assert info.path == "/home/user/hello.txt", info
    assert sbx.files.read("/home/user/hello.txt") == "Hello, world!"
    assert sbx.files.read("hello.txt") == "Hello, world!"
    owner = sbx.commands.run("stat -c %U /home/user/hello.txt")
    assert owner.stdout == "user\n", repr(owner.stdout)

    listed = Sandbox.list(query=SandboxQuery(metadata={"suite": "e2b-basics"})).next_items()
    assert [s.sandbox_id for s in listed] == [sbx.sandbox_id], listed
    assert sbx.is_running()
    assert sbx.get_info().metadata == {"suite": "e2b-basics"}
finally:
    assert sbx.kill()
assert not Sandbox.kill(sbx.sandbox_id)
print("ok")
