/**
 * The JSON the nbscale server extension serves under /nbscale/api/ (see nbscale/server/handlers.py).
 */

/** One worker of a pool, as the pool publishes it every few seconds. */
export interface IWorkerState {
  rank: number;
  host: string;
  pid: number;
  device: string;
  state: 'idle' | 'busy' | 'dead' | string;
  memory_mb: number | null;
  device_memory_mb?: number | null;
}

/** A running pool: `GET /nbscale/api/pools` answers `{pools: IPoolState[]}`. */
export interface IPoolState {
  kernel_id: string | null;
  /** The notebook the pool's kernel runs (its path, from Jupyter's session), where known. */
  notebook?: string | null;
  /** The batch job the pool runs in, where it runs in one. */
  job_id?: number | null;
  job_name?: string | null;
  connection_file?: string | null;
  size: number;
  kind: 'cpu' | 'gpu' | string;
  backend: 'local' | 'ray' | string;
  idle_timeout_left_s: number | null;
  workers: IWorkerState[];
  /** The kernel's process id. */
  pid: number;
  /** When the pool last published, in seconds since the epoch. */
  heartbeat: number;
}

export interface IPoolsReply {
  pools: IPoolState[];
  /** Why the pool registry cannot be read (the list is then empty), if it cannot. */
  error?: string;
}

export interface IGpuProcess {
  pid: number;
  name: string | null;
  memory_used_mb: number | null;
}

/**
 * A process holding a GPU in the machine-wide registry (nbscale.gpu_reservations): a pool's kernel or an
 * in-notebook training, any user's. `user` is the reservation file's owner, so it cannot be faked.
 */
export interface IGpuHolder {
  user: string;
  uid: number;
  pid: number | null;
  purpose: 'pool' | 'training' | string;
  /** The notebook's path where Jupyter named it, else null. */
  notebook: string | null;
  kernel_id: string | null;
  /** Seconds since the epoch. */
  since: number | null;
  /** Whether the server's own user holds it (absent from servers before this field: taken as not). */
  mine?: boolean;
}

/** One GPU from NVML; `GET /nbscale/api/gpus` answers `{gpus: IGpuInfo[], message}`. */
export interface IGpuInfo {
  index: number;
  nvml_index: number;
  name: string;
  compute_capability: string | null;
  memory_used_mb: number | null;
  memory_total_mb: number | null;
  utilization_percent: number | null;
  temperature_c: number | null;
  power_w: number | null;
  power_limit_w: number | null;
  processes: IGpuProcess[];
  /** Who reserved it, oldest first; empty when it is free (absent from servers before reservations). */
  holders?: IGpuHolder[];
}

export interface IGpusReply {
  gpus: IGpuInfo[];
  /** Why there is no GPU ("No GPU: the NVIDIA driver was not found on this machine."), else null. */
  message: string | null;
}

/** Where a running job's latest training stands, from the events it records (nbscale.jobs.training_record). */
export interface IJobTraining {
  /** Its number in the job (1, 2, ...) and how many trainings the job has started. */
  training: number;
  trainings: number;
  epoch: number | null;
  max_epochs: number;
  iteration: number | null;
  total_iterations: number;
  /** The last training loss; null before the first iteration, or when it is not finite. */
  loss: number | null;
  validation_loss: number | null;
  /** Estimated from the time per iteration so far; 0 once done. */
  time_left_s: number | null;
  done: boolean;
  stop_reason: string | null;
}

/** A batch job from nbscale.jobs.list_jobs(). */
export interface IJob {
  id: number;
  name: string | null;
  state: string;
  started: string | null;
  elapsed_s: number | null;
  results?: string[];
  error?: string | null;
  /** A running job's latest training; null for other jobs and before a training starts. */
  training?: IJobTraining | null;
}

export interface IJobsReply {
  jobs: IJob[];
  /** False where nbscale.jobs is not installed. */
  available: boolean;
  /** Why the job store cannot be read (the list is then empty), if it cannot. */
  error?: string;
}

export interface IJobLogReply {
  id: number;
  log: string;
  truncated: boolean;
}

/** What the model fetches; `fetchJson('pools')` is a GET of /nbscale/api/pools. */
export type FetchJson = <T>(endPoint: string, init?: RequestInit) => Promise<T>;
