// The SDK reference's basic workflow as written (runtime node24) with the 3.x SDK, plus 3.x's
// named sandboxes and sessions.
import assert from 'node:assert/strict';
import { Sandbox } from '@vercel/sandbox';

// 1. Create a sandbox
const sandbox = await Sandbox.create({ runtime: 'node24' });

// 2. Run a command - it waits for completion and returns the result
const result = await sandbox.runCommand('node', ['--version']);

// 3. Check the result
console.log(result.exitCode); // 0
console.log(await result.stdout()); // v22.x.x

assert.equal(result.exitCode, 0);
assert.match(await result.stdout(), /^v24\./);
assert.equal(sandbox.status, 'running');
assert.equal(sandbox.persistent, true); // Vercel's default
assert.equal(sandbox.cwd, '/vercel/sandbox');
assert.ok(sandbox.name);
const session = await sandbox.stop();
assert.equal(session.status, 'stopped');
