// The SDK reference's basic workflow exactly as written (runtime node24), then checks of what
// it printed and of the sandbox properties the reference documents.
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
assert.match(sandbox.sandboxId, /^sbx_/);
assert.equal(sandbox.status, 'running');
assert.ok(sandbox.timeout > 0);
assert.ok(sandbox.createdAt instanceof Date && sandbox.createdAt.getTime() <= Date.now());
await sandbox.stop();

// The reference's create with options, as written.
const configured = await Sandbox.create({
  runtime: 'node24',
  networkPolicy: 'deny-all',
  env: { NODE_ENV: 'production' },
});
assert.equal(configured.networkPolicy, 'deny-all');
const env = await configured.runCommand('node', ['-e', 'console.log(process.env.NODE_ENV)']);
assert.equal(await env.stdout(), 'production\n');
await configured.stop();
