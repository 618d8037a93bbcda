// plimsoll-host: the in-sandbox client of the plimsoll broker (docs/capability-grants.md).
//
// Preloaded with `node --require plimsoll-host.js` when a run has a grant. Defines the global
// `host` with get, post, put, patch and delete: each sends one call to the broker over the
// run's own channel and returns a promise of the response body (JSON). A status outside
// 200-299, or a call the broker refuses, rejects with a HostError carrying `status` (the
// API's status, or undefined when the API was not called) and `code`.
//
// The channel is the descriptor 3 this process inherited (process tier), or the Unix socket
// named by PLIMSOLL_BROKER_SOCKET (container, gVisor, VM). The code never sees a credential:
// the broker, outside the sandbox, attaches it.
'use strict';

(() => {
  const net = require('net');
  const BROKER_FD = 3;

  class HostError extends Error {
    constructor(message, status, code, body) {
      super(message);
      this.name = 'HostError';
      this.status = status;
      this.code = code;
      this.body = body;
    }
  }

  let socket = null;
  let closed = null;
  let buffered = Buffer.alloc(0);
  let nextId = 1;
  // The broker answers in the order it was asked, so replies are matched first in, first out.
  const pending = [];

  function failAll(err) {
    closed = err;
    while (pending.length > 0) {
      pending.shift().reject(err);
    }
  }

  function channel() {
    if (socket !== null) {
      return socket;
    }
    const path = process.env.PLIMSOLL_BROKER_SOCKET;
    socket = path ? net.createConnection({ path }) : new net.Socket({ fd: BROKER_FD, readable: true, writable: true });
    socket.on('data', onData);
    socket.on('error', (e) => failAll(new HostError(`broker channel failed: ${e.message}`, undefined, 'channel')));
    socket.on('close', () => failAll(new HostError('the broker channel is closed', undefined, 'channel')));
    // An idle channel must not keep the program alive.
    socket.unref();
    return socket;
  }

  function onData(chunk) {
    buffered = Buffer.concat([buffered, chunk]);
    while (buffered.length >= 4) {
      const len = buffered.readUInt32BE(0);
      if (buffered.length < 4 + len) {
        return;
      }
      const text = buffered.subarray(4, 4 + len).toString('utf8');
      buffered = buffered.subarray(4 + len);
      const waiter = pending.shift();
      if (pending.length === 0 && socket !== null) {
        socket.unref();
      }
      if (waiter === undefined) {
        continue;
      }
      let reply;
      try {
        reply = JSON.parse(text);
      } catch (e) {
        waiter.reject(new HostError(`the broker sent an unreadable reply: ${e.message}`, undefined, 'channel'));
        continue;
      }
      settle(waiter, reply);
    }
  }

  function settle(waiter, reply) {
    if (reply.error) {
      const { code, message } = reply.error;
      waiter.reject(new HostError(`${waiter.what}: ${message}`, undefined, code));
    } else if (reply.status >= 200 && reply.status <= 299) {
      waiter.resolve(reply.body);
    } else {
      waiter.reject(new HostError(`${waiter.what}: HTTP status ${reply.status}`, reply.status, 'status', reply.body));
    }
  }

  function call(method, path, body) {
    return new Promise((resolve, reject) => {
      if (typeof path !== 'string') {
        reject(new TypeError(`host.${method.toLowerCase()}: the path must be a string such as "/orders/42"`));
        return;
      }
      if (closed !== null) {
        reject(closed);
        return;
      }
      const message = { id: nextId++, method, path };
      if (body !== undefined) {
        message.body = body;
      }
      let json;
      try {
        json = Buffer.from(JSON.stringify(message), 'utf8');
      } catch (e) {
        reject(new TypeError(`host.${method.toLowerCase()}: the body is not JSON: ${e.message}`));
        return;
      }
      const header = Buffer.alloc(4);
      header.writeUInt32BE(json.length, 0);
      const s = channel();
      pending.push({ resolve, reject, what: `${method} ${path}` });
      s.ref();
      s.write(Buffer.concat([header, json]));
    });
  }

  const host = Object.freeze({
    get: (path) => call('GET', path),
    post: (path, body) => call('POST', path, body),
    put: (path, body) => call('PUT', path, body),
    patch: (path, body) => call('PATCH', path, body),
    delete: (path) => call('DELETE', path),
    HostError,
  });
  Object.defineProperty(globalThis, 'host', { value: host, enumerable: false, writable: false, configurable: false });
})();
