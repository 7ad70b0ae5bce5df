/**
 * Joining a widget tracker on first use: the Sandbox drive's browser and the file browsers'
 * tracker, whose current browser is where JupyterLab creates new files.
 */
import { WidgetTracker } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

/** Elements a pointer press focuses (so the widget's first focus is on its way). */
const FOCUSABLE = '[tabindex], button, input, select, textarea, a[href]';

/**
 * Add `widget` to `tracker` just before it first takes the focus, not before.
 *
 * A WidgetTracker's current widget is the last one focused, or the last one added while none
 * had focus, and JupyterLab's launcher creates a notebook in `cwd || current browser's path`:
 * at the server's root (cwd '') a drive browser added at start-up would be current, and
 * "Notebook" in the launcher would try to create the file in the Sandbox drive. Joining the
 * file browsers' tracker when the user first turns to the drive's browser keeps the default
 * browser current until then, and makes the drive's browser current (so the file browser's
 * commands and context menu act on it) as soon as it has the focus. A widget added while it
 * holds the focus does not become current, so the tracker is joined before the focus lands: on
 * a press on a focusable part, or as the focus leaves another element for it. Focus that comes
 * from nowhere (an activation while nothing had it) steps out, joins and comes back. Showing or
 * activating the widget while restoring the layout, which does not focus it, does not join.
 */
export function trackOnFirstUse<T extends Widget>(tracker: WidgetTracker<T>, widget: T): void {
  const node = widget.node;
  const join = () => {
    stop();
    if (!widget.isDisposed && !tracker.has(widget)) {
      void tracker.add(widget);
    }
  };
  const onPointerDown = (event: Event) => {
    const focusable = (event.target as Element | null)?.closest?.(FOCUSABLE);
    if (focusable && node.contains(focusable)) {
      join();
    }
  };
  const onFocusOut = (event: FocusEvent) => {
    if (event.relatedTarget instanceof Node && node.contains(event.relatedTarget)) {
      join();
    }
  };
  // focus from nowhere (nothing had it): step out, join, and take the focus again
  const onFocusIn = (event: FocusEvent) => {
    const target = event.target as HTMLElement;
    target.blur();
    join();
    target.focus();
  };
  const stop = () => {
    node.removeEventListener('pointerdown', onPointerDown, true);
    node.removeEventListener('mousedown', onPointerDown, true);
    node.removeEventListener('focusin', onFocusIn, true);
    document.removeEventListener('focusout', onFocusOut, true);
  };
  node.addEventListener('pointerdown', onPointerDown, true);
  node.addEventListener('mousedown', onPointerDown, true);
  node.addEventListener('focusin', onFocusIn, true);
  document.addEventListener('focusout', onFocusOut, true);
  widget.disposed.connect(stop);
}
