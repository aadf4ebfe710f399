// The snapshots document's retention, as it writes it: `sandbox.update({ snapshotExpiration,
// keepLastSnapshots })` on a persistent sandbox, which then reports both; every stop of a
// session adds a snapshot, and only the newest `count` of them are kept, with the kept ones'
// expiration.
import assert from 'node:assert/strict';
import { Sandbox, Snapshot } from '@vercel/sandbox';

const day = 24 * 60 * 60 * 1000;
const name = `retention-${process.pid}-${Date.now()}`;
const sandbox = await Sandbox.create({ name, runtime: 'node24' });
await sandbox.update({
  snapshotExpiration: 7 * day,
  keepLastSnapshots: { count: 1, expiration: 30 * day },
});
assert.equal(sandbox.snapshotExpiration, 7 * day);
const got = await Sandbox.get({ name });
assert.equal(got.snapshotExpiration, 7 * day);
assert.equal(got.keepLastSnapshots?.count, 1);
assert.equal(got.keepLastSnapshots?.expiration, 30 * day);

// Two sessions, two stops, two automatic snapshots: the older one is evicted.
await sandbox.writeFiles([{ path: 'one.txt', content: Buffer.from('first session') }]);
await sandbox.stop();
const second = await Sandbox.get({ name, resume: true });
await second.writeFiles([{ path: 'two.txt', content: Buffer.from('second session') }]);
await second.stop();

const snapshots = await (await Snapshot.list({ name })).toArray();
const kept = snapshots.filter((s) => s.status === 'created');
assert.equal(kept.length, 1, JSON.stringify(snapshots));
assert.ok(kept[0].expiresAt > Date.now() + 29 * day, `expires at ${kept[0].expiresAt}`);

// The kept snapshot is the newest: both sessions' files are in it.
const third = await Sandbox.get({ name, resume: true });
assert.equal((await third.readFileToBuffer({ path: 'one.txt' })).toString(), 'first session');
assert.equal((await third.readFileToBuffer({ path: 'two.txt' })).toString(), 'second session');

// Bad retention is refused with its code, changing nothing.
await assert.rejects(
  third.update({ keepLastSnapshots: { count: 11 } }),
  (e) => e.json?.error?.code === 'bad_request',
);
assert.equal((await Sandbox.get({ name })).keepLastSnapshots?.count, 1);
await third.stop();
await third.delete();
