/**
 * What jsdom lacks and JupyterLab's UI packages use at import time: DragEvent (@lumino/dragdrop)
 * and matchMedia (the FAST web components under @jupyterlab/ui-components).
 */
const scope = globalThis as { DragEvent?: unknown };
scope.DragEvent ??= class DragEvent extends MouseEvent {};

if (!window.matchMedia) {
  window.matchMedia = (query: string): MediaQueryList =>
    ({
      matches: false,
      media: query,
      onchange: null,
      addListener: () => undefined,
      removeListener: () => undefined,
      addEventListener: () => undefined,
      removeEventListener: () => undefined,
      dispatchEvent: () => false
    }) as MediaQueryList;
}
