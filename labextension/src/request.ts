/**
 * Calls to the sandbox REST API, always through ServerConnection.makeRequest
 * (which adds the token, the XSRF header and the base URL).
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** The REST namespace of the server extension (see jupyter_tai_sandbox/api.yaml). */
export const API_NAMESPACE = 'api/sandbox';

/**
 * A failed call: the server's typed error (`{"error", "message"}`), or
 * `NetworkError` (status 0) when the server could not be reached.
 */
export class SandboxAPIError extends Error {
  constructor(
    readonly status: number,
    readonly error: string,
    message: string
  ) {
    super(message);
    this.name = 'SandboxAPIError';
  }

  /** True when the server did not answer at all. */
  get unreachable(): boolean {
    return this.status === 0;
  }
}

/** The URL of an API path, e.g. `apiUrl(settings, 'sessions', id)`. */
export function apiUrl(settings: ServerConnection.ISettings, ...parts: string[]): string {
  return URLExt.join(settings.baseUrl, API_NAMESPACE, ...parts);
}

/** Turn an error response into a SandboxAPIError with a readable message. */
export async function errorFromResponse(response: Response): Promise<SandboxAPIError> {
  let text = '';
  try {
    text = await response.text();
  } catch {
    // no body
  }
  try {
    const body = JSON.parse(text);
    if (body && typeof body.message === 'string') {
      return new SandboxAPIError(
        response.status,
        typeof body.error === 'string' ? body.error : 'HTTPError',
        body.message || `${response.status} ${response.statusText}`
      );
    }
  } catch {
    // not JSON: fall through
  }
  const reason = response.statusText || 'request failed';
  return new SandboxAPIError(
    response.status,
    'HTTPError',
    `${response.status} ${reason}${text && text.length < 200 ? `: ${text}` : ''}`
  );
}

/**
 * Send a request to `/api/sandbox/<endPoint>` and return the response once it
 * is known to be a success; any failure becomes a SandboxAPIError.
 */
export async function requestRaw(
  endPoint: string,
  init: RequestInit = {},
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<Response> {
  const url = apiUrl(settings, endPoint);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    const detail = error instanceof Error ? error.message : String(error);
    throw new SandboxAPIError(
      0,
      'NetworkError',
      `Cannot reach the Jupyter server (${detail}).`
    );
  }
  if (!response.ok) {
    throw await errorFromResponse(response);
  }
  return response;
}

/** Like requestRaw, parsing the JSON body (undefined for an empty body, e.g. 204). */
export async function requestAPI<T>(
  endPoint = '',
  init: RequestInit = {},
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<T> {
  const response = await requestRaw(endPoint, init, settings);
  const text = await response.text();
  if (!text) {
    return undefined as T;
  }
  try {
    return JSON.parse(text) as T;
  } catch {
    throw new SandboxAPIError(
      response.status,
      'BadResponse',
      `The server answered ${endPoint || '/'} with something that is not JSON.`
    );
  }
}
