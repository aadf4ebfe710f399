// Files: mkDir, writeFiles (with mode), readFile, readFileToBuffer (null when missing),
// downloadFile, relative paths under /vercel/sandbox.
import assert from 'node:assert/strict';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Sandbox } from '@vercel/sandbox';

const sandbox = await Sandbox.create({ runtime: 'node24' });
const local = await mkdtemp(join(tmpdir(), 'belljar-compat-'));
try {
  await sandbox.mkDir('assets');
  await sandbox.writeFiles([{ path: 'hello.txt', content: Buffer.from('hi') }]);
  await sandbox.writeFiles([
    { path: 'run.sh', content: Buffer.from('#!/bin/bash\necho "Hello"'), mode: 0o755 },
    { path: 'assets/data.bin', content: Buffer.from([0, 1, 2, 255]) },
    { path: '/tmp/abs.txt', content: Buffer.from('absolute') },
  ]);

  const run = await sandbox.runCommand('./run.sh');
  assert.equal(await run.stdout(), 'Hello\n');
  const ls = await sandbox.runCommand('stat', ['-c', '%U %a %n', 'hello.txt', 'run.sh', 'assets']);
  assert.equal(await ls.stdout(), 'vercel-sandbox 644 hello.txt\nvercel-sandbox 755 run.sh\nvercel-sandbox 755 assets\n');

  const buffer = await sandbox.readFileToBuffer({ path: 'hello.txt' });
  assert.equal(buffer.toString(), 'hi');
  const bin = await sandbox.readFileToBuffer({ path: 'data.bin', cwd: '/vercel/sandbox/assets' });
  assert.deepEqual([...bin], [0, 1, 2, 255]);
  assert.equal((await sandbox.readFileToBuffer({ path: '/tmp/abs.txt' })).toString(), 'absolute');
  assert.equal(await sandbox.readFileToBuffer({ path: 'missing.txt' }), null);
  assert.equal(await sandbox.readFile({ path: 'missing.txt' }), null);

  const stream = await sandbox.readFile({ path: 'hello.txt' });
  let text = '';
  for await (const chunk of stream) text += chunk;
  assert.equal(text, 'hi');

  const dstPath = await sandbox.downloadFile(
    { path: 'hello.txt', cwd: '/vercel/sandbox' },
    { path: 'nested/local-hello.txt', cwd: local },
    { mkdirRecursive: true },
  );
  assert.equal(dstPath, join(local, 'nested/local-hello.txt'));
  assert.equal(await readFile(dstPath, 'utf8'), 'hi');
  assert.equal(await sandbox.downloadFile({ path: 'missing' }, { path: join(local, 'x') }), null);
} finally {
  await rm(local, { recursive: true, force: true });
  await sandbox.stop();
}
