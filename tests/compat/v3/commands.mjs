// 3.x commands: waited runs (output streamed with the answer), detached runs with logs(),
// wait(), kill(), getCommand(), the stdout/stderr writables, sudo, cwd and env.
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { Sandbox } from '@vercel/sandbox';

const sandbox = await Sandbox.create({ runtime: 'node24', env: { GREETING: 'hello' }, ports: [3000] });
try {
  // domain() is the forwarded local URL under `belljar vercel` (the 3.x session's own code).
  assert.match(sandbox.domain(3000), /^http:\/\/127\.0\.0\.1:\d+$/);

  let streamed = '';
  const sink = new Writable({ write(chunk, _enc, cb) { streamed += chunk; cb(); } });
  const who = await sandbox.runCommand({
    cmd: 'sh',
    args: ['-c', 'echo "$GREETING $OTHER"; id -un; pwd; echo err >&2'],
    env: { OTHER: 'world' },
    stdout: sink,
    stderr: sink,
  });
  assert.equal(who.exitCode, 0);
  assert.equal(await who.stdout(), 'hello world\nvercel-sandbox\n/vercel/sandbox\n');
  assert.equal(await who.stderr(), 'err\n');
  assert.ok(streamed.includes('hello world') && streamed.includes('err'), streamed);

  const root = await sandbox.runCommand({ cmd: 'sh', args: ['-c', 'id -un; pwd'], sudo: true, cwd: '/tmp' });
  assert.equal(await root.stdout(), 'root\n/tmp\n');
  assert.equal((await sandbox.runCommand('sh', ['-c', 'exit 3'])).exitCode, 3);

  const detached = await sandbox.runCommand({
    cmd: 'sh',
    args: ['-c', 'for i in 1 2 3; do echo line $i; sleep 0.2; done'],
    detached: true,
  });
  const lines = [];
  for await (const log of detached.logs()) lines.push(log.data);
  assert.equal(lines.join(''), 'line 1\nline 2\nline 3\n');
  assert.equal((await detached.wait()).exitCode, 0);
  const again = await sandbox.getCommand(detached.cmdId);
  assert.equal(await again.stdout(), 'line 1\nline 2\nline 3\n');

  const sleeper = await sandbox.runCommand({ cmd: 'sleep', args: ['600'], detached: true });
  await sleeper.kill('SIGKILL');
  assert.equal((await sleeper.wait()).exitCode, 137);

  // A command timeout kills it.
  const slow = await sandbox.runCommand('sleep', ['600'], { timeoutMs: 300 });
  assert.equal(slow.exitCode, 137);
} finally {
  await sandbox.stop();
}
