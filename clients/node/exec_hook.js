'use strict';
/**
 * The exec hook (`--exec-hook CMD`): the Python agent's JSON contract (DESIGN 2.3, and
 * docs/plan-issue31-go-client.md §1), so that one hook serves every client.
 *
 * CMD is split like a POSIX shell word list (Python's shlex.split; no shell runs) and run once
 * per callback, in a new process group, with the event as one JSON object (and a newline) on
 * standard input; standard output and error are captured. Environment: the worker's, plus
 * WORKER_AGENT_EVENT, WORKER_AGENT_GROUP_ID, WORKER_AGENT_MEMBER_ID, WORKER_AGENT_MEMBER_EPOCH.
 * Exit 0 is success; anything else (a non-zero exit, a signal, a command that cannot start, or
 * running past the timeout, after which the whole process group is killed) rejects with a
 * HookFailed whose message names the exit code and the end of standard error, config values
 * masked. What a failure means is the worker's: a failing `revoked` (onStop) or target-state
 * call is retried with backoff, a failing `assigned` (onStart) is made once and reported FAILED,
 * a failing `reconfigured` reports FAILED.
 */

const { spawn } = require('child_process');

const TAIL_BYTES = 2000;
const MIN_MASKED_VALUE = 4; // as the agent's worker_agent/lifecycle.py
/** After the hook exited: how long to wait for the rest of its output (a background child may
 * hold the pipes open for ever: the hook is done when it exits, not when they close). */
const DRAIN_MS = 100;

/**
 * Split `text` into words as a POSIX shell would (shlex.split, comments off): blanks separate
 * words, '...' is literal, "..." keeps blanks and takes \ before \ " $ ` and newline, and a
 * backslash outside quotes takes the next character literally.
 * @param {string} text
 * @returns {string[]}
 */
function shellSplit(text) {
  const words = [];
  let word = null; // null: between words
  let i = 0;
  while (i < text.length) {
    const c = text[i];
    if (/\s/.test(c)) {
      if (word !== null) words.push(word);
      word = null;
      i += 1;
    } else if (c === "'") {
      const end = text.indexOf("'", i + 1);
      if (end < 0) throw new Error(`no closing quotation in ${JSON.stringify(text)}`);
      word = (word || '') + text.slice(i + 1, end);
      i = end + 1;
    } else if (c === '"') {
      word = word || '';
      i += 1;
      for (;;) {
        if (i >= text.length) throw new Error(`no closing quotation in ${JSON.stringify(text)}`);
        const d = text[i];
        if (d === '"') break;
        if (d === '\\' && i + 1 < text.length && '\\"$`\n'.includes(text[i + 1])) {
          if (text[i + 1] !== '\n') word += text[i + 1];
          i += 2;
        } else {
          word += d;
          i += 1;
        }
      }
      i += 1;
    } else if (c === '\\') {
      if (i + 1 >= text.length) throw new Error(`no escaped character in ${JSON.stringify(text)}`);
      if (text[i + 1] !== '\n') word = (word || '') + text[i + 1];
      i += 2;
    } else {
      word = (word || '') + c;
      i += 1;
    }
  }
  if (word !== null) words.push(word);
  return words;
}

/** A hook call that did not succeed; `message` is what goes into a FAILED status's trace. */
class HookFailed extends Error {
  constructor(message, fields) {
    super(message);
    this.name = 'HookFailed';
    Object.assign(this, fields);
    this.stack = message; // the trace is the message: the exit code and the end of stderr
  }
}

/** `text` with the config values of `configs` ({connector: {digest, config}}) masked. */
function maskValues(text, configs) {
  if (!text || !configs) return text;
  const values = new Set();
  Object.values(configs).forEach((held) =>
    Object.values((held && held.config) || {}).forEach((v) => values.add(String(v))),
  );
  [...values]
    .sort((a, b) => b.length - a.length)
    .forEach((v) => {
      if (v.length >= MIN_MASKED_VALUE) text = text.split(v).join('***');
    });
  return text;
}

/** The last TAIL_BYTES of `chunks`, decoded, trimmed; "..." in front when cut. */
function tailOf(chunks) {
  const all = Buffer.concat(chunks);
  const cut = all.length > TAIL_BYTES;
  const text = all.subarray(Math.max(0, all.length - TAIL_BYTES)).toString('utf8').trim();
  return cut ? `...${text}` : text;
}

/**
 * The agent's event object (RebalanceEvent.to_json) from what a Worker callback is handed.
 * @param {string} event assigned | revoked | reconfigured | paused | resumed | stopped
 * @param {object} given the callback's argument ({connectors, tasks, fencing_tokens, configs,
 *   target_states, reason})
 * @param {{groupId: string, memberId: string, memberEpoch: number}} who
 */
function eventJson(event, given, who) {
  const out = {
    event,
    group_id: who.groupId,
    member_id: who.memberId,
    member_epoch: who.memberEpoch,
    connectors: [...given.connectors].sort(),
    tasks: [...given.tasks]
      .map(({ connector, task }) => ({ connector, task }))
      .sort((a, b) => (a.connector < b.connector ? -1 : a.connector > b.connector ? 1 : a.task - b.task)),
    fencing_tokens: given.fencing_tokens || { connectors: {}, tasks: [] },
  };
  if (['assigned', 'reconfigured', 'paused', 'resumed', 'stopped'].includes(event)) {
    out.configs = given.configs || {};
    const states = {};
    Object.entries(given.target_states || {}).forEach(
      ([name, state]) => (states[name] = String(state).replace(/^TARGET_/, '')),
    );
    out.target_states = states;
  }
  if (given.reason) out.reason = given.reason;
  return out;
}

/**
 * Run the hook once for `body` (the event object).
 * @param {string[]} argv
 * @param {object} body
 * @param {number} timeoutMs
 * @returns {Promise<{stdout: string, stderr: string}>} resolves on exit 0
 */
function runHook(argv, body, timeoutMs) {
  const command = argv.join(' ');
  const env = {
    ...process.env,
    WORKER_AGENT_EVENT: body.event,
    WORKER_AGENT_GROUP_ID: body.group_id,
    WORKER_AGENT_MEMBER_ID: body.member_id,
    WORKER_AGENT_MEMBER_EPOCH: String(body.member_epoch),
  };
  return new Promise((resolve, reject) => {
    const stdout = [];
    const stderr = [];
    let settled = false;
    let timedOut = false;
    let child;
    const fail = (how, fields) => {
      const err = tailOf(stderr) ? maskValues(tailOf(stderr), body.configs) : '';
      const message = `exec hook ${JSON.stringify(command)} (${body.event}) ${how}` +
        (err ? `; stderr: ${err}` : '');
      reject(new HookFailed(message, { ...fields, stderrTail: err }));
    };
    try {
      // detached: a new process group (and session), so that a timeout kills all of it.
      child = spawn(argv[0], argv.slice(1), { env, detached: true, stdio: ['pipe', 'pipe', 'pipe'] });
    } catch (e) {
      reject(new HookFailed(`exec hook ${JSON.stringify(command)} could not start: ${e.message}`, {}));
      return;
    }
    const killGroup = () => {
      try {
        process.kill(-child.pid, 'SIGKILL');
      } catch (e) {
        /* already gone */
      }
    };
    const timer = setTimeout(() => {
      timedOut = true;
      killGroup();
    }, timeoutMs);
    child.stdout.on('data', (d) => stdout.push(d));
    child.stderr.on('data', (d) => stderr.push(d));
    child.stdin.on('error', () => {}); // a hook that does not read its input: EPIPE is fine
    child.on('error', (e) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      reject(new HookFailed(`exec hook ${JSON.stringify(command)} could not start: ${e.message}`, {}));
    });
    child.on('exit', (code, signal) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      let closed = false;
      const finish = () => {
        if (closed) return;
        closed = true;
        child.stdout.destroy();
        child.stderr.destroy();
        if (timedOut) {
          fail(`still running after ${timeoutMs / 1000} s; killed its process group`, {
            timedOut: true,
          });
        } else if (code === 0) {
          resolve({ stdout: tailOf(stdout), stderr: tailOf(stderr) });
        } else if (code === null) {
          fail(`was killed by signal ${signal}`, { signal });
        } else {
          fail(`exited with ${code}`, { exitCode: code });
        }
      };
      child.on('close', finish);
      setTimeout(finish, DRAIN_MS);
    });
    child.stdin.end(JSON.stringify(body) + '\n');
  });
}

/**
 * Worker callbacks (onStart, onStop, onReconfigure, onTargetState) that run the hook.
 * @param {string} commandLine --exec-hook's value
 * @param {number} timeoutS --hook-timeout-s
 * @param {() => {groupId: string, memberId: string, memberEpoch: number}} who read at each call
 * @param {(event: string, fields: object) => void} log the worker's log
 */
function hookCallbacks(commandLine, timeoutS, who, log) {
  const argv = shellSplit(commandLine);
  if (argv.length === 0) throw new Error('--exec-hook needs a command');
  if (!(timeoutS > 0)) throw new Error('--hook-timeout-s must be positive');
  const call = (event) => async (given) => {
    const kind = event === 'target' ? given.event : event;
    // A reconfigured call names the running resources reconfigured, as the agent's does (the
    // library's `connectors` there names the reconfigured connectors, run or not).
    const what = kind === 'reconfigured' && given.resources ? { ...given, ...given.resources } : given;
    const body = eventJson(kind, what, who());
    try {
      await runHook(argv, body, timeoutS * 1000);
    } catch (err) {
      log('hook_failed', { hook_event: body.event, error: err.message });
      throw err;
    }
  };
  return {
    onStart: call('assigned'),
    onStop: call('revoked'),
    onReconfigure: call('reconfigured'),
    onTargetState: call('target'),
  };
}

module.exports = { shellSplit, eventJson, runHook, hookCallbacks, HookFailed, maskValues };
