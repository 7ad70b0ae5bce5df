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

// and requestIdleCallback (ReactWidget's render, e.g. a ToolbarButton of the panel)
const idle = globalThis as { requestIdleCallback?: unknown; cancelIdleCallback?: unknown };
idle.requestIdleCallback ??= (callback: (deadline: { didTimeout: boolean; timeRemaining(): number }) => void) =>
  setTimeout(() => callback({ didTimeout: false, timeRemaining: () => 50 }), 0);
idle.cancelIdleCallback ??= (handle: ReturnType<typeof setTimeout>) => clearTimeout(handle);
