// Hash routes: `#/` (sandboxes), `#/sandbox/<id>`, `#/terminal/<id>` (a terminal window),
// `#/doctor` (the host check), `#/images`.
// A hash keeps the daemon's SPA fallback and the app's embedded assets out of routing.

export type Route =
  | { name: "list" }
  | { name: "doctor" }
  | { name: "images" }
  | { name: "sandbox"; id: string }
  | { name: "terminal"; id: string };

function parse(hash: string): Route {
  const m = /^#\/(sandbox|terminal)\/([^/?]+)/.exec(hash);
  if (m) return { name: m[1] as "sandbox" | "terminal", id: decodeURIComponent(m[2]) };
  if (/^#\/doctor\/?$/.test(hash)) return { name: "doctor" };
  if (/^#\/images\/?$/.test(hash)) return { name: "images" };
  return { name: "list" };
}

class Router {
  route = $state<Route>(parse(location.hash));
  constructor() {
    addEventListener("hashchange", () => (this.route = parse(location.hash)));
  }
  go(hash: string) {
    if (location.hash !== hash) location.hash = hash;
    this.route = parse(hash);
  }
}

export const router = new Router();
