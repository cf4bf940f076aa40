import { describe, expect, it } from 'vitest';

import {
  formatElapsed,
  formatIdleLeft,
  formatLoss,
  formatMemory,
  gpuHoldersText,
  holderText,
  isActive,
  meanUtilization,
  poolForKernel,
  poolGpus,
  poolOwner,
  resultSnippet,
  statusText,
  trainingText
} from '../src/format';
import { IGpuInfo, IPoolState, IWorkerState } from '../src/types';

function worker(rank: number, state: string, pid = 100 + rank): IWorkerState {
  return { rank, host: 'node1', pid, device: 'cpu', state, memory_mb: 120.4 };
}

function pool(
  kernelId: string | null,
  states: string[],
  kind = 'cpu'
): IPoolState {
  return {
    kernel_id: kernelId,
    size: states.length,
    kind,
    backend: 'local',
    idle_timeout_left_s: 1800,
    workers: states.map((state, rank) => worker(rank, state)),
    pid: 4242,
    heartbeat: 1700000000
  };
}

function gpu(
  index: number,
  utilization: number | null,
  pids: number[] = []
): IGpuInfo {
  return {
    index,
    nvml_index: index,
    name: 'NVIDIA H100',
    compute_capability: '9.0',
    memory_used_mb: 1024,
    memory_total_mb: 81920,
    utilization_percent: utilization,
    temperature_c: 40,
    power_w: 100,
    power_limit_w: 700,
    processes: pids.map(pid => ({ pid, name: 'python', memory_used_mb: 500 }))
  };
}

describe('poolForKernel', () => {
  const pools = [pool('k1', ['idle']), pool('k2', ['idle', 'idle'])];

  it('finds the pool the kernel published', () => {
    expect(poolForKernel(pools, 'k2')?.size).toBe(2);
  });

  it('finds nothing for another kernel or no kernel', () => {
    expect(poolForKernel(pools, 'k3')).toBeNull();
    expect(poolForKernel(pools, null)).toBeNull();
    expect(poolForKernel([pool(null, ['idle'])], null)).toBeNull();
  });
});

describe('statusText', () => {
  it('is empty without a pool', () => {
    expect(statusText(null, [gpu(0, 50)])).toBe('');
  });

  it('counts workers and busy ones for a CPU pool, without a GPU figure', () => {
    expect(statusText(pool('k', ['idle', 'busy']), [gpu(0, 50)])).toBe(
      '2 workers · 1 busy'
    );
    expect(statusText(pool('k', ['idle']), [])).toBe('1 worker · 0 busy');
  });

  it("shows the mean utilization of the GPUs the pool's workers run on", () => {
    const gpuPool = pool('k', ['busy', 'busy', 'idle', 'idle'], 'gpu');
    const gpus = [gpu(0, 60, [100]), gpu(1, 66, [101]), gpu(2, 0, [999])];
    expect(statusText(gpuPool, gpus)).toBe('4 workers · 2 busy · GPU 63%');
  });

  it('uses the GPUs the pool reserved where the registry names them', () => {
    const gpuPool = pool('k', ['busy'], 'gpu');
    const reservedBy = (pid: number, purpose: string) => ({
      user: 'me',
      uid: 1000,
      pid,
      purpose,
      notebook: null,
      kernel_id: null,
      since: 0,
      mine: true
    });
    const gpus = [
      { ...gpu(0, 90), holders: [reservedBy(7, 'pool')] },
      { ...gpu(1, 40), holders: [reservedBy(4242, 'pool')] },
      { ...gpu(2, 10), holders: [reservedBy(4242, 'training')] },
      // another user's reservation naming this pool's pid is not this pool's
      { ...gpu(3, 70), holders: [{ ...reservedBy(4242, 'pool'), mine: false }] }
    ];
    expect(poolGpus(gpuPool, gpus).map(g => g.index)).toEqual([1]);
    expect(statusText(gpuPool, gpus)).toBe('1 worker · 1 busy · GPU 40%');
    expect(holderText(reservedBy(7, 'pool'))).toBe("me's pool · pid 7");
    expect(gpuHoldersText(gpu(3, 0))).toBe('free');
  });

  it('uses every GPU when NVML lists no processes, and reports dead workers', () => {
    const gpuPool = pool('k', ['busy', 'dead'], 'gpu');
    expect(statusText(gpuPool, [gpu(0, 10), gpu(1, 30)])).toBe(
      '2 workers · 1 busy · 1 dead · GPU 20%'
    );
    expect(poolGpus(gpuPool, []).length).toBe(0);
    expect(meanUtilization([gpu(0, null)])).toBeNull();
  });
});

describe('formatting', () => {
  it('formats elapsed times', () => {
    expect(formatElapsed(42.7)).toBe('42 s');
    expect(formatElapsed(185)).toBe('3 min 05 s');
    expect(formatElapsed(7440)).toBe('2 h 04 min');
    expect(formatElapsed(null)).toBe('-');
    expect(formatIdleLeft(1799.2)).toBe('30 min');
    expect(formatIdleLeft(42.1)).toBe('43 s');
  });

  it('formats memory', () => {
    expect(formatMemory(123.4)).toBe('123 MB');
    expect(formatMemory(20480)).toBe('20.0 GB');
    expect(formatMemory(null)).toBe('-');
  });

  it("writes the snippet that fetches a job's result", () => {
    const job = {
      id: 3,
      name: 'run',
      state: 'finished',
      started: null,
      elapsed_s: 5,
      results: ['net', 'info']
    };
    expect(resultSnippet(job)).toBe('nbscale.jobs.get(3).result("net")');
    expect(resultSnippet({ ...job, results: [] })).toBe(
      'nbscale.jobs.get(3).result("NAME")'
    );
    expect(isActive(job)).toBe(false);
    expect(isActive({ ...job, state: 'running' })).toBe(true);
  });

  it("writes a running job's training: epoch, iteration, last loss, time left", () => {
    const training = {
      training: 1,
      trainings: 1,
      epoch: 3,
      max_epochs: 10,
      iteration: 120,
      total_iterations: 460,
      loss: 0.23145,
      validation_loss: null,
      time_left_s: 65.4,
      done: false,
      stop_reason: null
    };
    expect(trainingText(training)).toBe(
      'epoch 3/10 · iteration 120/460 · loss 0.231 · 1 min 05 s left'
    );
    expect(
      trainingText({
        ...training,
        training: 2,
        trainings: 2,
        done: true,
        time_left_s: 0,
        stop_reason: 'Stopped from the job monitor'
      })
    ).toBe(
      'training 2 · epoch 3/10 · iteration 120/460 · loss 0.231 · Stopped from the job monitor'
    );
    expect(
      trainingText({
        ...training,
        epoch: null,
        iteration: null,
        loss: null,
        time_left_s: null
      })
    ).toBe('epoch 0/10 · iteration 0/460 · loss -');
    expect(formatLoss(1234.5)).toBe('1230');
    expect(formatLoss(0.0001234)).toBe('1.23e-4');
    expect(formatLoss(null)).toBe('-');
  });
});

describe('poolOwner', () => {
  it('names a batch job by id and name, else a notebook by its file, else the kernel', () => {
    const base = pool('0123456789abcdef', ['idle']);
    expect(
      poolOwner({ ...base, job_id: 7, job_name: 'sweep', notebook: null })
    ).toBe('job 7 (sweep)');
    expect(poolOwner({ ...base, job_id: 7, job_name: null })).toBe('job 7');
    expect(poolOwner({ ...base, notebook: 'work/analysis.ipynb' })).toBe(
      'analysis.ipynb'
    );
    expect(poolOwner(base)).toBe('kernel 01234567');
    expect(poolOwner({ ...pool(null, ['idle']), notebook: null })).toBe(
      'kernel 4242'
    );
  });
});
