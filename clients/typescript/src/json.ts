/**
 * A strict JSON reader for the daemon's answers: refuses duplicate member names, lone
 * surrogates and invalid UTF-8, and keeps every number's text, so an integer is read exactly
 * (JSON.parse would silently keep the last duplicate, round integers above 2^53 and accept
 * "\ud800", and each of those could make this client digest something the daemon did not).
 * @module
 */

/** A JSON number, kept as the text it was written as. */
export class JsonNumber {
  constructor(readonly text: string) {}
}

/** An object's members in the order they came, names unique. */
export type JsonObject = Map<string, JsonValue>;

/** A parsed JSON value. */
export type JsonValue = null | boolean | string | JsonNumber | JsonValue[] | JsonObject;

/** Why a body is not JSON this client accepts. */
export class JsonSyntaxError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "JsonSyntaxError";
  }
}

/** Deeper nesting than any answer of protocol 1 has; bounds the reader's recursion. */
const MAX_DEPTH = 128;

const utf8Strict = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/** Parses UTF-8 JSON bytes (or text already decoded). */
export function parseJson(input: Uint8Array | string): JsonValue {
  let text: string;
  if (typeof input === "string") {
    text = input;
  } else {
    try {
      text = utf8Strict.decode(input);
    } catch {
      throw new JsonSyntaxError("the body is not valid UTF-8");
    }
  }
  const p = new Parser(text);
  p.ws();
  const v = p.value(0);
  p.ws();
  if (p.i !== text.length) {
    p.fail("unexpected text after the JSON value");
  }
  return v;
}

class Parser {
  i = 0;
  constructor(private readonly s: string) {}

  fail(what: string): never {
    throw new JsonSyntaxError(`${what} at offset ${this.i}`);
  }

  ws(): void {
    const s = this.s;
    while (this.i < s.length) {
      const c = s.charCodeAt(this.i);
      if (c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d) {
        this.i++;
      } else {
        break;
      }
    }
  }

  value(depth: number): JsonValue {
    if (depth > MAX_DEPTH) {
      this.fail(`nesting deeper than ${MAX_DEPTH}`);
    }
    const c = this.s[this.i];
    switch (c) {
      case "{":
        return this.object(depth);
      case "[":
        return this.array(depth);
      case '"':
        return this.string();
      case "t":
        return this.literal("true", true);
      case "f":
        return this.literal("false", false);
      case "n":
        return this.literal("null", null);
      default:
        if (c === "-" || (c !== undefined && c >= "0" && c <= "9")) {
          return this.number();
        }
        return this.fail(c === undefined ? "unexpected end of the body" : "unexpected character");
    }
  }

  literal<T>(word: string, v: T): T {
    if (!this.s.startsWith(word, this.i)) {
      this.fail("unexpected character");
    }
    this.i += word.length;
    return v;
  }

  number(): JsonNumber {
    const re = /-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?/y;
    re.lastIndex = this.i;
    const m = re.exec(this.s);
    if (m === null || m[0] === "-") {
      this.fail("malformed number");
    }
    this.i += m[0].length;
    return new JsonNumber(m[0]);
  }

  string(): string {
    const s = this.s;
    this.i++; // the opening quote
    let out = "";
    let start = this.i;
    for (;;) {
      if (this.i >= s.length) {
        this.fail("unterminated string");
      }
      const c = s.charCodeAt(this.i);
      if (c === 0x22) {
        out += s.slice(start, this.i);
        this.i++;
        break;
      }
      if (c < 0x20) {
        this.fail("control character in a string");
      }
      if (c !== 0x5c) {
        this.i++;
        continue;
      }
      out += s.slice(start, this.i);
      const e = s[this.i + 1];
      this.i += 2;
      switch (e) {
        case '"':
          out += '"';
          break;
        case "\\":
          out += "\\";
          break;
        case "/":
          out += "/";
          break;
        case "b":
          out += "\b";
          break;
        case "f":
          out += "\f";
          break;
        case "n":
          out += "\n";
          break;
        case "r":
          out += "\r";
          break;
        case "t":
          out += "\t";
          break;
        case "u": {
          const hex = s.slice(this.i, this.i + 4);
          if (!/^[0-9a-fA-F]{4}$/.test(hex)) {
            this.fail("malformed \\u escape");
          }
          out += String.fromCharCode(parseInt(hex, 16));
          this.i += 4;
          break;
        }
        default:
          this.i -= 2;
          this.fail("unknown escape");
      }
      start = this.i;
    }
    // Escaped halves join into pairs above; one left alone has no UTF-8 encoding to digest.
    if (!out.isWellFormed()) {
      this.fail("a string holds a lone surrogate (not valid Unicode)");
    }
    return out;
  }

  array(depth: number): JsonValue[] {
    this.i++;
    const out: JsonValue[] = [];
    this.ws();
    if (this.s[this.i] === "]") {
      this.i++;
      return out;
    }
    for (;;) {
      this.ws();
      out.push(this.value(depth + 1));
      this.ws();
      const c = this.s[this.i];
      this.i++;
      if (c === "]") {
        return out;
      }
      if (c !== ",") {
        this.i--;
        this.fail("expected `,` or `]`");
      }
    }
  }

  object(depth: number): JsonObject {
    this.i++;
    const out: JsonObject = new Map();
    this.ws();
    if (this.s[this.i] === "}") {
      this.i++;
      return out;
    }
    for (;;) {
      this.ws();
      if (this.s[this.i] !== '"') {
        this.fail("expected a member name");
      }
      const at = this.i;
      const name = this.string();
      if (out.has(name)) {
        this.i = at;
        this.fail(`duplicate member \`${name}\``);
      }
      this.ws();
      if (this.s[this.i] !== ":") {
        this.fail("expected `:`");
      }
      this.i++;
      this.ws();
      out.set(name, this.value(depth + 1));
      this.ws();
      const c = this.s[this.i];
      this.i++;
      if (c === "}") {
        return out;
      }
      if (c !== ",") {
        this.i--;
        this.fail("expected `,` or `}`");
      }
    }
  }
}
