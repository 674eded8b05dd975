/**
 * The raw request body exactly as received: a string (encoded as UTF-8) or
 * its bytes. Node's `Buffer` is a `Uint8Array` and is accepted as is.
 */
export type WebhookBody = string | Uint8Array | ArrayBuffer;

/** A signature header value as the service sends it. */
export type WebhookSignature = `sha256=${string}`;

/**
 * Whether `signatureHeader` is the service's signature of `rawBody`: the
 * HMAC-SHA-256 of the body under the UTF-8 bytes of `secret`, written
 * `sha256=<64 hex>` or as the bare 64 hex digits (either case). Anything
 * else (another prefix, wrong length, non-hex, whitespace) is `false`. The
 * comparison takes constant time.
 *
 * @param secret the webhook's secret exactly as the API returned it.
 * @param rawBody the body bytes as received, before any JSON parsing.
 * @param signatureHeader the `X-Webhook-Signature` header value.
 * @throws {TypeError} if an argument has another type (a missing header is
 *   `undefined`: check for it first).
 * @throws {RangeError} if the inputs do not fit in WebAssembly memory
 *   (about 2 GiB in current engines).
 */
export function verifyWebhookSignature(
  secret: string,
  rawBody: WebhookBody,
  signatureHeader: string,
): boolean;

/**
 * `sha256=<64 lower-case hex>`: the header the service sends for `rawBody`
 * under `secret`. For tests and for services that re-sign forwarded
 * webhooks.
 *
 * @throws {TypeError} if an argument has another type.
 * @throws {RangeError} if the inputs do not fit in WebAssembly memory.
 */
export function signWebhookPayload(
  secret: string,
  rawBody: WebhookBody,
): WebhookSignature;
