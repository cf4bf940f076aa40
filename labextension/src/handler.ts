import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/**
 * Call nbscale's server extension: `requestAPI('pools')` is `GET /nbscale/api/pools`.
 *
 * ServerConnection adds the token and XSRF headers, so every call goes through Jupyter's auth.
 * Throws ServerConnection.ResponseError with the server's message on a non-2xx answer.
 */
export async function requestAPI<T>(
  endPoint = '',
  init: RequestInit = {}
): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const requestUrl = URLExt.join(settings.baseUrl, 'nbscale', 'api', endPoint);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(requestUrl, init, settings);
  } catch (error) {
    throw new ServerConnection.NetworkError(error as TypeError);
  }
  const text = await response.text();
  let data: unknown = text;
  if (text.length > 0) {
    try {
      data = JSON.parse(text);
    } catch {
      // not JSON (a proxy's error page): keep the text for the message
    }
  }
  if (!response.ok) {
    const message = (data as { message?: string })?.message ?? String(data);
    throw new ServerConnection.ResponseError(response, message);
  }
  return data as T;
}
