// 3.x persistent sandboxes (Vercel's default): a stop snapshots the files and the next use
// resumes the same sandbox from that snapshot, whether by a command (the SDK resumes on the
// stopped session's 410) or by Sandbox.get({ resume: true }). A non-persistent one resumes
// into a new, clean session. A sandbox the daemon paused (idle timeout, `belljar pause`) is
// `running` to the SDK, and its next command resumes it.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { Sandbox } from '@vercel/sandbox';

const name = `persist-${process.pid}-${Date.now()}`;
const sandbox = await Sandbox.create({ name, runtime: 'node24' });
assert.equal(sandbox.persistent, true);
await sandbox.writeFiles([{ path: 'kept.txt', content: Buffer.from('across sessions') }]);
await sandbox.stop();

const stopped = await Sandbox.get({ name });
assert.equal(stopped.status, 'stopped');
const read = await stopped.runCommand('cat', ['kept.txt']);
assert.equal(await read.stdout(), 'across sessions');
assert.equal(stopped.status, 'running');
await stopped.stop();

let resumed = 0;
const again = await Sandbox.get({ name, resume: true, onResume: () => { resumed += 1; } });
assert.equal(resumed, 1);
assert.equal(again.status, 'running');
assert.equal((await again.readFileToBuffer({ path: 'kept.txt' })).toString(), 'across sessions');

// Paused by the daemon: still `running` to the SDK, and a command resumes it.
execFileSync(process.env.BELLJAR_CLI, ['pause', again.currentSession().sessionId], { stdio: 'inherit' });
const paused = await Sandbox.get({ name });
assert.equal(paused.status, 'running');
assert.equal(await (await paused.runCommand('echo', ['awake'])).stdout(), 'awake\n');

// Persistence is fixed at creation: changing it is refused, repeating it is not.
await assert.rejects(again.update({ persistent: false }), (e) => e.json?.error?.code === 'not_implemented');
await again.update({ persistent: true });
await again.stop();
await again.delete();

// persistent: false: the resumed session starts from the image, without the old files.
const plain = await Sandbox.create({ name: `${name}-plain`, runtime: 'node24', persistent: false });
assert.equal(plain.persistent, false);
await plain.writeFiles([{ path: 'kept.txt', content: Buffer.from('gone') }]);
await plain.stop();
const fresh = await plain.runCommand('test', ['-e', 'kept.txt']);
assert.equal(fresh.exitCode, 1);
await plain.stop();
await plain.delete();
