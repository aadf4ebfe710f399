// 3.x files: the same calls as 1.x, through sessions.
import assert from 'node:assert/strict';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Sandbox } from '@vercel/sandbox';

const sandbox = await Sandbox.create({ runtime: 'node24' });
const local = await mkdtemp(join(tmpdir(), 'belljar-compat-'));
try {
  await sandbox.mkDir('assets');
  await sandbox.writeFiles([
    { path: 'run.sh', content: Buffer.from('#!/bin/bash\necho "Hello"'), mode: 0o755 },
    { path: 'assets/data.bin', content: Buffer.from([0, 1, 2, 255]) },
  ]);
  assert.equal(await (await sandbox.runCommand('./run.sh')).stdout(), 'Hello\n');
  const ls = await sandbox.runCommand('stat', ['-c', '%U %a %n', 'run.sh', 'assets']);
  assert.equal(await ls.stdout(), 'vercel-sandbox 755 run.sh\nvercel-sandbox 755 assets\n');
  assert.deepEqual([...(await sandbox.readFileToBuffer({ path: 'assets/data.bin' }))], [0, 1, 2, 255]);
  assert.equal(await sandbox.readFileToBuffer({ path: 'missing.txt' }), null);
  const dst = await sandbox.downloadFile({ path: 'run.sh' }, { path: join(local, 'run.sh') });
  assert.equal(await readFile(dst, 'utf8'), '#!/bin/bash\necho "Hello"');
} finally {
  await rm(local, { recursive: true, force: true });
  await sandbox.stop();
}
