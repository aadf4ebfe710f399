// Belljar's preload for Vercel's Sandbox SDK (`belljar vercel -- CMD`), loaded with
// `NODE_OPTIONS=--import <this file>` before the program's own modules.
//
// The SDK sends every request to Vercel's API base through `globalThis.fetch` (it takes the
// function when a client is made, which is after this runs). Requests for that base go to
// the local daemon's Vercel layer instead (BELLJAR_VERCEL_URL); everything else is untouched.
// The SDK's own options (its undici dispatcher without a body timeout, its abort signal)
// pass through, so long-running output streams behave as they do against Vercel.
//
// `sandbox.domain(port)` is `https://<subdomain>.vercel.run` in the SDK, a name only Vercel
// serves. The daemon's routes carry the forwarded local URL (`http://127.0.0.1:<host port>`) in
// their `url`, and the SDK's `domain()` returns that instead: the SDK's source is changed as it
// loads (ESM through a loader hook, CommonJS through the compiler), so the URL works from the
// program, from curl and from a browser on this machine. Should an SDK version word `domain()`
// differently, it returns Vercel's text again, whose subdomain ends in `-belljar-<host port>`:
// requests for such a URL still go to that forwarded port from this process.
//
// The credential (`VERCEL_OIDC_TOKEN`, a JWT the daemon signed) lives an hour, and the SDK
// asks Vercel's CLI, which is not there, for a new one when it nears its end. So while the
// program runs, this renews it a quarter into its life: the daemon's `/belljar/credentials`
// takes the JWT still held and gives a new one, which goes into `process.env` (where the SDK
// reads it for each new client, and children inherit it) and replaces the old one in requests
// of clients made earlier. A timer that does not keep the program alive does it.
import Module, { register } from "node:module";

const target = process.env.BELLJAR_VERCEL_URL;

// The SDK's files that build `domain()`'s answer, and the text they build it with.
const sdkFile = /[\\/]@vercel[\\/]sandbox[\\/]dist[\\/](?:sandbox|session)\.c?js$/;
const vercelRun = "`https://${route.subdomain}.vercel.run`";
const localUrl = `(/^http:\\/\\/127\\.0\\.0\\.1:\\d+$/.test(route.url ?? "") ? route.url : ${vercelRun})`;

if (target && !globalThis.__belljarDomain) {
  Object.defineProperty(globalThis, "__belljarDomain", { value: true });
  const compile = Module.prototype._compile;
  Module.prototype._compile = function (content, filename) {
    if (sdkFile.test(filename)) content = content.replaceAll(vercelRun, localUrl);
    return compile.call(this, content, filename);
  };
  const hook = `
    const sdkFile = ${sdkFile};
    export async function load(url, context, nextLoad) {
      const loaded = await nextLoad(url, context);
      if (loaded.format !== "module" || loaded.source == null || !sdkFile.test(new URL(url).pathname)) {
        return loaded;
      }
      const source = String(loaded.source).replaceAll(${JSON.stringify(vercelRun)}, ${JSON.stringify(localUrl)});
      return { ...loaded, source };
    }`;
  register(`data:text/javascript,${encodeURIComponent(hook)}`);
}
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

const credentials = process.env.VERCEL_OIDC_TOKEN;

// The claims of a JWT, or null.
const claimsOf = (jwt) => {
  try {
    return JSON.parse(Buffer.from(String(jwt).split(".")[1] ?? "", "base64url").toString());
  } catch {
    return null;
  }
};

if (target && credentials && claimsOf(credentials)?.iss === "belljar" && !globalThis.__belljarRenew) {
  Object.defineProperty(globalThis, "__belljarRenew", { value: true });
  // The redirecting fetch above; the renewal's own request goes straight to the daemon.
  const next = globalThis.fetch;
  // Every JWT handed out here: a request that carries an older one gets the newest instead.
  const issued = new Set([credentials]);
  let current = credentials;
  const schedule = (ms) => setTimeout(renew, Math.max(0, Math.min(ms, 2 ** 31 - 1))).unref();
  // When the JWT held is a quarter into its life, and how long it has left.
  const times = () => {
    const { iat, exp } = claimsOf(current) ?? {};
    if (typeof iat !== "number" || typeof exp !== "number") return null;
    return { due: (iat + (exp - iat) / 4) * 1000 - Date.now(), left: exp * 1000 - Date.now(), life: (exp - iat) * 1000 };
  };
  async function renew() {
    let renewed = false;
    try {
      const answer = await next(`${target}/belljar/credentials`, {
        headers: { authorization: `Bearer ${current}` },
      });
      const { token } = answer.ok ? await answer.json() : {};
      if (typeof token === "string" && claimsOf(token)) {
        issued.add(token);
        current = token;
        process.env.VERCEL_OIDC_TOKEN = token;
        renewed = true;
      }
    } catch {
      // The daemon is restarting, most likely: tried again below while the JWT is still good.
    }
    const t = times();
    if (!t) return;
    // Never sooner than a second (a JWT's times are whole seconds); after a failure, again in
    // a minute or a quarter of its life, whichever is sooner, while it is still good.
    if (renewed) schedule(Math.max(t.due, 1000));
    else if (t.left > 0) schedule(Math.min(60_000, t.life / 4));
  }
  const t = times();
  if (t) schedule(t.due);
  const stale = (headers) => {
    const auth = headers.get("authorization") ?? "";
    return auth.startsWith("Bearer ") && auth !== `Bearer ${current}` && issued.has(auth.slice(7));
  };
  const patched = function fetch(input, init) {
    if (init?.headers !== undefined) {
      const headers = new Headers(init.headers);
      if (stale(headers)) {
        headers.set("authorization", `Bearer ${current}`);
        return next.call(this, input, { ...init, headers });
      }
    } else if (input instanceof Request && stale(input.headers)) {
      const request = new Request(input);
      request.headers.set("authorization", `Bearer ${current}`);
      return next.call(this, request, init);
    }
    return next.call(this, input, init);
  };
  Object.defineProperty(patched, "__belljar", { value: true });
  globalThis.fetch = patched;
}
