"""The synchronous client against a real daemon (sdk/run-tests.sh starts one and sets
BELLJAR_HOME): create with Modal's arguments, exec with lines streamed as they arrive, wait and
poll, stdin, kill, a pty, the idle timeout, the filesystem, tags, list, snapshot and restore,
terminate, and the API's error codes; unsupported options raise instead of being ignored."""

import os

import httpx
import pytest

from pathlib import Path

from belljar import BelljarError, Client, Endpoint, NotSupportedError, Sandbox, Volume

TAG = {"suite": f"py-{os.getpid()}"}


@pytest.fixture(scope="module")
def sb():
    s = Sandbox.create(timeout=600, env={"GREETING": "hi"}, tags=TAG)
    yield s
    for left in Sandbox.list(tags=TAG):
        left.delete()


def test_create_from_id_and_list(sb):
    assert sb.status == "running" and sb.object_id.startswith("sbx_")
    assert Sandbox.from_id(sb.object_id).object_id == sb.object_id
    assert [s.object_id for s in Sandbox.list(tags=TAG)] == [sb.object_id]
    assert list(Sandbox.list(tags={**TAG, "other": "x"})) == []


def test_exec_streams_lines_as_they_arrive(sb):
    p = sb.exec("sh", "-c", "echo one; read go; echo two; echo $GREETING $X >&2; exit 3", env={"X": "y"})
    lines = iter(p.stdout)
    # "one" is read while the command still waits on stdin: streamed, not buffered.
    assert next(lines) == "one\n"
    assert p.poll() is None
    p.stdin.write("go\n")
    p.stdin.write_eof()
    assert list(lines) == ["two\n"]
    assert p.stderr.read() == "hi y\n"
    assert p.wait() == 3
    assert p.returncode == 3 and p.poll() == 3


def test_exec_workdir_pty_kill(sb):
    assert sb.exec("pwd", workdir="/tmp").stdout.read() == "/tmp\n"
    assert sb.exec("sh", "-c", "[ -t 1 ] && echo tty", pty=True).stdout.read().strip() == "tty"
    p = sb.exec("sleep", "60")
    p.kill()
    assert p.wait() == -9


def test_filesystem(sb, tmp_path):
    fs = sb.filesystem
    fs.write_text("héllo\n", "/workspace/d/a.txt")
    fs.write_bytes(b"\x00\xff", "/workspace/d/b.bin", mode=0o700)
    assert fs.read_text("/workspace/d/a.txt") == "héllo\n"
    assert fs.read_bytes("/workspace/d/b.bin") == b"\x00\xff"
    assert fs.stat("/workspace/d/b.bin").mode == 0o700
    assert fs.ls("/workspace/d") == ["a.txt", "b.bin"]
    local = tmp_path / "up.txt"
    local.write_text("from host")
    fs.copy_from_local(local, "/workspace/up/x.txt")
    fs.copy_to_local("/workspace/up/x.txt", tmp_path / "down" / "y.txt")
    assert (tmp_path / "down" / "y.txt").read_text() == "from host"
    fs.mkdir("/workspace/m/n")
    assert fs.stat("/workspace/m/n").type == "directory"
    with pytest.raises(BelljarError) as e:
        fs.remove("/workspace/m")
    assert e.value.code == "not_empty"
    fs.rm("/workspace/m", recursive=True)
    with pytest.raises(BelljarError) as e:
        fs.read_text("/workspace/m")
    assert e.value.code == "not_found"


def test_a_volume_is_shared_and_kept():
    name = f"py-{os.getpid()}"
    vol = Volume.from_name(name, create_if_missing=True)
    assert Volume.from_name(name).name == name
    a = Sandbox.create(volumes={"/data": vol}, tags=TAG)
    b = Sandbox.create(volumes={"/seen": vol.read_only()}, tags=TAG)
    assert a.exec("sh", "-c", "echo shared > /data/f").wait() == 0
    p = b.exec("cat", "/seen/f")
    assert p.stdout.read() == "shared\n" and p.wait() == 0
    assert b.exec("touch", "/seen/g").wait() != 0
    with pytest.raises(BelljarError) as e:
        Volume.delete(name)
    assert e.value.code == "volume_in_use"
    a.delete()
    b.delete()
    Volume.delete(name)
    with pytest.raises(BelljarError) as e:
        Volume.from_name(name)
    assert e.value.code == "volume_not_found"


def test_tags(sb):
    sb.set_tags({**TAG, "stage": "2"})
    assert sb.get_tags() == {**TAG, "stage": "2"}


def test_errors_and_unsupported_options():
    with pytest.raises(BelljarError) as e:
        Sandbox.from_id("sbx_nosuch")
    assert (e.value.code, e.value.status) == ("not_found", 404)
    with pytest.raises(BelljarError) as e:
        Sandbox.create(memory=1)
    assert e.value.code == "bad_request"
    with pytest.raises(BelljarError) as e:
        Sandbox.create(idle_timeout=0)
    assert e.value.code == "bad_request"
    assert list(Sandbox.list(tags={"never": "created"})) == []


def test_bad_path_is_an_error_code(sb):
    with pytest.raises(BelljarError) as e:
        sb.filesystem.read_text("/no/such/file")
    assert (e.value.code, e.value.status) == ("not_found", 404)


def test_pty_is_a_terminal_with_stdin(sb):
    p = sb.exec("sh", "-c", "stty size; read line; echo got:$line", pty=True)
    p.stdin.write("hi\n")
    out = p.stdout.read()
    # A terminal: its size, the typed line echoed back, and CR LF line ends.
    assert "24 80\r\n" in out and "got:hi\r\n" in out
    assert p.wait() == 0


def test_idle_timeout_pauses_and_use_resumes():
    s = Sandbox.create(idle_timeout=1, tags=TAG)
    assert s._data["idle_timeout_ms"] == 1000
    # Every change of a sandbox is on the daemon's event stream (replayed from its start with
    # since=0), so the test waits for the pause itself, at most 30 s with no event.
    events = Client()
    events.http.timeout = httpx.Timeout(30.0)
    for event in events.ndjson("/v1/events?since=0"):
        if event["type"] == "sandbox" and event["sandbox"]["id"] == s.object_id:
            if event["sandbox"]["status"] == "paused":
                break
    assert Sandbox.from_id(s.object_id).status == "paused"
    # auto_resume: the next command resumes it.
    assert s.exec("echo", "awake").stdout.read() == "awake\n"
    s.terminate()


def test_snapshot_restore_terminate(sb):
    sb.filesystem.write_text("kept", "/workspace/keep.txt")
    snap = sb.snapshot_filesystem()
    assert snap.object_id.startswith("snap_") and snap.source_sandbox_id == sb.object_id
    sb2 = Sandbox.create(image=snap, tags=TAG)
    assert sb2.filesystem.read_text("/workspace/keep.txt") == "kept"
    assert sb2.poll() is None
    sb2.terminate()
    assert sb2.poll() == "stopped"
    sb2.terminate()  # a no-op once it ended
    with pytest.raises(BelljarError) as e:
        sb2.exec("true")
    assert e.value.code == "sandbox_not_running"


def test_mount_image_into_a_running_sandbox(sb):
    assert sb.exec("mkdir", "-p", "/workspace/proj").wait() == 0
    sb.filesystem.write_text("shared", "/workspace/proj/a.txt")
    snap = sb.snapshot_directory("/workspace/proj")
    other = Sandbox.create(tags=TAG)
    other.mount_image("/work/proj", snap)
    assert other.filesystem.read_text("/work/proj/a.txt") == "shared"
    other.filesystem.write_text("mine", "/work/proj/a.txt")
    assert sb.filesystem.read_text("/workspace/proj/a.txt") == "shared"
    other.unmount_image("/work/proj")
    assert other.exec("ls", "-A", "/work/proj").stdout.read() == ""
    with pytest.raises(BelljarError) as e:
        other.unmount_image("/work/proj")
    assert e.value.code == "not_found"
    with pytest.raises(BelljarError) as e:
        other.mount_image("/etc/passwd", snap)
    assert e.value.code == "not_a_directory"
    other.terminate()


def test_over_tcp_with_the_token(sb):
    home = Path(os.environ["BELLJAR_HOME"])
    base_url = f"http://127.0.0.1:{(home / 'run' / 'port').read_text().strip()}"
    token = (home / "config" / "token").read_text().strip()
    tcp = Client(Endpoint(base_url=base_url, token=token))
    assert Sandbox.from_id(sb.object_id, client=tcp).exec("echo", "tcp").stdout.read() == "tcp\n"
    with pytest.raises(BelljarError) as e:
        Sandbox.from_id(sb.object_id, client=Client(Endpoint(base_url=base_url, token="wrong")))
    assert (e.value.code, e.value.status) == ("unauthorized", 401)


def test_network_options():
    blocked = Sandbox.create(block_network=True, tags=TAG)
    assert blocked.network_policy() == "deny-all"
    assert blocked.exec("getent", "hosts", "a.test").wait() != 0
    allow = ["203.0.113.0/24"]
    ranged = Sandbox.create(outbound_cidr_allowlist=allow, unencrypted_ports=[8000], tags=TAG)
    assert ranged.network_policy() == {"subnets": {"allow": allow, "deny": []}}
    tunnels = ranged.tunnels()
    assert list(tunnels) == [8000]
    assert tunnels[8000].host == "127.0.0.1" and tunnels[8000].port > 0
    ranged.set_network_policy("deny-all")
    assert ranged.network_policy() == "deny-all"
    with pytest.raises(NotSupportedError):
        Sandbox.create(encrypted_ports=[443])
    with pytest.raises(BelljarError) as e:
        Sandbox.create(outbound_cidr_allowlist=["not-a-cidr"])
    assert e.value.code == "bad_request"
