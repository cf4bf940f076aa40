import { IDisposable } from '@lumino/disposable';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import {
  FetchJson,
  IGpusReply,
  IJobsReply,
  IPoolState,
  IPoolsReply
} from './types';

/** What a model fetches on each tick. */
export type Resource = 'pools' | 'gpus' | 'jobs';

export namespace NbscaleModel {
  export interface IOptions {
    /** GET a JSON endpoint under /nbscale/api/ (requestAPI in the extension; a stub in tests). */
    fetchJson: FetchJson;
    /** The endpoints to poll. */
    resources: readonly Resource[];
    /** Milliseconds between refreshes (default 3000: pools publish every 3 s). */
    interval?: number;
    /** Whether anyone looks now; while false the model does not poll (default: always). */
    isVisible?: () => boolean;
  }
}

/**
 * Pools, GPUs and jobs from the server extension, refreshed every few seconds by a @lumino/polling Poll
 * while `isVisible()` holds and the browser tab is shown; `changed` fires after each refresh.
 */
export class NbscaleModel implements IDisposable {
  constructor(options: NbscaleModel.IOptions) {
    this._fetchJson = options.fetchJson;
    this._resources = options.resources;
    this._isVisible = options.isVisible ?? (() => true);
    const interval = options.interval ?? 3000;
    this._poll = new Poll({
      factory: async () => {
        await this.update();
        if (this._error !== null) {
          throw new Error(this._error); // lets the poll back off while the server is away
        }
      },
      frequency: { interval, backoff: true, max: 10 * interval },
      name: 'nbscale:model',
      standby: () => (this._isVisible() ? 'when-hidden' : true)
    });
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get pools(): readonly IPoolState[] {
    return this._pools;
  }

  /** Why the server could not read the pool registry at the last refresh, or null. */
  get poolsError(): string | null {
    return this._poolsError;
  }

  get gpus(): IGpusReply {
    return this._gpus;
  }

  get jobs(): IJobsReply {
    return this._jobs;
  }

  /** Why the last refresh failed (server extension missing, server gone), or null. */
  get error(): string | null {
    return this._error;
  }

  /**
   * When the server last answered (ms since the epoch), or null before its first answer: until then pools, gpus and
   * jobs are placeholders, not what the server said.
   */
  get answeredAt(): number | null {
    return this._answeredAt;
  }

  get isDisposed(): boolean {
    return this._poll.isDisposed;
  }

  /** Fetch now, outside the poll's schedule (when the panel is shown). */
  refresh(): Promise<void> {
    return this._poll.refresh();
  }

  /** Fetch every resource once and fire `changed`; a failure is kept in `error`, never thrown. */
  async update(): Promise<void> {
    try {
      const [pools, gpus, jobs] = await Promise.all([
        this._want('pools') ? this._fetchJson<IPoolsReply>('pools') : null,
        this._want('gpus') ? this._fetchJson<IGpusReply>('gpus') : null,
        this._want('jobs') ? this._fetchJson<IJobsReply>('jobs') : null
      ]);
      this._pools = pools ? pools.pools : this._pools;
      this._poolsError = pools ? (pools.error ?? null) : this._poolsError;
      this._gpus = gpus ?? this._gpus;
      this._jobs = jobs ?? this._jobs;
      this._error = null;
      this._answeredAt = Date.now();
    } catch (error) {
      this._error = error instanceof Error ? error.message : String(error);
    }
    if (!this.isDisposed) {
      this._changed.emit();
    }
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._poll.dispose();
    Signal.clearData(this);
  }

  private _want(resource: Resource): boolean {
    return this._resources.includes(resource);
  }

  private _answeredAt: number | null = null;
  private _changed = new Signal<this, void>(this);
  private _error: string | null = null;
  private _fetchJson: FetchJson;
  private _gpus: IGpusReply = { gpus: [], message: null };
  private _isVisible: () => boolean;
  private _jobs: IJobsReply = { jobs: [], available: false };
  private _poll: Poll;
  private _pools: IPoolState[] = [];
  private _poolsError: string | null = null;
  private _resources: readonly Resource[];
}
