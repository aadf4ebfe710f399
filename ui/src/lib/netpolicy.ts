// A sandbox's NetworkPolicy as the Network tab edits it: text lists for domains and subnets,
// one row per brokered header, and the checks the editor runs as you type. The daemon checks
// again (crates/network's DomainPattern, CIDR parsing) and its 400 is what counts; these only
// point at a mistake before the round trip.

import type { DomainRule, NetworkPolicy } from "../generated/api";

/** What a brokered header's value reads as: values are write-only (crates/api REDACTED). Sent
 *  back unchanged, the daemon keeps the value it holds. */
export const REDACTED = "[redacted]";

/** One brokered header. `rule`/`transform` keep its place in the policy, so an unchanged
 *  (redacted) value finds its secret again on the daemon's side. An empty `value` keeps it. */
export interface BrokerRow {
  domain: string;
  header: string;
  value: string;
  rule: number;
  transform: number;
  /** Whether the daemon holds a value for it (it came from the policy). */
  stored: boolean;
}

export interface PolicyForm {
  mode: "allow-all" | "deny-all" | "rules";
  /** One domain pattern a line. */
  domains: string;
  /** One CIDR (or address) a line. */
  subnetsAllow: string;
  subnetsDeny: string;
  brokered: BrokerRow[];
}

const lines = (text: string) =>
  text
    .split("\n")
    .map((l) => l.trim())
    .filter(Boolean);

/** The form for a policy read from the daemon (brokered values arrive redacted). */
export function toForm(p: NetworkPolicy | undefined): PolicyForm {
  const form: PolicyForm = { mode: "allow-all", domains: "", subnetsAllow: "", subnetsDeny: "", brokered: [] };
  if (p === undefined || p === "allow-all" || p === "deny-all") {
    form.mode = p ?? "allow-all";
    return form;
  }
  form.mode = "rules";
  const domains: string[] = [];
  if (Array.isArray(p.allow)) domains.push(...p.allow);
  else if (p.allow) {
    for (const [domain, rules] of Object.entries(p.allow)) {
      let headers = 0;
      (rules ?? []).forEach((r, rule) =>
        r.transform.forEach((t, transform) => {
          for (const header of Object.keys(t.headers)) {
            headers++;
            form.brokered.push({ domain, header, value: "", rule, transform, stored: true });
          }
        }),
      );
      if (headers === 0) domains.push(domain);
    }
  }
  form.domains = domains.join("\n");
  form.subnetsAllow = (p.subnets?.allow ?? []).join("\n");
  form.subnetsDeny = (p.subnets?.deny ?? []).join("\n");
  return form;
}

/** The policy to PATCH. Rows without a domain or header name are left out (the editor shows
 *  them as mistakes first). */
export function fromForm(f: PolicyForm): NetworkPolicy {
  if (f.mode !== "rules") return f.mode;
  const domains = lines(f.domains);
  const brokered = f.brokered.filter((b) => b.domain.trim() && b.header.trim());
  const allow = lines(f.subnetsAllow);
  const deny = lines(f.subnetsDeny);
  const policy: { allow?: string[] | { [d: string]: DomainRule[] }; subnets?: { allow: string[]; deny: string[] } } = {};
  if (brokered.length) {
    const map: { [d: string]: DomainRule[] } = {};
    for (const d of domains) map[d] ??= [];
    for (const b of brokered) {
      const rules = (map[b.domain.trim()] ??= []);
      while (rules.length <= b.rule) rules.push({ transform: [] });
      const ts = rules[b.rule].transform;
      while (ts.length <= b.transform) ts.push({ headers: {} });
      ts[b.transform].headers[b.header.trim()] = b.value === "" && b.stored ? REDACTED : b.value;
    }
    policy.allow = map;
  } else if (domains.length) policy.allow = domains;
  if (allow.length || deny.length) policy.subnets = { allow, deny };
  return policy;
}

/** Why a domain pattern is refused (Vercel's rules: `example.com`, `*.example.com`,
 *  `www.*.com`), or null when it is fine. */
export function domainProblem(text: string): string | null {
  const t = text.endsWith(".") ? text.slice(0, -1) : text;
  if (!t) return "empty";
  if (t.length > 253) return "longer than 253 characters";
  const labels = t.split(".");
  let wildcards = 0;
  for (const [i, l] of labels.entries()) {
    if (!l) return "an empty label";
    if (l.length > 63) return "a label longer than 63 characters";
    if (l === "*") {
      wildcards++;
      if (wildcards > 1) return "more than one wildcard";
      if (i === labels.length - 1) return "a wildcard as the last label";
      continue;
    }
    if (l.includes("*")) return "a wildcard that is not a whole label (use *.example.com)";
    if (!/^[A-Za-z0-9_-]+$/.test(l)) return `an invalid character in "${l}"`;
  }
  return null;
}

function v4(text: string): boolean {
  const parts = text.split(".");
  return parts.length === 4 && parts.every((p) => /^\d{1,3}$/.test(p) && Number(p) <= 255);
}

function v6(text: string): boolean {
  if (!/^[0-9A-Fa-f:.]+$/.test(text) || !text.includes(":")) return false;
  const halves = text.split("::");
  if (halves.length > 2) return false;
  const groups = halves.flatMap((h) => (h ? h.split(":") : []));
  const last = groups.at(-1) ?? "";
  const tailV4 = last.includes(".");
  if (tailV4 && !v4(last)) return false;
  const hex = tailV4 ? groups.slice(0, -1) : groups;
  if (!hex.every((g) => /^[0-9A-Fa-f]{1,4}$/.test(g))) return false;
  const count = hex.length + (tailV4 ? 2 : 0);
  return halves.length === 2 ? count < 8 : count === 8;
}

/** Why a CIDR (or a bare address) is refused, or null when it is fine. */
export function cidrProblem(text: string): string | null {
  const [addr, prefix, extra] = text.split("/");
  if (extra !== undefined) return "more than one /";
  const isV4 = v4(addr);
  if (!isV4 && !v6(addr)) return `"${addr}" is not an IPv4 or IPv6 address`;
  if (prefix === undefined) return null;
  const max = isV4 ? 32 : 128;
  if (!/^\d{1,3}$/.test(prefix) || Number(prefix) > max) return `the prefix must be 0 to ${max}`;
  return null;
}

/** Header names the daemon accepts (an HTTP token). */
export function headerProblem(name: string): string | null {
  if (!name.trim()) return "a header name is needed";
  return /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/.test(name.trim()) ? null : `"${name}" is not a header name`;
}

/** Every mistake in the form, as "where: what" lines. */
export function formProblems(f: PolicyForm): string[] {
  if (f.mode !== "rules") return [];
  const out: string[] = [];
  for (const d of lines(f.domains)) {
    const p = domainProblem(d);
    if (p) out.push(`Domain ${d}: ${p}`);
  }
  for (const [what, text] of [["Allowed subnet", f.subnetsAllow], ["Denied subnet", f.subnetsDeny]] as const) {
    for (const c of lines(text)) {
      const p = cidrProblem(c);
      if (p) out.push(`${what} ${c}: ${p}`);
    }
  }
  for (const b of f.brokered) {
    const d = domainProblem(b.domain.trim());
    if (d) out.push(`Brokered domain ${b.domain || "(empty)"}: ${d}`);
    const h = headerProblem(b.header);
    if (h) out.push(`Brokered header on ${b.domain || "(empty)"}: ${h}`);
    if (!b.stored && b.value === "") out.push(`Brokered header ${b.header || "(empty)"}: a value is needed`);
  }
  return out;
}
