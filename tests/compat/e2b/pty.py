"""A terminal: create a PTY, resize it, type into it, read what it prints, and see it exit."""

from e2b import PtySize, Sandbox

with Sandbox.create() as sbx:
    terminal = sbx.pty.create(PtySize(rows=24, cols=80), envs={"PS1": "$ "})
    sbx.pty.resize(terminal.pid, PtySize(rows=30, cols=100))
    sbx.pty.send_stdin(terminal.pid, b"stty size; echo typed-$((40 + 2))\n")
    sbx.pty.send_stdin(terminal.pid, b"exit 0\n")
    output = bytearray()
    result = terminal.wait(on_pty=output.extend)
    text = output.decode(errors="replace")
    assert result.exit_code == 0, result
    assert "30 100" in text, text
    assert "typed-42" in text, text

    # A terminal that is killed ends.
    other = sbx.pty.create(PtySize(rows=10, cols=40))
    assert sbx.pty.kill(other.pid)
    try:
        other.wait()
    except Exception:
        pass
    assert other.pid not in [p.pid for p in sbx.commands.list()]
print("ok")
