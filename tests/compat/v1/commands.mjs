// Command and CommandFinished: detached runs, logs(), wait(), output(), kill(), getCommand(),
// cwd, env, sudo and the stdout/stderr writables, as the reference shows them.
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { Sandbox } from '@vercel/sandbox';

const sandbox = await Sandbox.create({ runtime: 'node24', env: { GREETING: 'hello' } });
try {
  // Environment defaults, per-command overrides, the user and the working directory.
  const who = await sandbox.runCommand({
    cmd: 'sh',
    args: ['-c', 'echo "$GREETING $OTHER"; id -un; pwd; echo err >&2'],
    env: { OTHER: 'world' },
  });
  assert.equal(who.exitCode, 0);
  assert.equal(await who.stdout(), 'hello world\nvercel-sandbox\n/vercel/sandbox\n');
  assert.equal(await who.stderr(), 'err\n');
  assert.equal(who.cwd, '/vercel/sandbox');
  assert.ok(Date.now() - who.startedAt < 60_000);
  const both = await who.output('both');
  assert.ok(both.includes('hello world') && both.includes('err'));

  // Sudo runs as root; cwd is honoured.
  const root = await sandbox.runCommand({ cmd: 'sh', args: ['-c', 'id -un; pwd'], sudo: true, cwd: '/tmp' });
  assert.equal(await root.stdout(), 'root\n/tmp\n');

  // Non-zero exit codes come back as they are.
  const failed = await sandbox.runCommand('sh', ['-c', 'exit 3']);
  assert.equal(failed.exitCode, 3);

  // stdout/stderr writables receive the output as it is produced.
  let streamed = '';
  const sink = new Writable({ write(chunk, _enc, cb) { streamed += chunk; cb(); } });
  await sandbox.runCommand({ cmd: 'sh', args: ['-c', 'echo one; echo two >&2'], stdout: sink, stderr: sink });
  assert.ok(streamed.includes('one') && streamed.includes('two'), streamed);

  // Detached: logs() streams while it runs, wait() gives the exit code.
  const detachedCmd = await sandbox.runCommand({
    cmd: 'sh',
    args: ['-c', 'for i in 1 2 3; do echo line $i; sleep 0.2; done'],
    detached: true,
  });
  assert.equal(detachedCmd.exitCode, null);
  const lines = [];
  for await (const log of detachedCmd.logs()) {
    if (log.stream === 'stdout') lines.push(log.data);
  }
  assert.equal(lines.join(''), 'line 1\nline 2\nline 3\n');
  const result = await detachedCmd.wait();
  assert.equal(result.exitCode, 0);

  // getCommand() finds it again by id.
  const again = await sandbox.getCommand(detachedCmd.cmdId);
  assert.equal(again.cmdId, detachedCmd.cmdId);
  assert.equal(await again.stdout(), 'line 1\nline 2\nline 3\n');

  // kill() ends a long-running command.
  const sleeper = await sandbox.runCommand({ cmd: 'sleep', args: ['600'], detached: true });
  await sleeper.kill('SIGKILL');
  const killed = await sleeper.wait();
  assert.equal(killed.exitCode, 128 + 9);
} finally {
  await sandbox.stop();
}
