"""Network policy, services and rootfs snapshots as the SDK documents them: a block-all
policy at the claim (no egress, checked from inside), the policy read and replaced, a service
exposing a port reachable on this machine, named snapshots of a running and of a paused
sandbox, a claim from a snapshot, a fork, and the refusals for what has no counterpart."""
import os
import urllib.request

from sandbox0 import APIError, Client
from sandbox0.apispec.models.create_sandbox_root_fs_snapshot_request import (
    CreateSandboxRootFSSnapshotRequest,
)
from sandbox0.apispec.models.fork_sandbox_config import ForkSandboxConfig
from sandbox0.apispec.models.fork_sandbox_request import ForkSandboxRequest
from sandbox0.apispec.models.restore_sandbox_root_fs_request import RestoreSandboxRootFSRequest
from sandbox0.apispec.models.sandbox_app_service import SandboxAppService
from sandbox0.apispec.models.sandbox_config import SandboxConfig
from sandbox0.apispec.models.sandbox_network_policy import SandboxNetworkPolicy

client = Client(token=os.environ["SANDBOX0_TOKEN"], base_url=os.environ["SANDBOX0_BASE_URL"])


def api_error(fn, status):
    try:
        fn()
    except APIError as e:
        assert e.status_code == status, (e, status)
        return e
    raise AssertionError(f"expected APIError {status}")


made = []
config = SandboxConfig.from_dict({"network": {"mode": "block-all"}})
sandbox = client.sandboxes.claim("python3.13", config=config)
made.append(sandbox.id)
try:
    policy = sandbox.get_network_policy()
    assert policy.mode.value == "block-all", policy
    r = sandbox.cmd("python3 -c \"import socket; socket.getaddrinfo('example.com', 443)\"")
    assert r.exit_code != 0, r

    policy = sandbox.update_network_policy(SandboxNetworkPolicy.from_dict(
        {"mode": "block-all", "egress": {"allowedDomains": ["example.com"], "allowedCidrs": ["192.0.2.0/24"]}}))
    assert policy.egress.allowed_domains == ["example.com"], policy
    assert policy.egress.allowed_cidrs == ["192.0.2.0/24"], policy
    policy = sandbox.update_network_policy(SandboxNetworkPolicy.from_dict({"mode": "allow-all"}))
    assert policy.mode.value == "allow-all"
    api_error(lambda: sandbox.update_network_policy(SandboxNetworkPolicy.from_dict(
        {"mode": "allow-all", "egress": {"deniedDomains": ["example.com"]}})), 501)

    # A service: the sandbox's port 8000, reachable at its public_url on this machine.
    sandbox.cmd("sh -c 'mkdir -p /srv && echo served > /srv/index.html'")
    sandbox.cmd("python3 -m http.server 8000 --directory /srv", __import__("sandbox0").CmdOptions(wait=False))
    services = sandbox.update_services([SandboxAppService.from_dict(
        {"id": "web", "port": 8000, "display_name": "Web", "ingress": {"public": True}})])
    [web] = services.services
    assert (web.id, web.port, web.publishable) == ("web", 8000, True), web
    assert web.public_url.startswith("http://127.0.0.1:"), web.public_url
    import time
    for _ in range(100):
        try:
            body = urllib.request.urlopen(web.public_url + "index.html", timeout=5).read()
            break
        except OSError:
            time.sleep(0.1)
    assert body == b"served\n", body
    assert [s.id for s in client.sandboxes.get(sandbox.id).services] == ["web"]
    assert sandbox.clear_services().services == []
    api_error(lambda: sandbox.update_services([SandboxAppService.from_dict(
        {"id": "Bad_Id", "port": 80, "ingress": {"public": True}})]), 400)

    # Snapshots: of the running sandbox, then of the paused one.
    sandbox.write_file("/root/state.txt", b"one")
    snap = client.sandboxes.create_rootfs_snapshot(
        sandbox.id, CreateSandboxRootFSSnapshotRequest(name="first", description="state one"))
    assert (snap.sandbox_id, snap.name, snap.description) == (sandbox.id, "first", "state one"), snap
    assert client.sandboxes.get_rootfs_snapshot(snap.id).name == "first"

    sandbox.write_file("/root/state.txt", b"two")
    client.sandboxes.pause_and_wait(sandbox.id)
    paused_snap = client.sandboxes.create_rootfs_snapshot(sandbox.id)
    ids = [s.id for s in client.sandboxes.list_rootfs_snapshots(sandbox.id)]
    assert snap.id in ids and paused_snap.id in ids, ids

    # A fork of the paused sandbox has its files; so has a claim from the first snapshot.
    fork = client.sandboxes.fork(sandbox.id, ForkSandboxRequest(config=ForkSandboxConfig(ttl=120)))
    made.append(fork.sandbox.id)
    assert fork.source_sandbox_id == sandbox.id and fork.sandbox.id != sandbox.id
    forked = client.sandbox(fork.sandbox.id)
    assert forked.read_file("/root/state.txt") == b"two"
    assert fork.sandbox.expires_at is not None

    restored = client.sandboxes.claim("python3.13", snapshot_id=snap.id)
    made.append(restored.id)
    assert restored.read_file("/root/state.txt") == b"one"

    api_error(lambda: client.sandboxes.restore_rootfs(
        sandbox.id, RestoreSandboxRootFSRequest(snapshot_id=snap.id)), 501)
    client.sandboxes.delete_rootfs_snapshot(snap.id)
    api_error(lambda: client.sandboxes.get_rootfs_snapshot(snap.id), 404)
    api_error(lambda: client.sandboxes.get_rootfs_snapshot("snap_nosuchsnapshot"), 404)
finally:
    for sid in made:
        client.sandboxes.delete(sid)
print("network: ok")
