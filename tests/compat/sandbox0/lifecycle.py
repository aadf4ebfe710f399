"""The Sandbox API reference's lifecycle, with the Python SDK: claim from the default
template with env_vars, memory and TTLs, get, status, list with filters, update, refresh
(default and custom duration), pause (the root filesystem survives, processes do not),
resume, delete; then the deleted sandbox is not found."""
import os
import time

from sandbox0 import APIError, Client
from sandbox0.apispec.models.sandbox_config import SandboxConfig
from sandbox0.apispec.models.sandbox_config_env_vars import SandboxConfigEnvVars
from sandbox0.apispec.models.sandbox_refresh_request import SandboxRefreshRequest
from sandbox0.apispec.models.sandbox_update_config import SandboxUpdateConfig
from sandbox0.apispec.models.sandbox_update_request import SandboxUpdateRequest

client = Client(token=os.environ["SANDBOX0_TOKEN"], base_url=os.environ["SANDBOX0_BASE_URL"])

env = SandboxConfigEnvVars()
env.additional_properties = {"APP_ENV": "development"}
config = SandboxConfig(env_vars=env, ttl=300, hard_ttl=3600)
sandbox = client.sandboxes.claim("default", config=config, memory="512Mi")
print("Sandbox ID:", sandbox.id)
try:
    assert sandbox.status == "running", sandbox.status
    assert sandbox.template == "default", sandbox.template

    sb = client.sandboxes.get(sandbox.id)
    assert sb.status.value == "running" and not sb.paused
    assert sb.template_id == "default"
    assert sb.resources.memory == "512Mi", sb.resources.memory
    assert sb.auto_resume is True
    assert sb.expires_at is not None and sb.hard_expires_at is not None
    left = sb.expires_at.timestamp() - time.time()
    assert 200 < left <= 300, left
    left = sb.hard_expires_at.timestamp() - time.time()
    assert 3500 < left <= 3600, left

    st = client.sandboxes.status(sandbox.id)
    assert st.status.value == "running" and st.sandbox_id == sandbox.id

    # Sandbox-level env_vars reach commands.
    r = sandbox.cmd("sh -c 'echo $APP_ENV'")
    assert r.stdout == "development\n", r

    listed = client.sandboxes.list(status="running", template_id="default", limit=10)
    assert sandbox.id in [s.id for s in listed], listed
    assert sandbox.id not in [s.id for s in client.sandboxes.list(paused=True)]
    assert client.sandboxes.list(template_id="node24") == [] or all(
        s.template_id == "node24" for s in client.sandboxes.list(template_id="node24"))

    # Refresh: the default duration is the configured TTL, or a custom one.
    resp = client.sandboxes.refresh(sandbox.id, SandboxRefreshRequest(duration=60))
    left = resp.expires_at.timestamp() - time.time()
    assert 0 < left <= 60, left
    resp = client.sandboxes.refresh(sandbox.id)
    left = resp.expires_at.timestamp() - time.time()
    assert 60 < left <= 300, left

    # Update the TTLs and auto_resume at runtime.
    updated = client.sandboxes.update(
        sandbox.id,
        SandboxUpdateRequest(config=SandboxUpdateConfig(ttl=600, hard_ttl=7200, auto_resume=False)),
    )
    assert updated.auto_resume is False
    left = updated.expires_at.timestamp() - time.time()
    assert 500 < left <= 600, left
    left = updated.hard_expires_at.timestamp() - time.time()
    assert 7100 < left <= 7200, left

    # Pause keeps the root filesystem, not the processes.
    sandbox.write_file("/root/kept.txt", b"survives pause\n")
    sandbox.cmd("sh -c 'echo gone > /tmp/in-memory-marker'")
    paused = client.sandboxes.pause_and_wait(sandbox.id)
    assert paused.status.value == "paused" and paused.paused and paused.runtime_id == ""
    assert client.sandboxes.status(sandbox.id).status.value == "paused"
    assert sandbox.id in [s.id for s in client.sandboxes.list(paused=True)]
    # Without auto_resume, a paused sandbox answers instead of waking up.
    try:
        sandbox.cmd("true")
        raise AssertionError("a paused sandbox without auto_resume ran a command")
    except APIError as e:
        assert e.status_code == 409, e

    resumed = client.sandboxes.resume_and_wait(sandbox.id)
    assert resumed.status.value == "running" and resumed.runtime_generation > paused.runtime_generation
    assert sandbox.read_file("/root/kept.txt") == b"survives pause\n"

    # Memory: CPU follows it; the sandbox keeps its id and files.
    resized = client.update_sandbox_memory(sandbox.id, "2Gi") if hasattr(client, "update_sandbox_memory") else \
        client.sandboxes.update(sandbox.id, SandboxUpdateRequest(config=SandboxUpdateConfig.from_dict({"resources": {"memory": "2Gi"}})))
    assert resized.resources.memory == "2048Mi", resized.resources
    assert resized.status.value == "running"
    assert sandbox.read_file("/root/kept.txt") == b"survives pause\n"
finally:
    client.sandboxes.delete(sandbox.id)

try:
    client.sandboxes.get(sandbox.id)
    raise AssertionError("a deleted sandbox was found")
except APIError as e:
    assert e.status_code == 404 and e.code == "not_found", e
# The soft TTL pauses (the root filesystem kept), the hard TTL deletes: waited for with the
# SDK's own lifecycle wait.
short = client.sandboxes.claim("default", config=SandboxConfig(ttl=2, hard_ttl=8))
short.write_file("/root/ttl.txt", b"kept")
paused = client.sandboxes.wait_for_lifecycle(
    short.id, lambda s: s.status.value == "paused", timeout_sec=60, poll_interval_sec=0.2)
assert paused.paused and paused.expires_at is None, paused
# auto_resume: a file read wakes it, with its root filesystem.
assert short.read_file("/root/ttl.txt") == b"kept"
assert client.sandboxes.status(short.id).status.value == "running"
try:
    client.sandboxes.wait_for_lifecycle(short.id, lambda s: False, timeout_sec=60, poll_interval_sec=0.2)
    raise AssertionError("the hard TTL did not delete the sandbox")
except APIError as e:
    assert e.status_code == 404, e
print("lifecycle: ok")
