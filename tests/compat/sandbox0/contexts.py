"""Contexts as the SDK documents them: cmd (wait, cwd, env, exit code, stdout/stderr),
a non-zero exit, a streamed command with input and its done event, REPL contexts keeping
state between run() calls (python on the python3.13 template, bash on default), a REPL's
stream, signals, and the errors for an unknown context and bad requests."""
import os

from sandbox0 import APIError, CmdOptions, Client

client = Client(token=os.environ["SANDBOX0_TOKEN"], base_url=os.environ["SANDBOX0_BASE_URL"])


def api_error(fn, status):
    try:
        fn()
    except APIError as e:
        assert e.status_code == status, (e, status)
        return e
    raise AssertionError(f"expected APIError {status}")


sandbox = client.sandboxes.claim("python3.13")
try:
    r = sandbox.cmd("echo hello")
    assert (r.stdout, r.stderr, r.exit_code, r.state) == ("hello\n", "", 0, "exited"), r
    assert r.output_raw == "hello\n"

    r = sandbox.cmd("pwd", CmdOptions(cwd="/tmp"))
    assert r.stdout == "/tmp\n", r
    r = sandbox.cmd("sh -c 'echo $GREETING >&2; exit 3'", CmdOptions(env_vars={"GREETING": "hi"}))
    assert (r.stderr, r.exit_code) == ("hi\n", 3), r
    r = sandbox.cmd("whoami")
    assert r.stdout == "root\n", r

    # A command that does not exist fails as the SDK's APIError.
    api_error(lambda: sandbox.cmd("no-such-program-here"), 400)
    try:
        sandbox.cmd("   ")
        raise AssertionError("an empty command ran")
    except ValueError:
        pass

    # Streaming: output in order, input to the process, then the exit.
    stream = sandbox.cmd_stream("sh -c 'echo ready; read line; echo got:$line; exit 7'")
    outputs = []
    for out in stream.iter_outputs():
        outputs.append(out.data)
        if "ready" in "".join(outputs) and len(outputs) == 1:
            stream.send_input("ping\n")
    done = stream.wait()
    stream.close()
    assert "".join(outputs) == "ready\ngot:ping\n", outputs
    assert done.exit_code == 7 and done.state == "exited", done

    # A signal ends a long command.
    stream = sandbox.cmd_stream("sleep 300")
    stream.send_signal("SIGTERM")
    done = stream.wait()
    stream.close()
    assert done.state == "killed", done

    # REPL: state persists between calls; the last expression's value is printed.
    r = sandbox.run("python", "x = 40\ny = 2")
    assert r.output_raw == "", r
    r = sandbox.run("python", "x + y")
    assert r.output_raw == "42\n", r
    r = sandbox.run("python", "print('a'); import sys; print('b', file=sys.stderr)")
    assert r.output_raw == "a\nb\n", r
    r = sandbox.run("python", "1/0")
    assert "ZeroDivisionError" in r.output_raw, r
    r = sandbox.run("python", "x")
    assert r.output_raw == "40\n", r

    r = sandbox.run("bash", "cd /tmp && N=5")
    r = sandbox.run("bash", "echo $N $(pwd)")
    assert r.output_raw == "5 /tmp\n", r

    contexts = sandbox.list_contexts()
    ids = [c.id for c in contexts]
    python_ctx = sandbox._repl_context_by_lang["python"]
    assert python_ctx in ids, ids
    ctx = sandbox.get_context(python_ctx)
    assert ctx.running and ctx.type_.value == "repl" and ctx.alias == "python", ctx

    # A REPL's stream: code sent as input, its output, then its request's done.
    stream = sandbox.connect_ws_context(python_ctx)
    stream.send_input("print(x * 2)\n", request_id="r1")
    got = ""
    for out in stream.iter_outputs():
        got += out.data
        if "80\n" in got:
            break
    stream.close()
    assert got == "80\n", got

    sandbox.delete_context(python_ctx)
    api_error(lambda: sandbox.get_context(python_ctx), 404)
    api_error(lambda: sandbox.context_exec("cmd_nosuchcontext", "1"), 404)
    # exec runs code in a REPL only; resizing needs a terminal.
    cmd_ctx = sandbox.cmd("true").context_id
    api_error(lambda: sandbox.context_exec(cmd_ctx, "1"), 400)
    api_error(lambda: sandbox.run("cobol", "DISPLAY 'HI'"), 400)
finally:
    client.sandboxes.delete(sandbox.id)
print("contexts: ok")
