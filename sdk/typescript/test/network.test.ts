// The network through the SDK against a real daemon: a policy set at create and replaced while
// the sandbox runs (deny-all stops DNS), the flow log, and an exposed port reached from the
// host.

import assert from "node:assert/strict";
import { connect } from "node:net";
import { after, before, test } from "node:test";

import { BelljarError, Sandbox, toSandboxSession } from "../src/index.js";

let sbx: Sandbox;

before(async () => {
  sbx = await Sandbox.create({ network_policy: "deny-all", tags: { suite: `net-${process.pid}` }, timeout_ms: 600_000 });
});

after(async () => {
  await sbx.delete();
});

test("a policy set at create, replaced while running", async () => {
  assert.equal(sbx.data.network_policy, "deny-all");
  assert.equal((await sbx.network.info()).policy, "deny-all");
  assert.notEqual((await sbx.runCommand("getent", ["hosts", "a.test"])).exitCode, 0);
  const rules = { subnets: { allow: ["203.0.113.0/24"], deny: ["203.0.113.9"] } };
  await sbx.network.setPolicy(rules);
  assert.deepEqual(sbx.data.network_policy, rules);
  assert.deepEqual((await sbx.network.info()).policy, rules);
  const flows = [];
  for await (const f of sbx.network.flows()) flows.push(f);
  assert.ok(flows.every((f) => f.verdict === "allowed" || f.verdict === "denied"));
  await assert.rejects(sbx.network.setPolicy({ subnets: { allow: ["not-a-cidr"], deny: [] } }), (e: unknown) => e instanceof BelljarError && e.code === "bad_request");
});

test("an exposed port reaches a server in the sandbox from the host", async () => {
  const port = await sbx.network.exposePort(8000);
  assert.equal(port.port, 8000);
  assert.deepEqual((await sbx.network.ports()).map((p) => p.port), [8000]);
  const server = await sbx.runCommand({
    cmd: "perl",
    args: ["-MIO::Socket::INET", "-e", '$|=1; $s=IO::Socket::INET->new(LocalPort=>8000,Listen=>5,ReuseAddr=>1) or die; print "listening\\n"; while($c=$s->accept){print $c "from-sandbox\\n"; close $c}'],
    detached: true,
  });
  // Connect once the server says it listens.
  for await (const c of server.logs({ follow: true })) if (c.data.toString().includes("listening")) break;
  const text = await new Promise<string>((resolve, reject) => {
    let got = "";
    const s = connect(port.host_port, "127.0.0.1");
    s.on("data", (d) => (got += d.toString()));
    s.on("end", () => resolve(got));
    s.on("error", reject);
  });
  assert.equal(text, "from-sandbox\n");
  // The AI SDK session tells the model about the port and the policy.
  const described = toSandboxSession(sbx, { network: await sbx.network.info() }).description;
  assert.match(described, new RegExp(`8000 -> ${port.url.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}`));
  assert.match(described, /Network policy: \{"subnets"/);
  await server.kill("KILL");
  await sbx.network.removePort(8000);
  assert.deepEqual(await sbx.network.ports(), []);
});
