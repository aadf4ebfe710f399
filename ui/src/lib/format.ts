// How numbers and times look in the UI, in one place so every screen agrees.

/** "3 s", "5 min", "2 h 10 min", "3 d". */
export function duration(ms: number): string {
  if (!Number.isFinite(ms)) return "—";
  const neg = ms < 0;
  let s = Math.floor(Math.abs(ms) / 1000);
  let out: string;
  if (s < 60) out = `${s} s`;
  else if (s < 3600) out = `${Math.floor(s / 60)} min`;
  else if (s < 86400) {
    const h = Math.floor(s / 3600);
    const m = Math.floor((s % 3600) / 60);
    out = m ? `${h} h ${m} min` : `${h} h`;
  } else {
    s = Math.floor(s / 86400);
    out = `${s} d`;
  }
  return neg ? `-${out}` : out;
}

/** A command's run time with sub-second precision: "0.42 s", "12.3 s", "4 min". */
export function runTime(ms: number): string {
  if (ms < 10_000) return `${(ms / 1000).toFixed(2)} s`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  return duration(ms);
}

/** "512 B", "1.5 KiB", "20 MiB". */
export function bytes(n: number): string {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return i === 0 ? `${v} B` : `${v < 10 ? v.toFixed(1) : Math.round(v)} ${units[i]}`;
}

/** "1 GiB" for 1024 MiB, "512 MiB" otherwise. */
export function mib(n: number): string {
  return n >= 1024 && n % 1024 === 0 ? `${n / 1024} GiB` : n >= 1024 ? `${(n / 1024).toFixed(1)} GiB` : `${n} MiB`;
}

/** Parses "5m", "90s", "2h", "1h30m", or plain minutes into milliseconds; null if invalid. */
export function parseDuration(text: string): number | null {
  const t = text.trim().toLowerCase();
  if (/^\d+(\.\d+)?$/.test(t)) return Math.round(parseFloat(t) * 60_000);
  if (!/^(\d+(\.\d+)?\s*(d|h|min|m|s)\s*)+$/.test(t)) return null;
  const unit: Record<string, number> = { d: 86_400_000, h: 3_600_000, m: 60_000, min: 60_000, s: 1000 };
  let total = 0;
  for (const m of t.matchAll(/(\d+(?:\.\d+)?)\s*(d|h|min|m|s)/g)) total += parseFloat(m[1]) * unit[m[2]];
  return Math.round(total);
}

/** `KEY=value` lines into a map; returns the first bad line as an error. */
export function parsePairs(text: string, what: string): { value: Record<string, string> } | { error: string } {
  const value: Record<string, string> = {};
  for (const raw of text.split(/\n|,/)) {
    const line = raw.trim();
    if (!line) continue;
    const eq = line.indexOf("=");
    if (eq <= 0) return { error: `${what}: "${line}" is not KEY=value` };
    value[line.slice(0, eq).trim()] = line.slice(eq + 1).trim();
  }
  return { value };
}
