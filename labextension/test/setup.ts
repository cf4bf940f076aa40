// jsdom has no DragEvent, which @lumino/dragdrop (imported by @lumino/widgets) subclasses at import time.
if (typeof window !== 'undefined' && !('DragEvent' in window)) {
  Object.defineProperty(window, 'DragEvent', {
    value: class DragEvent extends MouseEvent {}
  });
}
