import { afterEach, describe, expect, it } from 'vitest';

import { NbscaleModel } from '../src/model';
import { FetchJson } from '../src/types';

const replies: Record<string, unknown> = {
  pools: { pools: [{ kernel_id: 'k1', size: 2, workers: [] }] },
  gpus: {
    gpus: [],
    message: 'No GPU: the NVIDIA driver was not found on this machine.'
  },
  jobs: { jobs: [{ id: 1, state: 'running' }], available: true }
};

function stubServer(fail = false): { fetchJson: FetchJson; calls: string[] } {
  const calls: string[] = [];
  const fetchJson = (async (endPoint: string) => {
    calls.push(endPoint);
    if (fail) {
      throw new Error('404: Not Found');
    }
    return replies[endPoint];
  }) as FetchJson;
  return { fetchJson, calls };
}

const sleep = (ms: number) => new Promise(resolve => setTimeout(resolve, ms));

let model: NbscaleModel | null = null;

afterEach(() => {
  model?.dispose();
  model = null;
});

describe('NbscaleModel', () => {
  it('fetches only its resources and signals the change', async () => {
    const server = stubServer();
    model = new NbscaleModel({
      fetchJson: server.fetchJson,
      resources: ['pools', 'gpus'],
      isVisible: () => false
    });
    let changes = 0;
    model.changed.connect(() => changes++);
    await model.update();
    expect(server.calls.sort()).toEqual(['gpus', 'pools']);
    expect(model.pools[0].kernel_id).toBe('k1');
    expect(model.gpus.message).toMatch(/^No GPU/);
    expect(model.jobs).toEqual({ jobs: [], available: false });
    expect(changes).toBe(1);
  });

  it('keeps a failure as an error instead of throwing', async () => {
    model = new NbscaleModel({
      fetchJson: stubServer(true).fetchJson,
      resources: ['jobs'],
      isVisible: () => false
    });
    await model.update();
    expect(model.error).toBe('404: Not Found');
  });

  it('polls while visible and stops polling while hidden', async () => {
    const server = stubServer();
    let visible = false;
    model = new NbscaleModel({
      fetchJson: server.fetchJson,
      resources: ['pools'],
      interval: 10,
      isVisible: () => visible
    });
    await sleep(100);
    expect(server.calls).toEqual([]);
    visible = true;
    await sleep(200);
    const whileVisible = server.calls.length;
    expect(whileVisible).toBeGreaterThan(0);
    visible = false;
    await sleep(50); // a tick already scheduled may still land
    const afterHiding = server.calls.length;
    await sleep(150);
    expect(server.calls.length).toBe(afterHiding);
  });
});
