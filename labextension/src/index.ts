import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  Clipboard,
  Dialog,
  ISessionContext,
  MainAreaWidget,
  Notification,
  showDialog
} from '@jupyterlab/apputils';
import { IStatusBar } from '@jupyterlab/statusbar';
import { ISignal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { requestAPI } from './handler';
import { nbscaleIcon } from './icon';
import { JobLogView } from './logView';
import { NbscaleModel } from './model';
import { NbscalePanel } from './panel';
import { PoolStatusItem } from './statusItem';
import { FetchJson, IJob, IJobLogReply, IPoolState } from './types';

const OPEN_PANEL = 'nbscale:open-panel';
const PANEL_ID = 'nbscale-panel';

const fetchJson: FetchJson = endPoint => requestAPI(endPoint);

/** The kernel id of the notebook (or console) in front, or null. */
function currentKernelId(shell: JupyterFrontEnd.IShell): string | null {
  const widget = shell.currentWidget as
    (Widget & { sessionContext?: ISessionContext }) | null;
  return widget?.sessionContext?.session?.kernel?.id ?? null;
}

/** Ask before cancelling a job: it is killed at once, with what it has not saved. */
async function confirmCancel(job: IJob): Promise<boolean> {
  const name = job.name ? ` '${job.name}'` : '';
  const result = await showDialog({
    title: `Cancel job ${job.id}${name}?`,
    body:
      `Job ${job.id}${name} and every process it started are stopped at once; ` +
      'the variables it has not saved yet are lost. To end a training and keep its network, use the ' +
      `Stop button of %jobs show ${job.id} instead.`,
    buttons: [
      Dialog.cancelButton({ label: 'Keep running' }),
      Dialog.warnButton({ label: 'Cancel job' })
    ]
  });
  return result.button.accept;
}

/** Run in a pool's kernel by the panel's Stop pool button: `pool.close()`, as `%pool stop`, leaving no names behind. */
const STOP_POOL_CODE =
  '(lambda pool: pool is not None and pool.close())(__import__("nbscale").current_pool(start=False))';

/** Ask, then stop `pool` by running pool.close() in its kernel (queued after a cell that runs there). */
async function stopPool(
  app: JupyterFrontEnd,
  pool: IPoolState,
  isCurrent: boolean
): Promise<void> {
  const where = isCurrent
    ? 'this notebook'
    : `kernel ${(pool.kernel_id ?? String(pool.pid)).slice(0, 8)}`;
  const kernels = app.serviceManager.kernels;
  const model = pool.kernel_id
    ? await kernels.findById(pool.kernel_id)
    : undefined;
  if (!model) {
    Notification.error(
      `The pool of ${where} runs in a kernel this Jupyter server did not start: stop it where it runs ` +
        '(%pool stop, or pool.close()).'
    );
    return;
  }
  const result = await showDialog({
    title: `Stop the pool of ${where}?`,
    body:
      `Its ${pool.workers.length || pool.size} workers stop, as with %pool stop: what runs on them is lost ` +
      'and variables that %%spmd cells left on them are gone. A cell running in that kernel finishes first.',
    buttons: [
      Dialog.cancelButton({ label: 'Keep it' }),
      Dialog.warnButton({ label: 'Stop pool' })
    ]
  });
  if (!result.button.accept) {
    return;
  }
  const kernel = kernels.connectTo({ model });
  try {
    if (kernel.status === 'busy') {
      Notification.info(
        `The pool of ${where} stops once the cell running there ends.`,
        { autoClose: 5000 }
      );
    }
    const reply = await kernel.requestExecute({
      code: STOP_POOL_CODE,
      silent: true,
      store_history: false
    }).done;
    if (reply.content.status !== 'ok') {
      const error = reply.content as { ename?: string; evalue?: string };
      Notification.error(
        `Cannot stop the pool of ${where}: ${error.ename}: ${error.evalue}`
      );
    }
  } catch (error) {
    Notification.error(
      `Cannot stop the pool of ${where}: ${error instanceof Error ? error.message : error}`
    );
  } finally {
    kernel.dispose(); // closes this connection only; the kernel runs on
  }
}

/** The side panel of pools, GPUs and jobs, and the command that opens it. */
const panelPlugin: JupyterFrontEndPlugin<void> = {
  id: 'nbscale:panel',
  description: 'A side panel of nbscale pools, GPUs and batch jobs.',
  autoStart: true,
  optional: [ILabShell],
  activate: (app: JupyterFrontEnd, labShell: ILabShell | null) => {
    // JupyterLab's shell, or Notebook 7's (which has the same right area, without ILabShell)
    const shell: JupyterFrontEnd.IShell = labShell ?? app.shell;
    let panel: NbscalePanel | null = null;
    const model = new NbscaleModel({
      fetchJson,
      resources: ['pools', 'gpus', 'jobs'],
      isVisible: () => panel?.isVisible ?? false
    });
    panel = new NbscalePanel({
      model,
      currentKernelId: () => currentKernelId(shell),
      openLog: job => {
        const content = new JobLogView(job, id =>
          requestAPI<IJobLogReply>(`jobs/${id}/log`)
        );
        if (!labShell) {
          // Notebook 7's main area holds its one notebook: the log opens in a dialog there
          void showDialog({
            title: `Job ${job.id} log`,
            body: content,
            buttons: [Dialog.okButton({ label: 'Close' })]
          });
          return;
        }
        const view = new MainAreaWidget({ content });
        view.title.label = `Job ${job.id} log`;
        shell.add(view, 'main');
      },
      cancelJob: async job => {
        if (!(await confirmCancel(job))) {
          return;
        }
        try {
          await requestAPI(`jobs/${job.id}/cancel`, { method: 'POST' });
        } catch (error) {
          Notification.error(
            `Cannot cancel job ${job.id}: ${error instanceof Error ? error.message : error}`
          );
        }
        await model.refresh();
      },
      stopPool: async (pool, isCurrent) => {
        await stopPool(app, pool, isCurrent);
        await model.refresh();
      },
      copySnippet: snippet => {
        Clipboard.copyToSystem(snippet);
        Notification.info(`Copied: ${snippet}`, { autoClose: 3000 });
      }
    });
    panel.id = PANEL_ID;
    panel.title.icon = nbscaleIcon;
    panel.title.caption = 'nbscale: pools, GPUs and jobs';
    shell.add(panel, 'right', { rank: 900 });

    app.commands.addCommand(OPEN_PANEL, {
      label: 'Show nbscale pools, GPUs and jobs',
      execute: () => shell.activateById(PANEL_ID)
    });
  }
};

/**
 * The status bar item: the current notebook's pool ("4 workers · 2 busy · GPU 63%"); click opens the panel.
 * In Notebook 7, which has no status bar, the same item sits in the page's header.
 */
const statusPlugin: JupyterFrontEndPlugin<void> = {
  id: 'nbscale:pool-status',
  description: "The current notebook's nbscale pool in the status bar.",
  autoStart: true,
  optional: [IStatusBar, ILabShell],
  activate: (
    app: JupyterFrontEnd,
    statusBar: IStatusBar | null,
    labShell: ILabShell | null
  ) => {
    const shell: JupyterFrontEnd.IShell = labShell ?? app.shell;
    const model = new NbscaleModel({
      fetchJson,
      resources: ['pools', 'gpus'],
      isVisible: () => currentKernelId(shell) !== null
    });
    const item = new PoolStatusItem({
      model,
      currentKernelId: () => currentKernelId(shell),
      openPanel: () => void app.commands.execute(OPEN_PANEL)
    });
    // ILabShell and Notebook 7's shell both signal a new widget in front
    const changed = (
      shell as unknown as { currentChanged?: ISignal<unknown, unknown> }
    ).currentChanged;
    changed?.connect(() => {
      item.update();
      void model.refresh();
    });
    item.id = 'nbscale-pool-status';
    if (statusBar) {
      statusBar.registerStatusItem('nbscale:pool-status', {
        item,
        align: 'left',
        rank: 4
      });
    } else {
      // Notebook 7 has no status bar: the item sits in its header, at the right end of the top area
      item.addClass('nbscale-mod-top');
      shell.add(item, 'top', { rank: 1000 });
    }
  }
};

export default [panelPlugin, statusPlugin];
