import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    environment: 'jsdom',
    include: ['test/**/*.spec.ts'],
    setupFiles: ['test/setup.ts'],
    // the first import of the whole plugin tree transforms JupyterLab's packages: over vitest's 5 s
    // default on a loaded 2-core machine (seen once beside four pytest workers)
    testTimeout: 60_000,
    // inlined so that vite resolves their extensionless ESM imports (@jupyter/web-components)
    server: { deps: { inline: [/@jupyterlab\//, /@lumino\//, /@jupyter\//, /@microsoft\//] } }
  }
});
