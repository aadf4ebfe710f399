// Svelte's compiler options for vite-plugin-svelte and svelte-check.
import { vitePreprocess } from "@sveltejs/vite-plugin-svelte";

export default {
  preprocess: vitePreprocess(),
};
