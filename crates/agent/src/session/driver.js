// plimsoll-agent's session driver for JavaScript (docs/agent.md, "Sessions"), run as
// `node -e DRIVER` with the agent's pipes at descriptors 3 (cells in) and 4 (one byte out
// per event: R ready, 0 a cell completed, 1 it threw). Every cell is a script run in this
// context, so its `var`, `function`, `let`, `const` and `class` stay for the next. The
// driver's own names live in this block, out of the cells' sight.
{
  const fs = require('fs');
  // The memory limit's OOM killer picks the cells' interpreter (and what it starts) before
  // the agent that holds the session: raising one's own score needs no privilege.
  try {
    fs.writeFileSync('/proc/self/oom_score_adj', '1000');
  } catch {}
  const net = require('net');
  const path = require('path');
  const util = require('util');
  const vm = require('vm');
  // A node a cell forks runs its own file, not this driver.
  const i = process.execArgv.indexOf('-e');
  if (i >= 0) process.execArgv.splice(i, 2);
  // Modules resolve from the work directory, as a file there would.
  globalThis.require = require('module').createRequire(path.join(process.cwd(), '[cell]'));

  // Everything the stream holds is written before the cell is reported done (a write to
  // a full pipe is queued, not blocking).
  const flushed = (s) =>
    s.writableLength === 0 ? undefined : new Promise((resolve) => s.write('', () => resolve()));

  // What bare node prints for an uncaught exception: an error's stack (with the cell's
  // line and a caret when it threw while the script ran), anything else inspected. The
  // frames of this driver (file `[eval]`) and of the vm call under them are cut.
  const report = (e) => {
    const error = e instanceof Error || util.types.isNativeError(e);
    if (!error || typeof e.stack !== 'string') return `Uncaught ${util.inspect(e)}`;
    const lines = e.stack.split('\n');
    let end = lines.findIndex((l) => /^\s+at .*\[eval\]/.test(l));
    if (end < 0) return util.inspect(e);
    while (end > 0 && /^\s+at .*\(node:vm:/.test(lines[end - 1])) end -= 1;
    e.stack = lines.slice(0, end).join('\n');
    // Without a frame left (a syntax error), inspect would bracket it.
    return lines.slice(0, end).some((l) => /^\s+at /.test(l)) ? util.inspect(e) : e.stack;
  };

  const run = async (source, name) => {
    let ok = true;
    try {
      const value = vm.runInThisContext(source, { filename: name });
      // A cell whose value is a promise (an async IIFE, a chain) is done when it settles.
      if (value !== null && (typeof value === 'object' || typeof value === 'function') &&
          typeof value.then === 'function') {
        await value;
      }
    } catch (e) {
      ok = false;
      try {
        process.stderr.write(`${report(e)}\n`);
      } catch {}
    }
    await flushed(process.stdout);
    await flushed(process.stderr);
    fs.writeSync(4, ok ? '0' : '1');
  };

  // Cells arrive as `LENGTH\n` and that many bytes of UTF-8, one at a time: the agent sends
  // the next only after this one's byte on descriptor 4. Read through the event loop, so
  // timers and promises of earlier cells keep running between cells.
  const cells = new net.Socket({ fd: 3, readable: true, writable: false });
  let parts = [];
  let have = 0;
  let want = -1;
  let busy = false;
  let count = 0;
  const take = (n) => {
    const all = parts.length === 1 ? parts[0] : Buffer.concat(parts, have);
    parts = all.length > n ? [all.subarray(n)] : [];
    have = all.length - n;
    return all.subarray(0, n);
  };
  const next = () => {
    if (busy) return;
    if (want < 0) {
      const all = take(have);
      const nl = all.indexOf(10);
      parts = [all];
      have = all.length;
      if (nl < 0) return;
      want = Number(take(nl + 1).toString('latin1').trim());
    }
    if (have < want) return;
    const source = take(want).toString('utf8');
    want = -1;
    busy = true;
    count += 1;
    run(source, `<cell ${count}>`).then(() => {
      busy = false;
      next();
    });
  };
  cells.on('data', (d) => {
    parts.push(d);
    have += d.length;
    next();
  });
  // The agent went away: nothing more will come.
  cells.on('end', () => process.exit(0));
  cells.on('error', () => process.exit(0));
  fs.writeSync(4, 'R');
}
