import { describe, expect, it } from 'vitest';

import { SpecFormError, buildSpec, defaultForm } from '../src/spec';

const base = defaultForm({ image: '', ttlSeconds: 3600, network: 'egress' });

describe('buildSpec', () => {
  it('turns the default form into a minimal spec', () => {
    expect(buildSpec(base)).toEqual({
      image: null,
      network: 'egress',
      durability: 'ephemeral',
      ttl_seconds: 3600
    });
  });

  it('keeps an image, limits and a persistent workspace key', () => {
    const spec = buildSpec({
      ...base,
      image: ' python:3.12 ',
      durability: 'persistent',
      workspaceKey: 'proj-1',
      cpu: '1.5',
      memoryMb: '512',
      network: 'none'
    });
    expect(spec).toMatchObject({
      image: 'python:3.12',
      durability: 'persistent',
      workspace_key: 'proj-1',
      cpu: 1.5,
      memory_mb: 512,
      network: 'none'
    });
  });

  it.each([
    [{ ttlSeconds: '0' }, 'ttlSeconds', 'TTL'],
    [{ ttlSeconds: 'soon' }, 'ttlSeconds', 'TTL'],
    [{ cpu: '-1' }, 'cpu', 'CPU'],
    [{ memoryMb: '1.5' }, 'memoryMb', 'whole number'],
    [{ durability: 'persistent' as const }, 'workspaceKey', 'needs a workspace key'],
    [{ workspaceKey: 'k' }, 'workspaceKey', 'persistent'],
    [{ durability: 'persistent' as const, workspaceKey: '../x' }, 'workspaceKey', 'letter or digit']
  ])('rejects %o with a message naming the field', (change, field, words) => {
    let error: unknown;
    try {
      buildSpec({ ...base, ...change });
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(SpecFormError);
    expect((error as SpecFormError).field).toBe(field);
    expect((error as SpecFormError).message).toContain(words);
  });
});
