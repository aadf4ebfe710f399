// Sandbox.get, Sandbox.list (since/until/limit and pagination), extendTimeout, stop (plain
// and blocking), updateNetworkPolicy, and what is not there yet failing clearly.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Sandbox } from '@vercel/sandbox';

const before = Date.now() - 1;
const a = await Sandbox.create({ runtime: 'python3.13', timeout: 120_000 });
const b = await Sandbox.create({ runtime: 'python3.13' });

const got = await Sandbox.get({ sandboxId: a.sandboxId });
assert.equal(got.sandboxId, a.sandboxId);
assert.equal(got.status, 'running');
assert.equal(got.timeout, 120_000);

await got.extendTimeout(60000); // Extend by 60 seconds
assert.equal(got.timeout, 180_000);

// Newest first, one per page; pagination.next is the `until` of the next page.
const { json: { sandboxes, pagination } } = await Sandbox.list({ since: before, limit: 1 });
assert.equal(sandboxes.length, 1);
assert.equal(sandboxes[0].id, b.sandboxId);
assert.notEqual(pagination.next, null);
const second = await Sandbox.list({ since: before, until: pagination.next, limit: 1 });
assert.equal(second.json.sandboxes[0].id, a.sandboxId);
const all = await Sandbox.list({ since: new Date(before) });
assert.deepEqual(all.json.sandboxes.map((s) => s.id), [b.sandboxId, a.sandboxId]);
assert.equal(all.json.pagination.next, null);

await a.updateNetworkPolicy('allow-all');
await assert.rejects(a.updateNetworkPolicy('deny-all'), (e) => e.json?.error?.code === 'not_implemented');
await assert.rejects(
  Sandbox.create({ runtime: 'python3.13', ports: [3000] }),
  (e) => e.json?.error?.code === 'not_implemented',
);
assert.throws(() => a.domain(3000), /No route for port 3000/);

// Trigger sandbox shutdown asynchronously
await b.stop();
// Trigger sandbox shutdown synchronously.
const stoppedSandbox = await a.stop({ blocking: true });
assert.equal(stoppedSandbox.status, 'stopped');
await a.stop(); // safe to call again
await assert.rejects(Sandbox.get({ sandboxId: 'sbx_doesnotexist' }), (e) => e.response?.status === 404);
await assert.rejects(a.runCommand('true'), (e) => e.json?.error?.code === 'sandbox_stopped');

// A git source is cloned into the working directory, owned by the sandbox's user.
const repo = mkdtempSync(join(tmpdir(), 'belljar-compat-repo-'));
try {
  writeFileSync(join(repo, 'README.md'), 'hello from git\n');
  const git = (...args) => execFileSync('git', ['-C', repo, ...args], { stdio: 'pipe' });
  git('init', '-q');
  git('add', '.');
  git('-c', 'user.email=t@example.invalid', '-c', 'user.name=t', 'commit', '-qm', 'init');
  const cloned = await Sandbox.create({
    runtime: 'python3.13',
    source: { type: 'git', url: repo, depth: 1 },
    resources: { vcpus: 1 },
    timeout: 60_000,
  });
  const r = await cloned.runCommand('sh', ['-c', 'cat README.md; stat -c %U README.md']);
  assert.equal(await r.stdout(), 'hello from git\nvercel-sandbox\n');
  await cloned.stop();
} finally {
  rmSync(repo, { recursive: true, force: true });
}
