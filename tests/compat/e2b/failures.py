"""What a program sees when things go wrong: a non-zero exit, an unknown sandbox, a missing
file, bad arguments, and a sandbox used after it was killed."""

from e2b import (
    AuthenticationException,
    CommandExitException,
    FileNotFoundException,
    InvalidArgumentException,
    NotFoundException,
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
    TimeoutException,
)


def raises(kind, fn):
    try:
        fn()
    except kind as e:
        return e
    raise AssertionError(f"expected {kind.__name__}")


sbx = Sandbox.create()
try:
    e = raises(CommandExitException, lambda: sbx.commands.run("echo before; exit 3"))
    assert e.exit_code == 3, e.exit_code
    assert e.stdout == "before\n", repr(e.stdout)

    raises(FileNotFoundException, lambda: sbx.files.read("/no/such/file"))
    raises(NotFoundException, lambda: sbx.files.get_info("/no/such/file"))
    assert not sbx.files.exists("/no/such/file")
    raises(InvalidArgumentException, lambda: sbx.files.list("/", depth=0))

    # A command that outlives its timeout: the SDK gives up with TimeoutException.
    raises(TimeoutException, lambda: sbx.commands.run("sleep 30", timeout=1))

    # A command that is not there.
    raises(CommandExitException, lambda: sbx.commands.run("no-such-program-here"))
    assert not sbx.commands.kill(999999)
finally:
    sbx.kill()

raises(AuthenticationException, lambda: Sandbox.create(api_key="not-the-daemons-token"))
raises(SandboxNotFoundException, lambda: Sandbox.connect("sbx_doesnotexist"))
raises(SandboxNotFoundException, lambda: Sandbox.get_info("sbx_doesnotexist"))
raises(SandboxException, lambda: Sandbox.create(template="no-such-template"))
raises(SandboxException, lambda: Sandbox.create(timeout=-5))
# The killed sandbox's commands find it gone.
raises(SandboxException, lambda: sbx.commands.run("true"))
print("ok")
