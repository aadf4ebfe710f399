// The SDK reference's basic workflow, on the python3.13 runtime (CI builds no node image;
// node24.mjs is the same with node24 and runs where that image is built).
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
assert.match(sandbox.sandboxId, /^sbx_/);
assert.equal(sandbox.status, 'running');
assert.ok(sandbox.timeout > 0);
assert.ok(sandbox.createdAt instanceof Date && sandbox.createdAt.getTime() <= Date.now());
await sandbox.stop();
