// The daemon's route paths with every variable part percent-encoded (as
// crates/client/src/routes.rs builds them), so an id or a file name cannot reach another route.

/** `/v1/a/b/...` from its segments, each encoded. */
export function path(...segments: string[]): string {
  return "/v1/" + segments.map(encodeURIComponent).join("/");
}

/** `?k=v&...` for the values that are set (empty when none is). */
export function query(pairs: Record<string, string | number | boolean | undefined | null>): string {
  const parts = Object.entries(pairs)
    .filter(([, v]) => v !== undefined && v !== null)
    .map(([k, v]) => `${k}=${encodeURIComponent(String(v))}`);
  return parts.length ? "?" + parts.join("&") : "";
}

/** `/v1/images/{name}[/rest...]`: an image's name (`registry/repo:tag`) is one segment. */
export function imagePath(name: string, ...rest: string[]): string {
  return path("images", name, ...rest);
}
