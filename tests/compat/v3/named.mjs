// 3.x named sandboxes: create with a name, get by name, list (paginated), sessions, update
// tags, extendTimeout, fork, snapshots with keepLastSnapshots, resume after stop, delete,
// and what has no counterpart yet failing clearly.
import assert from 'node:assert/strict';
import { Sandbox, Snapshot } from '@vercel/sandbox';

const name = `compat-${process.pid}-${Date.now()}`;
const sandbox = await Sandbox.create({
  name,
  runtime: 'node24',
  persistent: false,
  tags: { suite: 'compat' },
  keepLastSnapshots: { count: 2 },
  timeout: 120_000,
});
assert.equal(sandbox.name, name);
await assert.rejects(Sandbox.create({ name, runtime: 'node24' }), (e) => e.response?.status === 409);

const got = await Sandbox.get({ name });
assert.equal(got.name, name);
assert.equal(got.status, 'running');
await got.writeFiles([{ path: 'note.txt', content: Buffer.from('forked?') }]);

const page = await Sandbox.list({ limit: 1 });
assert.equal(page.sandboxes.length, 1);
const names = (await Sandbox.list({ tags: { suite: 'compat' } }).then((p) => p.toArray())).map((s) => s.name);
assert.ok(names.includes(name), names);

await got.update({ tags: { suite: 'compat', extra: 'yes' } });
assert.equal(got.tags.extra, 'yes');
await got.extendTimeout(60_000);

// fork: a new sandbox with the source's files.
const child = await Sandbox.fork({ sourceSandbox: name, name: `${name}-fork` });
try {
  assert.equal((await child.readFileToBuffer({ path: 'note.txt' })).toString(), 'forked?');
  assert.equal(await (await child.runCommand('id', ['-un'])).stdout(), 'vercel-sandbox\n');
} finally {
  await child.stop();
  await child.delete();
}

const snapshot = await got.snapshot();
assert.equal(snapshot.status, 'created');
assert.equal((await Snapshot.get({ snapshotId: snapshot.snapshotId })).snapshotId, snapshot.snapshotId);
const snaps = await got.listSnapshots();
assert.ok(snaps.snapshots.some((s) => s.id === snapshot.snapshotId));
await snapshot.delete();

// The session stopped with the snapshot; running a command resumes a new session.
const sessionsBefore = (await got.listSessions()).sessions.length;
const after = await got.runCommand('echo', ['resumed']);
assert.equal(await after.stdout(), 'resumed\n');
assert.equal((await got.listSessions()).sessions.length, sessionsBefore + 1);

await assert.rejects(got.update({ persistent: true }), (e) => e.json?.error?.code === 'not_implemented');
await got.update({ networkPolicy: { allow: ['example.com'], subnets: { deny: ['10.0.0.0/8'] } } });
assert.deepEqual(got.networkPolicy, { allow: ['example.com'], subnets: { deny: ['10.0.0.0/8'] } });
await assert.rejects(
  got.updateNetworkPolicy({ allow: { 'a.example': [{ forwardURL: 'http://127.0.0.1:1' }] } }),
  (e) => e.json?.error?.code === 'not_implemented',
);
await got.stop();
await got.delete();
// Every session of the name goes with it.
await assert.rejects(Sandbox.get({ name }), (e) => e.response?.status === 404);

// getOrCreate: creates when the name is free, gets it afterwards.
let created = 0;
const first = await Sandbox.getOrCreate({ name, runtime: 'node24', onCreate: () => { created += 1; } });
const second = await Sandbox.getOrCreate({ name, runtime: 'node24', onCreate: () => { created += 1; } });
assert.equal(created, 1);
assert.equal(second.name, first.name);
await second.stop();
await second.delete();
