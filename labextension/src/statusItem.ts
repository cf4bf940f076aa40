import { Widget } from '@lumino/widgets';

import { poolForKernel, statusText } from './format';
import { NbscaleModel } from './model';

export namespace PoolStatusItem {
  export interface IOptions {
    model: NbscaleModel;
    /** The kernel id of the notebook in front, or null when no notebook is. */
    currentKernelId: () => string | null;
    /** Opens the nbscale panel (on click). */
    openPanel: () => void;
  }
}

/**
 * The status bar item: the current notebook's pool at a glance ("4 workers · 2 busy · GPU 63%").
 * Empty, and so hidden, when the notebook's kernel runs no pool.
 */
export class PoolStatusItem extends Widget {
  constructor(options: PoolStatusItem.IOptions) {
    super({ node: document.createElement('div') });
    this.addClass('nbscale-StatusItem');
    this.node.title = 'nbscale pool: click to open the nbscale panel';
    this._options = options;
    this.node.addEventListener('click', () => options.openPanel());
    options.model.changed.connect(this.update, this);
  }

  /** The text shown now ('' when the current notebook has no pool, or the server does not answer). */
  get text(): string {
    const { model, currentKernelId } = this._options;
    if (model.error) {
      return ''; // the last answer may be long gone (a stopped server stops its kernels, and their pools)
    }
    return statusText(
      poolForKernel(model.pools, currentKernelId()),
      model.gpus.gpus
    );
  }

  dispose(): void {
    this._options.model.changed.disconnect(this.update, this);
    super.dispose();
  }

  protected onUpdateRequest(): void {
    const text = this.text;
    this.node.textContent = text;
    this.node.style.display = text ? '' : 'none';
  }

  private _options: PoolStatusItem.IOptions;
}
