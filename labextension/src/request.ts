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

/** The words HTTP gives every answer of a status: never the server's reason, only its status. */
const GENERIC_MESSAGES = new Set([
  'unhandled error',
  'unknown http error',
  'request failed',
  'internal server error',
  'bad gateway',
  'service unavailable',
  'gateway timeout'
]);

function generic(text: string, statusText: string): boolean {
  const t = text
    .trim()
    .toLowerCase()
    .replace(/^\d{3}\s*:?\s*/, '');
  return !t || t === statusText.trim().toLowerCase() || GENERIC_MESSAGES.has(t);
}

/** The text of an HTML error page (a proxy's): its title, or its body's words, short. */
function htmlText(text: string): string {
  const title = /<title[^>]*>([\s\S]*?)<\/title>/i.exec(text)?.[1];
  const words = (title ?? text.replace(/<[^>]*>/g, ' ')).replace(/\s+/g, ' ').trim();
  return words.length > 200 ? `${words.slice(0, 200)}…` : words;
}

/**
 * Turn an error response into a SandboxAPIError with a readable message: the
 * server's own words (`message`, else `reason`, of a JSON body), never a bare
 * "500 Internal Server Error" when the body says more, and when it says nothing
 * more, a sentence that points at the server's log.
 */
export async function errorFromResponse(response: Response): Promise<SandboxAPIError> {
  let text = '';
  try {
    text = await response.text();
  } catch {
    // no body
  }
  const status = response.status;
  const statusText = response.statusText || '';
  const head = `${status}${statusText ? ` ${statusText}` : ''}`;
  let body: unknown = null;
  try {
    body = JSON.parse(text);
  } catch {
    // not JSON: below
  }
  if (body && typeof body === 'object' && !Array.isArray(body)) {
    const fields = body as { error?: unknown; message?: unknown; reason?: unknown };
    const error = typeof fields.error === 'string' && fields.error ? fields.error : 'HTTPError';
    const said = [fields.message, fields.reason]
      .filter((v): v is string => typeof v === 'string' && !generic(v, statusText))
      .map(v => v.trim());
    const unique = said.filter((v, i) => said.indexOf(v) === i);
    if (unique.length) {
      return new SandboxAPIError(status, error, unique.join(': '));
    }
    if (typeof fields.message === 'string' || typeof fields.reason === 'string') {
      return new SandboxAPIError(status, error, unexplained(head));
    }
  }
  const page = /<\s*(html|body|title|h1)[\s>]/i.test(text) ? htmlText(text) : text.trim();
  const extra = page && !generic(page, statusText) && page.length <= 200 ? `: ${page}` : '';
  return new SandboxAPIError(status, 'HTTPError', extra ? `${head}${extra}` : unexplained(head));
}

/** What to say of an answer that gives no reason. */
function unexplained(head: string): string {
  return head.startsWith('5')
    ? `the server failed (${head}) without saying why: the Jupyter server's log has the cause.`
    : `the server refused the request (${head}) without saying why.`;
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
