// Snapshots: snapshot() stops the sandbox, Snapshot.get/list, a sandbox from a snapshot,
// snapshot.delete().
import assert from 'node:assert/strict';
import { Sandbox, Snapshot } from '@vercel/sandbox';

const sandbox = await Sandbox.create({ runtime: 'node24' });
await sandbox.writeFiles([{ path: 'state.txt', content: Buffer.from('kept') }]);
const snapshot = await sandbox.snapshot({ expiration: 14 * 24 * 3600 * 1000 });
console.log(snapshot.snapshotId);
assert.equal(snapshot.status, 'created');
assert.equal(snapshot.sourceSandboxId, sandbox.sandboxId);
assert.ok(snapshot.expiresAt instanceof Date);
assert.notEqual(sandbox.status, 'running');

const fetched = await Snapshot.get({ snapshotId: snapshot.snapshotId });
assert.equal(fetched.snapshotId, snapshot.snapshotId);
const { json: { snapshots } } = await Snapshot.list();
assert.ok(snapshots.some((s) => s.id === snapshot.snapshotId));

// Later, create a new sandbox from the snapshot
const newSandbox = await Sandbox.create({
  source: { type: 'snapshot', snapshotId: snapshot.snapshotId },
});
try {
  assert.equal((await newSandbox.readFileToBuffer({ path: 'state.txt' })).toString(), 'kept');
  const who = await newSandbox.runCommand('id', ['-un']);
  assert.equal(await who.stdout(), 'vercel-sandbox\n');
} finally {
  await newSandbox.stop();
}
await newSandbox.stop();
const kept = await Snapshot.get({ snapshotId: snapshot.snapshotId });
await kept.delete();
assert.equal(kept.status, 'deleted');
