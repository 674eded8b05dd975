// Compiled (never run) by node.test.js with tsc --strict: the declarations
// in index.d.ts accept what the README shows and reject other types.
import {
  signWebhookPayload,
  verifyWebhookSignature,
  type WebhookBody,
  type WebhookSignature,
} from '@tfa/webhook-verify';

const secret: string = 'a'.repeat(64);
const bodies: WebhookBody[] = ['{}', new Uint8Array(2), new ArrayBuffer(2)];
for (const body of bodies) {
  const sig: WebhookSignature = signWebhookPayload(secret, body);
  const valid: boolean = verifyWebhookSignature(secret, body, sig);
  void valid;
}
const header: string | undefined = undefined as string | undefined;
verifyWebhookSignature(secret, '{}', header ?? '');

// @ts-expect-error the secret is text, not bytes
signWebhookPayload(new Uint8Array(2), '{}');
// @ts-expect-error a body is text or bytes, not a number
signWebhookPayload(secret, 42);
// @ts-expect-error the header may be missing: check it first
verifyWebhookSignature(secret, '{}', header);
// @ts-expect-error the result is a sha256= string
const wrong: `sha1=${string}` = signWebhookPayload(secret, '{}');
void wrong;
