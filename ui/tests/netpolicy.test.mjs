// Unit tests of the Network tab's policy form (src/lib/netpolicy.ts): a policy read from the
// daemon becomes the form and back unchanged, redacted values go back as the marker the daemon
// swaps for its secret, and the as-you-type checks agree with the daemon's rules.
import { test } from "node:test";
import assert from "node:assert/strict";
import { build } from "esbuild";

const out = await build({
  entryPoints: [new URL("../src/lib/netpolicy.ts", import.meta.url).pathname],
  bundle: true, format: "esm", write: false, platform: "neutral",
});
const np = await import("data:text/javascript;base64," + Buffer.from(out.outputFiles[0].text).toString("base64"));

test("modes round-trip", () => {
  for (const p of ["allow-all", "deny-all"]) assert.deepEqual(np.fromForm(np.toForm(p)), p);
  assert.equal(np.toForm(undefined).mode, "allow-all");
});

test("rules round-trip: domains, subnets", () => {
  const p = { allow: ["a.test", "*.c.test"], subnets: { allow: ["203.0.113.0/24"], deny: ["203.0.113.9"] } };
  const f = np.toForm(p);
  assert.equal(f.mode, "rules");
  assert.equal(f.domains, "a.test\n*.c.test");
  assert.deepEqual(np.fromForm(f), p);
  assert.deepEqual(np.fromForm({ ...f, domains: "", subnetsAllow: "" }), { subnets: { allow: [], deny: ["203.0.113.9"] } });
});

test("brokered values stay redacted in their place unless typed anew", () => {
  const p = {
    allow: {
      "a.test": [],
      "api.test": [{ transform: [{ headers: { Authorization: "[redacted]" } }, { headers: { "X-Key": "[redacted]" } }] }],
    },
  };
  const f = np.toForm(p);
  assert.equal(f.domains, "a.test");
  assert.equal(f.brokered.length, 2);
  assert.ok(f.brokered.every((b) => b.value === "" && b.stored));
  assert.deepEqual(np.fromForm(f), p);
  f.brokered[1].value = "new-secret";
  f.brokered.push({ domain: "b.test", header: "Authorization", value: "Bearer x", rule: 0, transform: 0, stored: false });
  assert.deepEqual(np.fromForm(f), {
    allow: {
      "a.test": [],
      "api.test": [{ transform: [{ headers: { Authorization: "[redacted]" } }, { headers: { "X-Key": "new-secret" } }] }],
      "b.test": [{ transform: [{ headers: { Authorization: "Bearer x" } }] }],
    },
  });
});

test("domain patterns: Vercel's wildcards, the daemon's refusals", () => {
  for (const ok of ["example.com", "*.example.com", "www.*.com", "a_b.test", "example.com."]) assert.equal(np.domainProblem(ok), null, ok);
  for (const bad of ["*.*.com", "a..b", "*example.com", "example.*", "", ".a", "a b.com"]) assert.notEqual(np.domainProblem(bad), null, bad);
});

test("CIDRs: v4 and v6, with or without a prefix", () => {
  for (const ok of ["10.0.0.0/8", "203.0.113.9", "::1", "2001:db8::/64", "::ffff:127.0.0.1", "fe80::1/10"]) assert.equal(np.cidrProblem(ok), null, ok);
  for (const bad of ["10.0.0.0/33", "300.1.1.1", "10.0.0", "2001:db8::/129", "1::2::3", "x", "10.0.0.0/8/1"]) assert.notEqual(np.cidrProblem(bad), null, bad);
});

test("the form lists every mistake, and a new header needs a value", () => {
  const f = np.toForm({ allow: ["ok.test"] });
  f.domains += "\n*.*.com";
  f.subnetsDeny = "10.0.0.0/40";
  f.brokered.push({ domain: "api.test", header: "Bad Header", value: "", rule: 0, transform: 0, stored: false });
  const p = np.formProblems(f);
  assert.equal(p.length, 4, p.join("\n"));
  assert.match(p[0], /\*\.\*\.com/);
  assert.deepEqual(np.formProblems(np.toForm("deny-all")), []);
});
