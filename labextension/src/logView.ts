import { Widget } from '@lumino/widgets';

import { h } from './dom';
import { IJob, IJobLogReply } from './types';

/** A batch job's log in the main area, with a Reload button (the log grows while the job runs). */
export class JobLogView extends Widget {
  constructor(job: IJob, fetchLog: (id: number) => Promise<IJobLogReply>) {
    super();
    this.addClass('nbscale-JobLog');
    this.id = `nbscale-job-log-${job.id}`;
    this.title.label = `Job ${job.id} log`;
    this.title.closable = true;
    this._job = job;
    this._fetchLog = fetchLog;
    void this.reload();
  }

  async reload(): Promise<void> {
    const reload = h('button', { class: 'jp-Button nbscale-Button' }, 'Reload');
    reload.addEventListener('click', () => void this.reload());
    let text: string;
    try {
      const reply = await this._fetchLog(this._job.id);
      text =
        (reply.truncated ? '… (the start of the log is cut)\n' : '') +
        reply.log;
    } catch (error) {
      text = `Cannot read job ${this._job.id}'s log: ${error instanceof Error ? error.message : String(error)}`;
    }
    this.node.replaceChildren(
      h('div', { class: 'nbscale-JobLog-bar' }, reload),
      h('pre', {}, text)
    );
  }

  private _fetchLog: (id: number) => Promise<IJobLogReply>;
  private _job: IJob;
}
