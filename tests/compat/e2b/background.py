"""Background commands: start, list, send stdin, connect to a running one, wait, kill."""

from e2b import CommandExitException, Sandbox

with Sandbox.create() as sbx:
    handle = sbx.commands.run("read line; echo got:$line", background=True, stdin=True)
    assert handle.pid > 0
    assert handle.pid in [p.pid for p in sbx.commands.list()]
    sbx.commands.send_stdin(handle.pid, "hello\n")
    result = handle.wait()
    assert result.stdout == "got:hello\n", repr(result.stdout)
    assert handle.pid not in [p.pid for p in sbx.commands.list()]

    sleeper = sbx.commands.run("sleep 600", background=True)
    listed = {p.pid: p for p in sbx.commands.list()}
    assert listed[sleeper.pid].cmd == "/bin/bash", listed[sleeper.pid]
    other = sbx.commands.connect(sleeper.pid)
    assert other.pid == sleeper.pid
    assert sbx.commands.kill(sleeper.pid)
    try:
        sleeper.wait()
        raise AssertionError("a killed command exits non-zero")
    except CommandExitException as e:
        assert e.exit_code != 0
    assert sleeper.pid not in [p.pid for p in sbx.commands.list()]
print("ok")
