// The JS SDK README's first steps: create a sandbox, run a command (and see a failing one
// throw with its exit code), write and read a file, list the sandbox, kill it.
import assert from 'node:assert/strict'
import { CommandExitError, Sandbox } from 'e2b'

const sbx = await Sandbox.create({ metadata: { suite: 'e2b-js' } })
try {
  const result = await sbx.commands.run('echo hello && echo oops >&2')
  assert.equal(result.exitCode, 0)
  assert.equal(result.stdout, 'hello\n')
  assert.equal(result.stderr, 'oops\n')
  await assert.rejects(sbx.commands.run('exit 4'), (e) => e instanceof CommandExitError && e.exitCode === 4)

  await sbx.files.write('/home/user/hello.txt', 'Hello from JS')
  assert.equal(await sbx.files.read('/home/user/hello.txt'), 'Hello from JS')
  const entries = await sbx.files.list('/home/user')
  assert.ok(entries.some((e) => e.name === 'hello.txt'))

  const page = await Sandbox.list({ query: { metadata: { suite: 'e2b-js' } } }).nextItems()
  assert.deepEqual(page.map((s) => s.sandboxId), [sbx.sandboxId])
} finally {
  await sbx.kill()
}
assert.equal(await Sandbox.kill(sbx.sandboxId), false)
console.log('ok')
