"""A sandbox's life: timeout, set_timeout, pause, connect (which resumes it), get_info,
list by state, a second client connecting by id, and metrics."""

import datetime

from e2b import Sandbox, SandboxQuery, SandboxState

sbx = Sandbox.create(timeout=120, envs={"FROM_CREATE": "yes"})
try:
    info = sbx.get_info()
    left = info.end_at - datetime.datetime.now(datetime.timezone.utc)
    assert datetime.timedelta(seconds=60) < left <= datetime.timedelta(seconds=125), left
    assert info.state == SandboxState.RUNNING, info.state

    sbx.set_timeout(600)
    left = sbx.get_info().end_at - datetime.datetime.now(datetime.timezone.utc)
    assert left > datetime.timedelta(seconds=500), left

    assert sbx.commands.run("echo $FROM_CREATE").stdout == "yes\n"
    sbx.files.write("/home/user/state.txt", "kept")

    assert sbx.pause()
    assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.PAUSED
    paused = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()
    assert sbx.sandbox_id in [s.sandbox_id for s in paused], paused

    again = Sandbox.connect(sbx.sandbox_id)
    assert again.sandbox_id == sbx.sandbox_id
    assert again.get_info().state == SandboxState.RUNNING
    assert again.files.read("/home/user/state.txt") == "kept"
    assert again.commands.run("echo back").stdout == "back\n"
finally:
    sbx.kill()
assert sbx.sandbox_id not in [s.sandbox_id for s in Sandbox.list().next_items()]

# Metrics: one sample of a running sandbox.
with Sandbox.create() as measured:
    measured.commands.run("head -c 20000000 /dev/zero | md5sum")
    [m] = measured.get_metrics()
    assert m.cpu_count >= 1, m
    assert 0 < m.mem_used <= m.mem_total, m
    assert 0 <= m.cpu_used_pct <= 100, m
print("ok")
