/**
 * Pure helpers that turn the server's JSON into what the status bar and the panel show.
 */
import { IGpuHolder, IGpuInfo, IJob, IJobTraining, IPoolState } from './types';

/** The pool of the kernel with this id, or null (no kernel, or that kernel runs no pool). */
export function poolForKernel(
  pools: readonly IPoolState[],
  kernelId: string | null | undefined
): IPoolState | null {
  if (!kernelId) {
    return null;
  }
  return pools.find(pool => pool.kernel_id === kernelId) ?? null;
}

export function countState(pool: IPoolState, state: string): number {
  return pool.workers.filter(worker => worker.state === state).length;
}

/**
 * The GPUs a pool computes on: those its kernel reserved, else those whose NVML process list holds one of its
 * workers. Where neither says (a cluster pool, and NVML lists no processes), every GPU of a GPU pool.
 */
export function poolGpus(
  pool: IPoolState,
  gpus: readonly IGpuInfo[]
): IGpuInfo[] {
  if (pool.kind !== 'gpu') {
    return [];
  }
  // another user's reservation may name any pid: only the server's user's count
  const reserved = gpus.filter(gpu =>
    (gpu.holders ?? []).some(
      holder =>
        holder.mine === true &&
        holder.pid === pool.pid &&
        holder.purpose === 'pool'
    )
  );
  if (reserved.length > 0) {
    return reserved;
  }
  const pids = new Set(pool.workers.map(worker => worker.pid));
  const used = gpus.filter(gpu =>
    gpu.processes.some(process => pids.has(process.pid))
  );
  return used.length > 0 ? used : [...gpus];
}

/** Mean utilization in percent, rounded; null when no GPU reports one. */
export function meanUtilization(gpus: readonly IGpuInfo[]): number | null {
  const known = gpus
    .map(gpu => gpu.utilization_percent)
    .filter((value): value is number => value !== null && value !== undefined);
  if (known.length === 0) {
    return null;
  }
  return Math.round(
    known.reduce((sum, value) => sum + value, 0) / known.length
  );
}

/** The status bar text: "4 workers · 2 busy · GPU 63%"; empty when there is no pool. */
export function statusText(
  pool: IPoolState | null,
  gpus: readonly IGpuInfo[]
): string {
  if (!pool) {
    return '';
  }
  const size = pool.workers.length || pool.size;
  const parts = [
    `${size} ${size === 1 ? 'worker' : 'workers'}`,
    `${countState(pool, 'busy')} busy`
  ];
  const dead = countState(pool, 'dead');
  if (dead > 0) {
    parts.push(`${dead} dead`);
  }
  const utilization = meanUtilization(poolGpus(pool, gpus));
  if (utilization !== null) {
    parts.push(`GPU ${utilization}%`);
  }
  return parts.join(' · ');
}

/** 42 -> "42 s", 185 -> "3 min 05 s", 7440 -> "2 h 04 min"; "-" for null. */
export function formatElapsed(seconds: number | null | undefined): string {
  if (
    seconds === null ||
    seconds === undefined ||
    !isFinite(seconds) ||
    seconds < 0
  ) {
    return '-';
  }
  const whole = Math.floor(seconds);
  if (whole < 60) {
    return `${whole} s`;
  }
  const pad = (value: number) => String(value).padStart(2, '0');
  if (whole < 3600) {
    return `${Math.floor(whole / 60)} min ${pad(whole % 60)} s`;
  }
  return `${Math.floor(whole / 3600)} h ${pad(Math.floor((whole % 3600) / 60))} min`;
}

/** Idle time left before a pool stops itself: 1799.2 -> "30 min", 42 -> "42 s". */
export function formatIdleLeft(seconds: number): string {
  return seconds >= 60
    ? `${Math.ceil(seconds / 60)} min`
    : `${Math.max(0, Math.ceil(seconds))} s`;
}

/** 123.4 -> "123 MB", 20480 -> "20.0 GB"; "-" for null. */
export function formatMemory(megabytes: number | null | undefined): string {
  if (megabytes === null || megabytes === undefined || !isFinite(megabytes)) {
    return '-';
  }
  if (megabytes >= 1024) {
    return `${(megabytes / 1024).toFixed(1)} GB`;
  }
  return `${Math.round(megabytes)} MB`;
}

/** The Python line that fetches a job's result: `nbscale.jobs.get(3).result("net")`. */
export function resultSnippet(job: IJob): string {
  const name = job.results && job.results.length > 0 ? job.results[0] : 'NAME';
  return `nbscale.jobs.get(${JSON.stringify(job.id)}).result(${JSON.stringify(name)})`;
}

/** A job that can still be cancelled. */
export function isActive(job: IJob): boolean {
  return ['queued', 'running'].includes(job.state);
}

/** Fraction (0-1) of a GPU's memory in use, or null when NVML does not say. */
export function memoryFraction(gpu: IGpuInfo): number | null {
  if (gpu.memory_used_mb === null || !gpu.memory_total_mb) {
    return null;
  }
  return Math.min(1, Math.max(0, gpu.memory_used_mb / gpu.memory_total_mb));
}

/** Three significant digits: 0.23145 -> "0.231", 1234.5 -> "1230", 0.0001234 -> "1.23e-4"; "-" for null. */
export function formatLoss(loss: number | null | undefined): string {
  if (loss === null || loss === undefined || !isFinite(loss)) {
    return '-';
  }
  const plain = String(Number(loss.toPrecision(3)));
  return plain.length <= 6 ? plain : loss.toExponential(2);
}

/**
 * A running job's training in one line: "epoch 3/10 · iteration 120/460 · loss 0.231 · 1 min 05 s left"
 * ("training 2 · ..." first when the job has run more than one).
 */
export function trainingText(training: IJobTraining): string {
  const parts = [
    `epoch ${training.epoch ?? 0}/${training.max_epochs}`,
    `iteration ${training.iteration ?? 0}/${training.total_iterations}`,
    `loss ${formatLoss(training.loss)}`
  ];
  if (training.done) {
    parts.push(training.stop_reason ?? 'done');
  } else if (training.time_left_s !== null) {
    parts.push(`${formatElapsed(training.time_left_s)} left`);
  }
  if (training.trainings > 1) {
    parts.unshift(`training ${training.training}`);
  }
  return parts.join(' · ');
}

/**
 * Who holds a GPU: "alice's pool · analysis.ipynb · pid 4242"; the notebook in front is "this notebook", for a
 * reservation of the server's own user only (another user's file may name any kernel id).
 */
export function holderText(
  holder: IGpuHolder,
  currentKernelId: string | null = null
): string {
  const what = ['pool', 'training'].includes(holder.purpose)
    ? `${holder.user}'s ${holder.purpose}`
    : holder.user;
  const isCurrent =
    holder.mine === true &&
    currentKernelId !== null &&
    holder.kernel_id === currentKernelId;
  const where = isCurrent
    ? 'this notebook'
    : (holder.notebook ??
      (holder.kernel_id ? `kernel ${holder.kernel_id.slice(0, 8)}` : null));
  return [what, where, holder.pid !== null ? `pid ${holder.pid}` : null]
    .filter(Boolean)
    .join(' · ');
}

/** "held by alice's pool · a.ipynb · pid 4242" (each holder, oldest first), or "free". */
export function gpuHoldersText(
  gpu: IGpuInfo,
  currentKernelId: string | null = null
): string {
  const holders = gpu.holders ?? [];
  if (holders.length === 0) {
    return 'free';
  }
  return `held by ${holders.map(holder => holderText(holder, currentKernelId)).join('; ')}`;
}

/**
 * Whose pool it is: its batch job ("job 7 (sweep)"), else its notebook's file name, else its kernel (a pool of
 * an older nbscale, or a kernel Jupyter's server did not start).
 */
export function poolOwner(pool: IPoolState): string {
  if (pool.job_id !== undefined && pool.job_id !== null) {
    return `job ${pool.job_id}` + (pool.job_name ? ` (${pool.job_name})` : '');
  }
  if (pool.notebook) {
    return pool.notebook.split('/').pop() || pool.notebook;
  }
  return `kernel ${(pool.kernel_id ?? String(pool.pid)).slice(0, 8)}`;
}
