// Vite builds the UI into dist/, which belljard serves at `/` and the desktop app embeds.
import { defineConfig } from "vite";
import { svelte } from "@sveltejs/vite-plugin-svelte";

export default defineConfig({
  plugins: [svelte()],
  // Relative asset URLs work both under the daemon's `/` and inside the app.
  base: "./",
  clearScreen: false,
  build: {
    target: "es2022",
    chunkSizeWarningLimit: 1500,
  },
  server: {
    port: 5173,
    strictPort: true,
    // `npm run dev` against a running daemon: BELLJAR_URL=http://127.0.0.1:7423
    proxy: process.env.BELLJAR_URL
      ? {
          "/v1": { target: process.env.BELLJAR_URL, ws: true, changeOrigin: true },
          "/ui": { target: process.env.BELLJAR_URL, changeOrigin: true },
        }
      : undefined,
  },
});
