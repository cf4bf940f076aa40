/** A tiny element builder: `h('td', { class: 'x' }, 'text', child)`. Text is set as text, never as HTML. */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attributes: Record<string, string> = {},
  ...children: (Node | string | null)[]
): HTMLElementTagNameMap[K] {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    element.setAttribute(name, value);
  }
  for (const child of children) {
    if (child !== null) {
      element.append(child);
    }
  }
  return element;
}

/** A horizontal bar filled to `fraction` (0-1), labelled with `label`. */
export function bar(
  fraction: number | null,
  label: string,
  kind: 'utilization' | 'memory' | 'training'
): HTMLElement {
  const fill = h('div', { class: 'nbscale-Bar-fill' });
  fill.style.width = `${Math.round(Math.max(0, Math.min(1, fraction ?? 0)) * 100)}%`;
  return h(
    'div',
    { class: `nbscale-Bar nbscale-Bar-${kind}`, title: label },
    h('div', { class: 'nbscale-Bar-track' }, fill),
    h('span', { class: 'nbscale-Bar-label' }, label)
  );
}

/** A scrollable table of a header row and body rows. */
export function table(head: HTMLElement, rows: HTMLElement[]): HTMLElement {
  return h(
    'div',
    { class: 'nbscale-Scroll' },
    h(
      'table',
      { class: 'nbscale-Table' },
      h('thead', {}, head),
      h('tbody', {}, ...rows)
    )
  );
}
