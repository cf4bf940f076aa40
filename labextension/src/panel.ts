import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { bar, h, table } from './dom';
import {
  formatElapsed,
  formatIdleLeft,
  formatMemory,
  gpuHoldersText,
  isActive,
  memoryFraction,
  poolOwner,
  resultSnippet,
  trainingText
} from './format';
import { NbscaleModel } from './model';
import { IGpuInfo, IJob, IPoolState } from './types';

export namespace NbscalePanel {
  export interface IOptions {
    model: NbscaleModel;
    /** The kernel id of the notebook in front (its pool is marked), or null. */
    currentKernelId: () => string | null;
    openLog: (job: IJob) => void;
    /** Cancels a job once the user confirms. */
    cancelJob: (job: IJob) => Promise<void>;
    /** Stops a pool (in its kernel, as `%pool stop`) once the user confirms. */
    stopPool: (pool: IPoolState, isCurrent: boolean) => Promise<void>;
    copySnippet: (snippet: string) => void;
  }
}

/**
 * The side panel: Pools (a workers table per pool), GPUs (utilization and memory bars, who holds each), Jobs (state, elapsed,
 * log, cancel, the snippet that fetches a result). Its model polls only while the panel is visible.
 */
export class NbscalePanel extends Widget {
  constructor(options: NbscalePanel.IOptions) {
    super();
    this.addClass('nbscale-Panel');
    this._options = options;
    options.model.changed.connect(this.update, this);
  }

  dispose(): void {
    this._options.model.changed.disconnect(this.update, this);
    super.dispose();
  }

  protected onAfterShow(msg: Message): void {
    void this._options.model.refresh();
    this.update();
  }

  protected onUpdateRequest(msg: Message): void {
    const { model } = this._options;
    const header = h('header', { class: 'nbscale-Panel-header' }, 'nbscale');
    if (model.answeredAt === null) {
      // nothing heard yet: say so rather than show placeholders ("No GPU.", no jobs) as if the server had said them
      this.node.replaceChildren(
        header,
        model.error
          ? h('div', { class: 'nbscale-Error' }, this._unreachable(model.error))
          : h('p', { class: 'nbscale-Empty' }, 'Asking the server…')
      );
      return;
    }
    const sections = [
      this._section('Pools', this._pools(model.pools), model.poolsError),
      this._section('GPUs', this._gpus(model.gpus.gpus, model.gpus.message)),
      this._section(
        'Jobs',
        this._jobs(model.jobs.jobs, model.jobs.available),
        model.jobs.error ?? null
      )
    ];
    if (model.error) {
      // what the server said last, greyed, under the error that says since when
      const when = new Date(model.answeredAt).toLocaleTimeString();
      sections.forEach(section => section.classList.add('nbscale-Stale'));
      this.node.replaceChildren(
        header,
        h(
          'div',
          { class: 'nbscale-Error' },
          `${this._unreachable(model.error)} Below: what it said at ${when}.`
        ),
        ...sections
      );
      return;
    }
    this.node.replaceChildren(header, ...sections);
  }

  private _unreachable(error: string): string {
    return `Cannot reach nbscale's server extension: ${error}. Is the Jupyter server running, with nbscale's server extension enabled?`;
  }

  /** A titled section; `error` (the server could not read its source) shows above its body. */
  private _section(
    title: string,
    body: HTMLElement,
    error: string | null = null
  ): HTMLElement {
    const name = title.toLowerCase();
    return h(
      'section',
      { class: `nbscale-Section nbscale-${name}`, 'data-section': name },
      h('h3', {}, title),
      error ? h('div', { class: 'nbscale-Error' }, error) : null,
      body
    );
  }

  private _pools(pools: readonly IPoolState[]): HTMLElement {
    if (pools.length === 0) {
      return h(
        'p',
        { class: 'nbscale-Empty' },
        'No pool is running. Start one in a notebook with %pool start.'
      );
    }
    const current = this._options.currentKernelId();
    return h(
      'div',
      {},
      ...pools.map(pool =>
        this._pool(pool, pool.kernel_id !== null && pool.kernel_id === current)
      )
    );
  }

  private _pool(pool: IPoolState, isCurrent: boolean): HTMLElement {
    const who = isCurrent ? 'this notebook' : poolOwner(pool);
    const title = `${pool.size} ${pool.kind.toUpperCase()} workers · ${pool.backend} · ${who}`;
    const idle =
      pool.idle_timeout_left_s !== null
        ? `stops after ${formatIdleLeft(pool.idle_timeout_left_s)} idle`
        : null;
    const head = h(
      'tr',
      {},
      ...['rank', 'host', 'pid', 'device', 'state', 'memory'].map(column =>
        h('th', {}, column)
      )
    );
    const rows = pool.workers.map(worker =>
      h(
        'tr',
        { class: `nbscale-Worker nbscale-state-${worker.state}` },
        h('td', {}, String(worker.rank)),
        h('td', {}, worker.host),
        h('td', {}, String(worker.pid)),
        h('td', {}, worker.device),
        h('td', { class: 'nbscale-State' }, worker.state),
        h(
          'td',
          {},
          formatMemory(worker.memory_mb) +
            (worker.device_memory_mb
              ? ` + ${formatMemory(worker.device_memory_mb)} GPU`
              : '')
        )
      )
    );
    const stop = this._button(
      'Stop pool',
      `Stop this pool's workers in its kernel, as %pool stop does (asks first)`,
      () => void this._options.stopPool(pool, isCurrent)
    );
    return h(
      'div',
      { class: `nbscale-Pool${isCurrent ? ' nbscale-Pool-current' : ''}` },
      h('div', { class: 'nbscale-Pool-title' }, title),
      h('div', { class: 'nbscale-Pool-actions' }, stop),
      idle ? h('div', { class: 'nbscale-Pool-idle' }, idle) : null,
      table(head, rows)
    );
  }

  private _gpus(
    gpus: readonly IGpuInfo[],
    message: string | null
  ): HTMLElement {
    if (gpus.length === 0) {
      return h('p', { class: 'nbscale-NoGpu' }, message ?? 'No GPU.');
    }
    return h(
      'div',
      {},
      ...gpus.map(gpu => {
        const utilization = gpu.utilization_percent;
        const facts = [
          gpu.compute_capability ? `compute ${gpu.compute_capability}` : null,
          gpu.temperature_c !== null ? `${gpu.temperature_c} °C` : null,
          gpu.power_w !== null ? `${Math.round(gpu.power_w)} W` : null
        ].filter(Boolean);
        return h(
          'div',
          { class: 'nbscale-Gpu' },
          h(
            'div',
            { class: 'nbscale-Gpu-title' },
            `${gpu.index} · ${gpu.name}`,
            h('span', {}, facts.join(' · '))
          ),
          bar(
            utilization === null ? null : utilization / 100,
            utilization === null
              ? 'utilization -'
              : `utilization ${utilization}%`,
            'utilization'
          ),
          bar(
            memoryFraction(gpu),
            `memory ${formatMemory(gpu.memory_used_mb)} / ${formatMemory(gpu.memory_total_mb)}`,
            'memory'
          ),
          h(
            'div',
            {
              class: `nbscale-Gpu-holders${(gpu.holders ?? []).length ? '' : ' nbscale-Gpu-free'}`
            },
            gpuHoldersText(gpu, this._options.currentKernelId())
          )
        );
      })
    );
  }

  private _jobs(jobs: readonly IJob[], available: boolean): HTMLElement {
    if (!available) {
      return h(
        'p',
        { class: 'nbscale-Empty' },
        'Batch jobs are not available here (nbscale.jobs is not installed).'
      );
    }
    if (jobs.length === 0) {
      return h(
        'p',
        { class: 'nbscale-Empty' },
        'No batch jobs. Run a cell detached with %%batch.'
      );
    }
    const head = h(
      'tr',
      {},
      ...['id', 'name', 'state', 'elapsed'].map(column => h('th', {}, column))
    );
    const rows = [...jobs].reverse().map(job => {
      const row = h(
        'tr',
        { class: `nbscale-Job nbscale-state-${job.state}` },
        h('td', {}, String(job.id)),
        h('td', {}, job.name ?? ''),
        h('td', { class: 'nbscale-State', title: job.error ?? '' }, job.state),
        h('td', {}, formatElapsed(job.elapsed_s))
      );
      return [
        row,
        ...(job.training ? [this._training(job)] : []),
        this._actions(job)
      ];
    });
    return table(head, rows.flat());
  }

  /**
   * The buttons under a job, on their own row so that the narrow sidebar shows them without scrolling sideways.
   */
  private _actions(job: IJob): HTMLElement {
    const cell = h(
      'td',
      { colspan: '4' },
      this._button('Log', `Open job ${job.id}'s log`, () =>
        this._options.openLog(job)
      ),
      isActive(job)
        ? this._button(
            'Cancel',
            `Cancel job ${job.id} (asks first)`,
            () => void this._options.cancelJob(job)
          )
        : null,
      this._button('Copy', `Copy ${resultSnippet(job)}`, () =>
        this._options.copySnippet(resultSnippet(job))
      )
    );
    return h('tr', { class: 'nbscale-Job-actions' }, cell);
  }

  /** The row under a running job: its training's epoch, iteration, last loss and time left, with a bar. */
  private _training(job: IJob): HTMLElement {
    const training = job.training!;
    const text = trainingText(training);
    const fraction =
      training.total_iterations > 0
        ? (training.iteration ?? 0) / training.total_iterations
        : null;
    const cell = h(
      'td',
      { colspan: '4', title: `%jobs show ${job.id} draws its live plot` },
      bar(fraction, text, 'training')
    );
    return h('tr', { class: 'nbscale-Job-training' }, cell);
  }

  private _button(
    label: string,
    title: string,
    action: () => void
  ): HTMLButtonElement {
    const button = h(
      'button',
      { class: 'jp-Button nbscale-Button', title },
      label
    );
    button.addEventListener('click', action);
    return button;
  }

  private _options: NbscalePanel.IOptions;
}
