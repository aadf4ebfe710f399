// Sandbox.get, Sandbox.list (since/until/limit and pagination), extendTimeout, stop (plain
// and blocking), updateNetworkPolicy, and what is not there yet failing clearly.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Sandbox } from '@vercel/sandbox';

const before = Date.now() - 1;
const a = await Sandbox.create({ runtime: 'node24', timeout: 120_000 });
const b = await Sandbox.create({ runtime: 'node24' });

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

// Network policies replace each other whole; answers name brokered headers, never values.
assert.equal(await a.updateNetworkPolicy('deny-all'), 'deny-all'); // Block all egress
const brokered = await a.updateNetworkPolicy({
  allow: { 'ai-gateway.vercel.sh': [{ transform: [{ headers: { 'x-api-key': 'secret-key' } }] }] },
  subnets: { deny: ['10.0.0.0/8'] },
});
console.log(JSON.stringify(brokered));
assert.deepEqual(Object.keys(brokered.allow), ['ai-gateway.vercel.sh']);
assert.deepEqual(brokered.subnets, { deny: ['10.0.0.0/8'] });
assert.ok(JSON.stringify(brokered).includes('x-api-key'));
assert.ok(!JSON.stringify(brokered).includes('secret-key'));
await a.updateNetworkPolicy('allow-all'); // Allow all egress from the sandbox
const denied = await Sandbox.create({ runtime: 'node24', networkPolicy: 'deny-all' });
assert.equal(denied.networkPolicy, 'deny-all');
await denied.stop();

// Ports: routes carry the forwarded local URL, and domain() returns it (the preload makes the
// SDK's domain() use it), so the program and curl both reach the sandbox's port.
const web = await Sandbox.create({ runtime: 'python3.13', ports: [3000] });
try {
  assert.equal(web.routes.length, 1);
  assert.equal(web.routes[0].port, 3000);
  assert.match(web.routes[0].url, /^http:\/\/127\.0\.0\.1:\d+$/);
  assert.equal(web.domain(3000), web.routes[0].url);
  assert.throws(() => web.domain(4000), /No route for port 4000/);
  await web.writeFiles([{ path: 'index.html', content: Buffer.from('served from the sandbox') }]);
  await web.runCommand({ cmd: 'python3', args: ['-m', 'http.server', '3000'], detached: true });
  let body = '';
  for (let i = 0; i < 100 && body === ''; i++) {
    try {
      body = await (await fetch(`${web.routes[0].url}/index.html`)).text();
    } catch {
      await new Promise((r) => setTimeout(r, 100)); // the server is still starting
    }
  }
  assert.equal(body, 'served from the sandbox');
  assert.equal(await (await fetch(`${web.domain(3000)}/index.html`)).text(), 'served from the sandbox');
  const curl = execFileSync('curl', ['-sS', '--fail', '--max-time', '30', `${web.domain(3000)}/index.html`]);
  assert.equal(curl.toString(), 'served from the sandbox');
} finally {
  await web.stop();
}

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
