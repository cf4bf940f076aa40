// @vitest-environment jsdom
import { MessageLoop } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';
import { afterEach, describe, expect, it } from 'vitest';

import { NbscaleModel } from '../src/model';
import { NbscalePanel } from '../src/panel';
import { PoolStatusItem } from '../src/statusItem';
import { FetchJson, IJob } from '../src/types';

const pool = {
  kernel_id: 'kernel-a',
  size: 2,
  kind: 'cpu',
  backend: 'local',
  idle_timeout_left_s: 1799,
  pid: 10,
  heartbeat: 0,
  workers: [
    {
      rank: 0,
      host: 'node1',
      pid: 11,
      device: 'cpu',
      state: 'busy',
      memory_mb: 300.2
    },
    {
      rank: 1,
      host: 'node1',
      pid: 12,
      device: 'cpu',
      state: 'idle',
      memory_mb: null
    }
  ]
};

const jobs: IJob[] = [
  {
    id: 1,
    name: 'done',
    state: 'finished',
    started: null,
    elapsed_s: 65,
    results: ['net']
  },
  {
    id: 2,
    name: 'long run',
    state: 'running',
    started: null,
    elapsed_s: 12,
    results: [],
    training: {
      training: 1,
      trainings: 1,
      epoch: 2,
      max_epochs: 4,
      iteration: 50,
      total_iterations: 200,
      loss: 0.5,
      validation_loss: null,
      time_left_s: 30,
      done: false,
      stop_reason: null
    }
  }
];

function modelWith(
  gpus: unknown,
  overrides: Record<string, unknown> = {}
): NbscaleModel {
  const replies: Record<string, unknown> = {
    pools: { pools: [pool] },
    gpus,
    jobs: { jobs, available: true },
    ...overrides
  };
  const fetchJson = (async (endPoint: string) =>
    replies[endPoint]) as FetchJson;
  return new NbscaleModel({
    fetchJson,
    resources: ['pools', 'gpus', 'jobs'],
    isVisible: () => false
  });
}

const noGpu = {
  gpus: [],
  message: 'No GPU: the NVIDIA driver was not found on this machine.'
};
const widgets: Widget[] = [];

function attach<T extends Widget>(widget: T): T {
  Widget.attach(widget, document.body);
  widgets.push(widget);
  return widget;
}

afterEach(() => {
  widgets.splice(0).forEach(widget => widget.dispose());
});

describe('PoolStatusItem', () => {
  it("shows the current notebook's pool and nothing for a notebook without one", async () => {
    const model = modelWith(noGpu);
    let kernelId: string | null = 'kernel-a';
    let opened = 0;
    const item = attach(
      new PoolStatusItem({
        model,
        currentKernelId: () => kernelId,
        openPanel: () => opened++
      })
    );
    await model.update();
    MessageLoop.sendMessage(item, Widget.Msg.UpdateRequest);
    expect(item.node.textContent).toBe('2 workers · 1 busy');
    item.node.click();
    expect(opened).toBe(1);
    kernelId = 'kernel-b';
    MessageLoop.sendMessage(item, Widget.Msg.UpdateRequest);
    expect(item.node.textContent).toBe('');
    expect(item.node.style.display).toBe('none');
  });
});

describe('NbscalePanel', () => {
  function panelFor(model: NbscaleModel, calls: string[]): NbscalePanel {
    return attach(
      new NbscalePanel({
        model,
        currentKernelId: () => 'kernel-a',
        openLog: job => calls.push(`log ${job.id}`),
        cancelJob: async job => {
          calls.push(`cancel ${job.id}`);
        },
        stopPool: async (pool, isCurrent) => {
          calls.push(`stop pool ${pool.kernel_id} ${isCurrent}`);
        },
        copySnippet: snippet => calls.push(`copy ${snippet}`)
      })
    );
  }

  it('shows the workers, a clear no-GPU line and the jobs with their actions', async () => {
    const model = modelWith(noGpu);
    const calls: string[] = [];
    const panel = panelFor(model, calls);
    await model.update();
    MessageLoop.sendMessage(panel, Widget.Msg.UpdateRequest);
    const rows = [...panel.node.querySelectorAll('.nbscale-Worker')].map(row =>
      [...row.querySelectorAll('td')].map(cell => cell.textContent)
    );
    expect(rows).toEqual([
      ['0', 'node1', '11', 'cpu', 'busy', '300 MB'],
      ['1', 'node1', '12', 'cpu', 'idle', '-']
    ]);
    expect(
      panel.node.querySelector('.nbscale-Pool-title')?.textContent
    ).toContain('this notebook');
    expect(panel.node.querySelector('.nbscale-Pool-idle')?.textContent).toBe(
      'stops after 30 min idle'
    );
    expect(panel.node.querySelector('.nbscale-NoGpu')?.textContent).toBe(
      noGpu.message
    );

    const jobRows = [...panel.node.querySelectorAll('.nbscale-Job')];
    expect(jobRows.map(row => row.querySelector('td')?.textContent)).toEqual([
      '2',
      '1'
    ]); // newest first
    // each job's buttons on the row under it (its training line between), so the sidebar never hides them
    const actionRows = jobRows.map(row => {
      let next = row.nextElementSibling;
      while (next && !next.classList.contains('nbscale-Job-actions')) {
        next = next.nextElementSibling;
      }
      return next!;
    });
    const buttons = (index: number) =>
      [...actionRows[index].querySelectorAll('button')] as HTMLButtonElement[];
    expect(jobRows.map(row => row.querySelectorAll('button').length)).toEqual([
      0, 0
    ]);
    expect(buttons(0).map(b => b.textContent)).toEqual([
      'Log',
      'Cancel',
      'Copy'
    ]);
    expect(buttons(1).map(b => b.textContent)).toEqual(['Log', 'Copy']); // finished: no cancel
    (
      panel.node.querySelector('.nbscale-Pool-actions button') as HTMLElement
    ).click();
    buttons(0).forEach(button => button.click());
    buttons(1)[1].click();
    expect(calls).toEqual([
      'stop pool kernel-a true',
      'log 2',
      'cancel 2',
      'copy nbscale.jobs.get(2).result("NAME")',
      'copy nbscale.jobs.get(1).result("net")'
    ]);
  });

  it('draws a utilization and a memory bar per GPU', async () => {
    const gpu = {
      index: 0,
      nvml_index: 0,
      name: 'NVIDIA H100',
      compute_capability: '9.0',
      memory_used_mb: 20480,
      memory_total_mb: 81920,
      utilization_percent: 63,
      temperature_c: 40,
      power_w: 300,
      power_limit_w: 700,
      processes: []
    };
    const model = modelWith({ gpus: [gpu], message: null });
    const panel = panelFor(model, []);
    await model.update();
    MessageLoop.sendMessage(panel, Widget.Msg.UpdateRequest);
    const fills = [
      ...panel.node.querySelectorAll('.nbscale-Gpu .nbscale-Bar-fill')
    ] as HTMLElement[];
    expect(fills.map(fill => fill.style.width)).toEqual(['63%', '25%']);
    expect(panel.node.querySelector('.nbscale-Gpu')?.textContent).toContain(
      'memory 20.0 GB / 80.0 GB'
    );
    expect(panel.node.querySelector('.nbscale-NoGpu')).toBeNull();
    expect(panel.node.querySelector('.nbscale-Gpu-holders')?.textContent).toBe(
      'free'
    );
  });

  it("names who holds each GPU, marking the notebook in front only for the server's user", async () => {
    const held = (index: number, holders: unknown[]) => ({
      index,
      nvml_index: index,
      name: 'NVIDIA H100',
      compute_capability: '9.0',
      memory_used_mb: 0,
      memory_total_mb: 81920,
      utilization_percent: 0,
      temperature_c: null,
      power_w: null,
      power_limit_w: null,
      processes: [],
      holders
    });
    const alice = {
      user: 'alice',
      uid: 1001,
      pid: 4242,
      purpose: 'pool',
      notebook: 'analysis.ipynb',
      kernel_id: 'kernel-x',
      since: 0,
      mine: false
    };
    const mine = {
      ...alice,
      user: 'me',
      uid: 1000,
      pid: 10,
      purpose: 'training',
      notebook: 'a.ipynb',
      kernel_id: 'kernel-a',
      mine: true
    };
    // another user's file naming the kernel in front: only the server's user's reservations are "this notebook"
    const planted = { ...alice, kernel_id: 'kernel-a', notebook: 'b.ipynb' };
    const model = modelWith({
      gpus: [
        held(0, [alice]),
        held(1, [mine]),
        held(2, []),
        held(3, [planted])
      ],
      message: null
    });
    const panel = panelFor(model, []);
    await model.update();
    MessageLoop.sendMessage(panel, Widget.Msg.UpdateRequest);
    const lines = [...panel.node.querySelectorAll('.nbscale-Gpu-holders')].map(
      line => line.textContent
    );
    expect(lines).toEqual([
      "held by alice's pool · analysis.ipynb · pid 4242",
      "held by me's training · this notebook · pid 10",
      'free',
      "held by alice's pool · b.ipynb · pid 4242"
    ]);
  });

  it("shows a running job's training under it: epoch, iteration, loss and time left", async () => {
    const model = modelWith(noGpu);
    const panel = panelFor(model, []);
    await model.update();
    MessageLoop.sendMessage(panel, Widget.Msg.UpdateRequest);
    const rows = [...panel.node.querySelectorAll('tbody tr')].filter(row =>
      row.closest('.nbscale-jobs')
    );
    expect(rows.map(row => row.className)).toEqual([
      'nbscale-Job nbscale-state-running',
      'nbscale-Job-training',
      'nbscale-Job-actions',
      'nbscale-Job nbscale-state-finished',
      'nbscale-Job-actions'
    ]);
    expect(rows[1].textContent).toBe(
      'epoch 2/4 · iteration 50/200 · loss 0.5 · 30 s left'
    );
    const fill = rows[1].querySelector('.nbscale-Bar-fill') as HTMLElement;
    expect(fill.style.width).toBe('25%');
  });

  it('shows the error the server gives when it cannot read the pools or the jobs', async () => {
    const model = modelWith(noGpu, {
      pools: { pools: [], error: 'The pool registry cannot be read: bad file' },
      jobs: {
        jobs: [],
        available: true,
        error: 'The job store index jobs.sqlite is damaged: move it aside.'
      }
    });
    const panel = panelFor(model, []);
    await model.update();
    MessageLoop.sendMessage(panel, Widget.Msg.UpdateRequest);
    const errorIn = (section: string) =>
      panel.node.querySelector(`.nbscale-${section} .nbscale-Error`)
        ?.textContent;
    expect(errorIn('pools')).toBe('The pool registry cannot be read: bad file');
    expect(errorIn('jobs')).toBe(
      'The job store index jobs.sqlite is damaged: move it aside.'
    );
    expect(errorIn('gpus')).toBeUndefined();
  });

  it('says when the server cannot be reached, and shows no placeholder as if the server had said it', async () => {
    let reachable = false;
    const fetchJson = (async (endPoint: string) => {
      if (!reachable) {
        throw new Error('Failed to fetch');
      }
      return {
        pools: { pools: [pool] },
        gpus: noGpu,
        jobs: { jobs, available: true }
      }[endPoint];
    }) as FetchJson;
    const model = new NbscaleModel({
      fetchJson,
      resources: ['pools', 'gpus', 'jobs'],
      isVisible: () => false
    });
    const panel = panelFor(model, []);
    const item = attach(
      new PoolStatusItem({
        model,
        currentKernelId: () => 'kernel-a',
        openPanel: () => undefined
      })
    );
    const show = async () => {
      await model.update();
      MessageLoop.sendMessage(panel, Widget.Msg.UpdateRequest);
      MessageLoop.sendMessage(item, Widget.Msg.UpdateRequest);
    };

    await show(); // never answered: no "No GPU." nor "jobs are not installed" invented from nothing
    expect(panel.node.querySelector('.nbscale-Error')?.textContent).toContain(
      "Cannot reach nbscale's server extension: Failed to fetch."
    );
    expect(panel.node.textContent).not.toContain('No GPU');
    expect(panel.node.textContent).not.toContain('not installed');
    expect(panel.node.textContent).not.toContain('No pool is running');

    reachable = true;
    await show();
    expect(panel.node.querySelector('.nbscale-Error')).toBeNull();
    expect(panel.node.querySelectorAll('.nbscale-Stale')).toHaveLength(0);
    expect(item.node.textContent).toBe('2 workers · 1 busy');

    reachable = false; // the server went away: the last answer stays, greyed, under the error
    await show();
    expect(panel.node.querySelector('.nbscale-Error')?.textContent).toMatch(
      /Failed to fetch\..*Below: what it said at/
    );
    expect(panel.node.querySelectorAll('section.nbscale-Stale')).toHaveLength(
      3
    );
    expect(panel.node.querySelectorAll('.nbscale-Worker')).toHaveLength(2);
    expect(item.node.textContent).toBe(''); // no pool claimed from an old answer
    expect(item.node.style.display).toBe('none');
  });
});
