import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    environment: 'jsdom',
    include: ['test/**/*.spec.ts'],
    setupFiles: ['test/setup.ts'],
    // inlined so that vite resolves their extensionless ESM imports (@jupyter/web-components)
    server: { deps: { inline: [/@jupyterlab\//, /@lumino\//, /@jupyter\//, /@microsoft\//] } }
  }
});
