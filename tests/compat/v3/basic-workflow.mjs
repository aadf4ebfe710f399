// The SDK reference's basic workflow with the 3.x SDK, on the python3.13 runtime (CI builds
// no node image), plus 3.x's named sandboxes and sessions.
import assert from 'node:assert/strict';
import { Sandbox } from '@vercel/sandbox';

// 1. Create a sandbox
const sandbox = await Sandbox.create({ runtime: 'python3.13' });

// 2. Run a command - it waits for completion and returns the result
const result = await sandbox.runCommand('python3', ['--version']);

// 3. Check the result
console.log(result.exitCode); // 0
console.log(await result.stdout());

assert.equal(result.exitCode, 0);
assert.match(await result.stdout(), /^Python 3\.13/);
assert.equal(sandbox.status, 'running');
assert.equal(sandbox.persistent, false);
assert.equal(sandbox.cwd, '/vercel/sandbox');
assert.ok(sandbox.name);
const session = await sandbox.stop();
assert.equal(session.status, 'stopped');
