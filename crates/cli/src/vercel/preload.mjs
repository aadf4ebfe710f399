// Belljar's preload for Vercel's Sandbox SDK (`belljar vercel -- CMD`), loaded with
// `NODE_OPTIONS=--import <this file>` before the program's own modules.
//
// The SDK sends every request to Vercel's API base through `globalThis.fetch` (it takes the
// function when a client is made, which is after this runs). Requests for that base go to
// the local daemon's Vercel layer instead (BELLJAR_VERCEL_URL); everything else is untouched.
// The SDK's own options (its undici dispatcher without a body timeout, its abort signal)
// pass through, so long-running output streams behave as they do against Vercel.
//
// `sandbox.domain(port)` is `https://<subdomain>.vercel.run` in the SDK; the daemon's routes
// end their subdomain in `-belljar-<host port>`, and requests for such a URL go to that
// forwarded port on 127.0.0.1 (plain HTTP), so `fetch(sandbox.domain(3000))` reaches the
// sandbox's port 3000.
const target = process.env.BELLJAR_VERCEL_URL;
const bases = ["https://vercel.com/api", "https://api.vercel.com"];

if (target && typeof globalThis.fetch === "function" && !globalThis.fetch.__belljar) {
  const original = globalThis.fetch;
  const domain = /^https:\/\/[a-z0-9-]+-belljar-(\d{1,5})\.vercel\.run(?=[/?#]|$)/;
  const rewrite = (url) => {
    const forwarded = domain.exec(url);
    if (forwarded) return `http://127.0.0.1:${forwarded[1]}${url.slice(forwarded[0].length)}`;
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
