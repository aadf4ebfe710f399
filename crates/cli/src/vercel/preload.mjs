// Belljar's preload for Vercel's Sandbox SDK (`belljar vercel -- CMD`), loaded with
// `NODE_OPTIONS=--import <this file>` before the program's own modules.
//
// The SDK sends every request to Vercel's API base through `globalThis.fetch` (it takes the
// function when a client is made, which is after this runs). Requests for that base go to
// the local daemon's Vercel layer instead (BELLJAR_VERCEL_URL); everything else is untouched.
// The SDK's own options (its undici dispatcher without a body timeout, its abort signal)
// pass through, so long-running output streams behave as they do against Vercel.
const target = process.env.BELLJAR_VERCEL_URL;
const bases = ["https://vercel.com/api", "https://api.vercel.com"];

if (target && typeof globalThis.fetch === "function" && !globalThis.fetch.__belljar) {
  const original = globalThis.fetch;
  const rewrite = (url) => {
    for (const base of bases) {
      if (url === base || url.startsWith(base + "/") || url.startsWith(base + "?")) {
        return target + url.slice(base.length);
      }
    }
    return null;
  };
  const patched = function fetch(input, init) {
    if (typeof input === "string" || input instanceof URL) {
      const to = rewrite(String(input));
      if (to !== null) return original.call(this, to, init);
    } else if (input && typeof input.url === "string") {
      const to = rewrite(input.url);
      if (to !== null) return original.call(this, new Request(to, input), init);
    }
    return original.call(this, input, init);
  };
  Object.defineProperty(patched, "__belljar", { value: true });
  globalThis.fetch = patched;
}
