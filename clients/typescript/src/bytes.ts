/**
 * Exact bytes on the wire: a JSON string stands for its UTF-8, `{"base64": "..."}` for any
 * bytes (strict standard base64). Output, file contents and artifacts are `Uint8Array`s.
 * @module
 */

const utf8Strict = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
// ignoreBOM keeps a leading U+FEFF as a character: the default would drop three bytes.
const utf8Lossy = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
const utf8Encoder = new TextEncoder();

/** The UTF-8 encoding of `s` (which must be well-formed Unicode). */
export function utf8(s: string): Uint8Array {
  return utf8Encoder.encode(s);
}

/**
 * The text of `bytes` read as UTF-8. Invalid sequences become U+FFFD unless `fatal` is set,
 * in which case they throw a `TypeError`. A leading byte order mark is kept.
 */
export function text(bytes: Uint8Array, options: { fatal?: boolean } = {}): string {
  return (options.fatal === true ? utf8Strict : utf8Lossy).decode(bytes);
}

/** The bytes as a string if they are valid UTF-8, else `undefined`. */
export function utf8Text(bytes: Uint8Array): string | undefined {
  try {
    return utf8Strict.decode(bytes);
  } catch {
    return undefined;
  }
}

/** Standard base64 with padding and nothing else: RFC 4648's alphabet, `=` only at the end. */
const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

/** Decodes strict base64, or returns `undefined` (bad character, padding or trailing bits). */
export function decodeBase64(s: string): Uint8Array | undefined {
  if (!BASE64.test(s)) {
    return undefined;
  }
  const buf = Buffer.from(s, "base64");
  // Buffer ignores unused trailing bits; the protocol requires them to be zero, which holds
  // exactly when the bytes encode back to the same text.
  if (buf.toString("base64") !== s) {
    return undefined;
  }
  return new Uint8Array(buf);
}

/** Standard base64 with padding. */
export function encodeBase64(bytes: Uint8Array): string {
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("base64");
}

/** How bytes travel in JSON: a string when they are UTF-8, the base64 object otherwise. */
export function bytesToWire(bytes: Uint8Array): string | { base64: string } {
  const s = utf8Text(bytes);
  return s !== undefined ? s : { base64: encodeBase64(bytes) };
}

/** True when both hold the same bytes. */
export function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  if (a.byteLength !== b.byteLength) {
    return false;
  }
  for (let i = 0; i < a.byteLength; i++) {
    if (a[i] !== b[i]) {
      return false;
    }
  }
  return true;
}

/** Lowercase hex of `bytes`. */
export function hex(bytes: Uint8Array): string {
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("hex");
}
