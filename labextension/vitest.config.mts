import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    environment: 'jsdom',
    include: ['test/**/*.spec.ts'],
    server: { deps: { inline: [/@jupyterlab\//, /@lumino\//] } }
  }
});
