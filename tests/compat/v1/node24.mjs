// The SDK reference's basic workflow as written (runtime node24): needs the node24 image.
import assert from 'node:assert/strict';
import { Sandbox } from '@vercel/sandbox';

const sandbox = await Sandbox.create({ runtime: 'node24' });
const result = await sandbox.runCommand('node', ['--version']);
console.log(result.exitCode); // 0
console.log(await result.stdout()); // v24.x.x
assert.equal(result.exitCode, 0);
assert.match(await result.stdout(), /^v24\./);
await sandbox.stop();
