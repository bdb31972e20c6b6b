#!/usr/bin/env node
'use strict';
/**
 * A small Node.js worker for the connect.group.v1 coordinator. No generated code: it loads the
 * repository's .proto files at run time with @grpc/proto-loader. See README.md.
 *
 * It joins a group, heartbeats, reconciles revoke-before-assign (stop what was revoked, report
 * what it now owns, and only then start new work), computes a target when asked
 * (COMPUTE_ASSIGNMENT, with ./assignor.js), rejoins at epoch 0 when fenced, fences itself when it
 * has not been heard for nearly a session timeout, and leaves the group on SIGTERM/SIGINT.
 *
 * Every line it prints on stdout is one JSON object with `ts` (Unix time in seconds, fractional)
 * and `event`; `start` and `stop` lines carry the resources: a resource may run from the `ts` of
 * the `start` line that names it until the `ts` of the `stop` line that names it.
 *
 * Fencing tokens (DESIGN 3.18): every assignment carries a token per resource; `assignment`,
 * `start` and `stop` lines, and the objects handed to onStart/onStop, carry the tokens of their
 * resources as `fencing_tokens: {connectors: {name: token}, tasks: [{connector, task, token}]}`.
 *
 * Connector lifecycle (DESIGN 3.20): it fetches the configs of what it holds
 * (ConnectGroupConfigs) after each join and whenever a heartbeat answer's lifecycle_revision
 * differs from the one its last fetch reflected, and starts new work only once it has them
 * (onStart gets `configs`; a held connector whose digest changed goes to onReconfigure). Its log
 * lines carry config digests, never values. It reports what it runs (ConnectGroupReportStatus):
 * RUNNING once onStart resolved, FAILED with the error when onStart throws (made once: it runs
 * again only on a restart); changes only, one call in flight, at most one per heartbeat
 * interval. Both calls wait out THROTTLING_QUOTA_EXCEEDED's throttle_time_ms. Target states and
 * restarts (DESIGN 3.20, issue 29): a held connector's target state change goes to
 * onTargetState (paused, resumed, stopped) and is reported PAUSED, RUNNING or STOPPED; a restart
 * count above the one acted on restarts the resource in place (onStop then onStart, reason
 * "restart"), a start recording the count of the answer it started with.
 */

const crypto = require('crypto');
const fs = require('fs');
const os = require('os');
const path = require('path');
const { parseArgs } = require('util');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { assign } = require('./assignor');
const { hookCallbacks } = require('./exec_hook');

const DEFAULT_PROTOS = path.resolve(__dirname, '..', '..', 'protos');
const DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024;

/** What this client advertises: incremental_cooperative, version 1 only (see README.md). */
const ASSIGNOR = {
  name: 'incremental_cooperative',
  minimum_version: 1,
  maximum_version: 1,
  reason: 0,
  version: 1,
  metadata: Buffer.alloc(0),
};

const SUCCESS = new Set(['NONE', 'COMPUTE_ASSIGNMENT']);
/** Heartbeat: not (or no longer) a member. Stop everything, rejoin at epoch 0. */
const REJOIN = new Set(['FENCED_MEMBER_EPOCH', 'UNKNOWN_MEMBER_ID']);
/**
 * Configuration errors of a join (DESIGN 3.19): what the operator should do, on the `fatal` line.
 * This client speaks the connect protocol only.
 */
const CONFIGURATION_ERRORS = {
  INCONSISTENT_GROUP_PROTOCOL:
    "the group's group.protocol.migration.policy does not let a connect-protocol worker join " +
    'it: change the policy (coordinator-svc alter-configs GROUP --set ' +
    'group.protocol.migration.policy=upgrade, or bidirectional), or run classic-protocol ' +
    'workers in this group instead',
  UNSUPPORTED_VERSION:
    'the cluster feature group.version is at level 0, which admits no new connect-protocol ' +
    'member: raise it to 1 (coordinator-svc features update --feature group.version --level 1), ' +
    'or run classic-protocol workers instead',
};
/** Retrying unchanged cannot help: stop everything and exit (code 3). */
const FATAL = new Set([
  'FENCED_INSTANCE_ID',
  'UNSUPPORTED_ASSIGNOR',
  'INVALID_GROUP_ID',
  'INVALID_REQUEST',
  'GROUP_AUTHORIZATION_FAILED',
  ...Object.keys(CONFIGURATION_ERRORS),
]);
/** Another (or no) process serves the group: FindCoordinator, reconnect, retry. */
const FIND = new Set(['NOT_COORDINATOR', 'COORDINATOR_NOT_AVAILABLE']);
/** A connector's target state (DESIGN 3.20) -> the event onTargetState is handed with it. */
const TARGET_EVENTS = {
  TARGET_PAUSED: 'paused',
  TARGET_STARTED: 'resumed',
  TARGET_STOPPED: 'stopped',
};
/** The longest trace a status report carries (the coordinator keeps --status-trace-max-bytes). */
const MAX_TRACE_CHARS = 16384;
// Everything else (COORDINATOR_LOAD_IN_PROGRESS, UNKNOWN_SERVER_ERROR, GROUP_MAX_SIZE_REACHED,
// UNRELEASED_INSTANCE_ID, and codes this client does not know): retry after a backoff.

// --- resources: a Set of keys, JSON arrays ["A"] (connector) or ["A", 0] (task) ----------------

/** @param {{connectors: string[], tasks: {connector: string, task: number}[]} | null} cat */
function toSet(cat) {
  const out = new Set();
  if (!cat) return out;
  cat.connectors.forEach((c) => out.add(JSON.stringify([c])));
  cat.tasks.forEach((t) => out.add(JSON.stringify([t.connector, t.task])));
  return out;
}

/**
 * @param {Set<string>} set
 * @returns {{connectors: string[], tasks: {connector: string, task: number}[]}}
 */
function toCat(set) {
  const items = [...set].sort().map((k) => JSON.parse(k));
  return {
    connectors: items.filter((i) => i.length === 1).map((i) => i[0]),
    tasks: items.filter((i) => i.length === 2).map(([connector, task]) => ({ connector, task })),
  };
}

/**
 * The fencing tokens an assignment carries, as a Map from resource key to token. A token's
 * `task` is a proto3 `optional`: present (the synthetic oneof `_task` says so) for a task,
 * ABSENT for the connector's own token.
 * @param {{connector: string, task?: number, _task?: string, token: number}[] | undefined} list
 * @returns {Map<string, number>}
 */
function tokensFrom(list) {
  const out = new Map();
  (list || []).forEach((t) => {
    const isTask = t._task !== undefined ? t._task === 'task' : typeof t.task === 'number';
    out.set(JSON.stringify(isTask ? [t.connector, t.task] : [t.connector]), Number(t.token));
  });
  return out;
}

/**
 * The restart counts of a ConnectGroupConfigs answer (DESIGN 3.20), as a Map from resource key
 * to count; `task` is a proto3 `optional` as in fencing tokens.
 * @param {{connector: string, task?: number, _task?: string, restart_count: number}[] | undefined} list
 * @returns {Map<string, number>}
 */
function restartCountsFrom(list) {
  const out = new Map();
  (list || []).forEach((c) => {
    const isTask = c._task !== undefined ? c._task === 'task' : typeof c.task === 'number';
    out.set(JSON.stringify(isTask ? [c.connector, c.task] : [c.connector]), Number(c.restart_count));
  });
  return out;
}

/**
 * The tokens of `set` among `tokens`, in the agent's JSON shape.
 * @param {Set<string>} set
 * @param {Map<string, number>} tokens
 */
function tokensJson(set, tokens) {
  const out = { connectors: {}, tasks: [] };
  const { connectors, tasks } = toCat(new Set([...set].filter((k) => tokens.has(k))));
  connectors.forEach((c) => (out.connectors[c] = tokens.get(JSON.stringify([c]))));
  tasks.forEach(({ connector, task }) =>
    out.tasks.push({ connector, task, token: tokens.get(JSON.stringify([connector, task])) }),
  );
  return out;
}

/** The connector of a resource key. */
const connectorOf = (/** @type {string} */ key) => JSON.parse(key)[0];

const minus = (/** @type {Set<string>} */ a, /** @type {Set<string>} */ b) =>
  new Set([...a].filter((x) => !b.has(x)));
const union = (/** @type {Set<string>} */ a, /** @type {Set<string>} */ b) => new Set([...a, ...b]);
const keyOf = (/** @type {Set<string>} */ s) => JSON.stringify([...s].sort());
const nowS = () => (performance.timeOrigin + performance.now()) / 1000;

/** Load both services from the .proto files. */
function loadServices(protoRoot) {
  const definition = protoLoader.loadSync(
    ['connect/group/v1/coordinator.proto', 'connect/group/v1/admin.proto'],
    // defaults + oneofs: an absent message field reads as null, and a present proto3 `optional`
    // scalar shows up in its synthetic oneof (e.g. `_instance_id`): absent is not empty.
    {
      includeDirs: [protoRoot],
      keepCase: true,
      enums: String,
      longs: Number,
      defaults: true,
      oneofs: true,
    },
  );
  return grpc.loadPackageDefinition(definition).connect.group.v1;
}

/** Whether a host:port (or [v6]:port) names this machine only. */
function isLoopback(address) {
  let host = address.includes('///') ? address.split('///').pop() : address;
  if (host.startsWith('[')) host = host.slice(1, host.indexOf(']'));
  else if (host.split(':').length === 2) host = host.split(':')[0];
  return host === 'localhost' || host === '::1' || /^127\./.test(host);
}

class Worker {
  /**
   * @param {object} o
   * @param {string[]} o.coordinators host:port addresses, tried in turn by FindCoordinator
   * @param {string} o.groupId
   * @param {string} o.memberId
   * @param {string} [o.instanceId]
   * @param {string} [o.url]
   * @param {number} [o.rebalanceTimeoutMs]
   * @param {number} [o.rpcTimeoutMs]
   * @param {number} [o.maxMessageBytes] largest message sent or received (default 64 MiB,
   *   as the coordinator's --max-message-bytes; gRPC's own receive default is only 4 MiB)
   * @param {string} [o.protoRoot]
   * @param {(r: object) => Promise<void> | void} [o.onStart] start these resources
   *   ({connectors, tasks, fencing_tokens, configs: {connector: {digest, config}},
   *   target_states: {connector: state}, reason}); throwing reports them FAILED; a failed
   *   start is not retried: it runs again only on a restart (reason "restart": the
   *   coordinator's RestartConnector or its automatic restarts)
   * @param {(r: object) => Promise<void> | void} [o.onStop] stop these resources
   *   ({connectors, tasks, fencing_tokens, reason}: the tokens they ran under; reason
   *   "restart" when they are restarted in place and started again right after)
   * @param {(r: object) => Promise<void> | void} [o.onTargetState] a held connector was
   *   paused, resumed or stopped ({connectors, tasks, fencing_tokens, configs, target_states,
   *   target_state: "PAUSED" | "STARTED" | "STOPPED", event: "paused" | "resumed" | "stopped"});
   *   reported PAUSED, RUNNING or STOPPED once it resolves
   * @param {(r: object) => Promise<void> | void} [o.onReconfigure] running resources whose
   *   connector's config changed ({connectors, tasks, fencing_tokens, configs, target_states,
   *   resources}, `connectors` naming the reconfigured connectors, `resources` ({connectors,
   *   tasks}) exactly the running resources reconfigured); throwing reports them FAILED
   * @param {(line: object) => void} [o.log] one JSON object per call (default: stdout)
   * @param {number} [o.retryInitialMs] a failing onStop / onTargetState is retried after this
   *   long (default 200), doubling up to
   * @param {number} [o.retryMaxMs] (default 5000)
   */
  constructor(o) {
    this.o = {
      rebalanceTimeoutMs: 60000,
      rpcTimeoutMs: 5000,
      maxMessageBytes: DEFAULT_MAX_MESSAGE_BYTES,
      protoRoot: DEFAULT_PROTOS,
      retryInitialMs: 200,
      retryMaxMs: 5000,
      ...o,
    };
    this.services = loadServices(this.o.protoRoot);
    this.onStart = o.onStart || (() => {});
    this.onStop = o.onStop || (() => {});
    this.onReconfigure = o.onReconfigure || (() => {});
    this.onTargetState = o.onTargetState || (() => {});
    this.print = o.log || ((line) => process.stdout.write(JSON.stringify(line) + '\n'));
    this.connect(this.o.coordinators[0]);
    /** JOINING | MEMBER | REJOINING | LEAVING | FATAL | LEFT */
    this.phase = 'JOINING';
    this.epoch = 0;
    this.assigned = new Set(); // what the coordinator last said we may run
    this.running = new Set(); // what runs now (a resource being stopped still counts)
    this.starting = new Set(); // being started: reported as owned already
    this.tokens = new Map(); // fencing token per resource assigned or running (DESIGN 3.18)
    this.busy = null; // the start or stop in progress (one at a time)
    this.fullNext = true; // send every field: on a join and after any error
    this.lastReported = null; // the owned list the last answered heartbeat carried
    this.heartbeatIntervalMs = 3000; // until the first answer says otherwise
    this.sessionTimeoutMs = 10000;
    this.lastSuccessSentAt = null; // when the request of the last successful answer was sent
    this.nextHeartbeatAt = 0;
    this.failures = 0;
    this.computing = false;
    this.lastInstalledEpoch = -1;
    this.leaveDeadline = null;
    this.fatal = null;
    // Connector lifecycle (DESIGN 3.20). A revision of 0 in heartbeat answers: nothing was ever
    // granted (or a coordinator without the lifecycle calls): nothing to fetch or report.
    this.revision = 0; // lifecycle_revision of the last heartbeat answer (or newer: fetchConfigs)
    this.revisionsSeen = 0; // how many times a heartbeat answer changed it (see fetchConfigs)
    this.fetchedRevision = null; // of the last ConnectGroupConfigs answer since the join
    this.configs = new Map(); // connector -> {digest, config, target_state} of what it holds
    this.reconfigure = new Set(); // running connectors whose digest changed, for onReconfigure
    // Target states and restarts (DESIGN 3.20): the restart counts of the last answer; per
    // resource started, the count acted on (a grant records the answer's count: a fresh start
    // satisfies earlier restarts) and the target state applied; the resources whose start
    // failed (held, running nothing, started again only on a restart).
    this.restartCounts = new Map();
    this.acted = new Map();
    this.applied = new Map();
    this.failedStarts = new Set();
    this.fetching = false;
    this.fetchNotBefore = 0; // after a failed fetch: not before the next heartbeat interval
    this.memberCallsNotBefore = 0; // THROTTLING_QUOTA_EXCEEDED: both member calls wait
    this.statuses = new Map(); // resource key -> {state, trace}: what it would report now
    this.reported = new Map(); // resource key -> [state, trace, token] last answered
    this.reporting = false;
    this.lastReportAt = -Infinity;
    this.membership = 0; // counts joins: an answer to a call of an earlier membership is dropped
    this.wakeUp = () => {};
  }

  log(event, fields = {}) {
    const { groupId, memberId } = this.o;
    this.print({ ts: nowS(), event, group_id: groupId, member_id: memberId, ...fields });
  }

  /**
   * Channel credentials: TLS when a CA or a client certificate is configured (the files are read
   * at every connect, so a rotated certificate is used from the next reconnect on), plaintext
   * otherwise, which goes only to loopback addresses unless allowPlaintext.
   */
  credentials(address) {
    const { tlsCa, tlsCert, tlsKey } = this.o;
    if (tlsCa || tlsCert || tlsKey) {
      if (Boolean(tlsCert) !== Boolean(tlsKey)) {
        throw new Error('a client certificate needs both --tls-cert and --tls-key');
      }
      const read = (path) => (path ? fs.readFileSync(path) : null);
      return grpc.credentials.createSsl(read(tlsCa), read(tlsKey), read(tlsCert));
    }
    if (!this.o.allowPlaintext && !isLoopback(address)) {
      throw new Error(
        `${address} is not a loopback address and no TLS is configured; ` +
          'pass --tls-ca (and --tls-cert/--tls-key for mTLS), or --allow-plaintext',
      );
    }
    return grpc.credentials.createInsecure();
  }

  connect(address) {
    if (this.coordinator) this.coordinator.close();
    if (this.admin) this.admin.close();
    const creds = this.credentials(address);
    this.address = address;
    this.coordinator = new this.services.ConnectGroupCoordinator(address, creds, this.channelOptions());
    this.admin = new this.services.ConnectGroupAdmin(address, creds, this.channelOptions());
  }

  /** Both message size limits, set explicitly (a large group's Prepare answer exceeds 4 MiB). */
  channelOptions() {
    const options = {
      'grpc.max_receive_message_length': this.o.maxMessageBytes,
      'grpc.max_send_message_length': this.o.maxMessageBytes,
    };
    if (this.o.tlsServerName) options['grpc.ssl_target_name_override'] = this.o.tlsServerName;
    return options;
  }

  /** One unary call with a deadline; rejects only on a transport error (gRPC status not OK). */
  call(client, method, request) {
    return new Promise((resolve, reject) => {
      const deadline = Date.now() + this.o.rpcTimeoutMs;
      client[method](request, { deadline }, (err, resp) => (err ? reject(err) : resolve(resp)));
    });
  }

  get owned() {
    return union(this.running, this.starting);
  }

  /** SIGTERM: stop everything, then leave the group. */
  leave() {
    if (this.phase === 'LEFT' || this.phase === 'LEAVING') return;
    this.log('leaving', { reason: 'signal' });
    if (this.phase !== 'MEMBER') this.epoch = 0; // not a member: nothing to tell the coordinator
    this.phase = this.phase === 'FATAL' ? 'FATAL' : 'LEAVING';
    this.leaveDeadline = Date.now() + 10000;
    this.wakeUp();
  }

  /** Runs until the worker has left; resolves to the process exit code. */
  async run() {
    this.log('starting', { coordinator: this.address, assignor: ASSIGNOR.name, versions: [1, 1] });
    // Fencing and stopping must not wait for a slow heartbeat: check them on a timer too.
    const tick = () => (this.checkSelfFence(), this.reconcile(), this.lifecycle());
    const ticker = setInterval(tick, 100);
    while (this.phase !== 'LEFT') {
      this.checkSelfFence();
      this.reconcile();
      this.lifecycle();
      if (this.heartbeatDue()) {
        await this.heartbeat();
      } else {
        const wait = Math.max(0, Math.min(this.nextHeartbeatAt, Date.now() + 1000) - Date.now());
        await new Promise((resolve) => {
          const timer = setTimeout(resolve, this.busy ? Math.max(wait, 5) : wait);
          this.wakeUp = () => (clearTimeout(timer), resolve());
        });
      }
    }
    clearInterval(ticker);
    this.coordinator.close();
    this.admin.close();
    this.log('stopped', { fatal: this.fatal });
    return this.fatal ? 3 : 0;
  }

  // --- reconciliation: revoke before assign ---------------------------------------------------

  reconcile() {
    if (this.busy) return;
    const stopAll = ['REJOINING', 'LEAVING', 'FATAL'].includes(this.phase);
    const toStop = stopAll ? new Set(this.running) : minus(this.running, this.assigned);
    if (toStop.size > 0) {
      const reason = { REJOINING: 'membership lost', LEAVING: 'leaving', FATAL: 'fatal error' };
      this.busy = this.stopWork(toStop, reason[this.phase] || 'revoked');
    } else if (this.phase === 'MEMBER') {
      // New work starts only once its configs are here; the rest waits for the fetch.
      const toStart = this.withConfigs(minus(this.assigned, this.running));
      if (toStart.size > 0) this.busy = this.startWork(toStart);
      else if (this.reconfigure.size > 0) this.busy = this.reconfigureWork();
      else if (this.fetchedRevision === this.revision && this.revision > 0) {
        const targets = this.targetChanges();
        const restarts = this.dueRestarts();
        if (targets.size > 0) this.busy = this.targetWork(targets);
        else if (restarts.size > 0) this.busy = this.restartWork(restarts);
      }
    }
  }

  /** Running resources whose restart count is above the one acted on (DESIGN 3.20). */
  dueRestarts() {
    return new Set(
      [...this.running].filter(
        (r) => this.acted.has(r) && (this.restartCounts.get(r) || 0) > this.acted.get(r),
      ),
    );
  }

  /**
   * Target state -> running resources (their start did not fail) whose connector's target
   * state differs from the one applied; STOPPED names connectors only (its tasks are revoked).
   */
  targetChanges() {
    const out = new Map();
    this.running.forEach((r) => {
      const held = this.configs.get(connectorOf(r));
      const before = this.applied.get(r);
      if (!held || !before || held.target_state === before || this.failedStarts.has(r)) return;
      if (held.target_state === 'TARGET_STOPPED' && JSON.parse(r).length === 2) return;
      if (!out.has(held.target_state)) out.set(held.target_state, new Set());
      out.get(held.target_state).add(r);
    });
    return out;
  }

  /** What a started resource reports, by its connector's target state. */
  stateFor(r, target) {
    if (target === 'TARGET_PAUSED') return 'PAUSED';
    if (target === 'TARGET_STOPPED') return JSON.parse(r).length === 1 ? 'STOPPED' : 'PAUSED';
    return 'RUNNING';
  }

  /** The start of `resources` returned (ok) or failed, with the counts read before it. */
  recordStart(resources, counts, ok) {
    resources.forEach((r) => {
      this.acted.set(r, counts.get(r) || 0);
      const held = this.configs.get(connectorOf(r));
      this.applied.set(r, held ? held.target_state : 'TARGET_STARTED');
      if (ok) this.failedStarts.delete(r);
      else this.failedStarts.add(r);
    });
  }

  /** onTargetState for the running resources of each connector whose target state changed. */
  async targetWork(changes) {
    await null; // reconcile() stores this promise as `busy` before any of it runs
    for (const [target, resources] of changes) {
      const what = this.described(resources);
      const target_state = target.replace('TARGET_', '');
      const event = TARGET_EVENTS[target]; // the agent's event names (DESIGN 2.3)
      this.log('target_state', { member_epoch: this.epoch, target_state, event, ...what });
      await this.retry(
        () => this.onTargetState({ ...what, ...this.configsOf(resources), target_state, event }),
        'target_state',
      );
      resources.forEach((r) => {
        this.applied.set(r, target);
        this.statuses.set(r, { state: this.stateFor(r, target), trace: '' });
      });
    }
    this.busy = null;
    this.wakeUp();
  }

  /**
   * A restart in place (DESIGN 3.20, KIP-745): onStop then onStart, both with reason "restart",
   * for exactly these resources; ownership does not change (no heartbeat field moves). The
   * stop is retried as any; the start is made once, and only of what this membership still
   * holds when the stop returned (a fence or a revocation meanwhile: the rest stays stopped
   * and is released).
   */
  async restartWork(resources) {
    await null; // reconcile() stores this promise as `busy` before any of it runs
    const membership = this.membership;
    const what = this.described(resources);
    const counts = new Map([...resources].map((r) => [r, this.restartCounts.get(r) || 0]));
    this.log('restart', { member_epoch: this.epoch, ...what });
    // It reads RESTARTING: nothing is reported until the restart resolves, then reported again
    // even if unchanged.
    resources.forEach((r) => (this.statuses.delete(r), this.reported.delete(r)));
    const running = new Set([...resources].filter((r) => !this.failedStarts.has(r)));
    if (running.size > 0) {
      const stop = { ...this.described(running), reason: 'restart' };
      await this.retry(() => this.onStop(stop), 'stop');
    }
    const member = this.phase === 'MEMBER' && membership === this.membership;
    const again = new Set([...resources].filter((r) => member && this.assigned.has(r)));
    const gone = minus(resources, again);
    if (gone.size > 0) this.released(gone, 'revoked during a restart');
    if (again.size > 0) {
      try {
        const start = { ...this.described(again), ...this.configsOf(again), reason: 'restart' };
        await this.onStart(start);
        this.recordStart(again, counts, true);
        again.forEach((r) => {
          const connector = this.configs.get(connectorOf(r));
          const state = this.stateFor(r, connector && connector.target_state);
          this.statuses.set(r, { state, trace: '' });
        });
      } catch (err) {
        this.log('error', { what: 'restart', error: String(err) });
        this.recordStart(again, counts, false);
        this.setStatus(again, 'FAILED', traceOf(err));
      }
    }
    if (gone.size > 0) {
      this.done(); // released: the next heartbeat no longer lists them
    } else {
      this.busy = null;
      this.wakeUp();
    }
  }

  /**
   * Those of `resources` whose connector's config is here, fetched at the revision of the last
   * heartbeat answer (all of them when that revision is 0: nothing to fetch).
   */
  withConfigs(resources) {
    if (this.revision <= 0) return resources;
    if (this.fetchedRevision !== this.revision) return new Set();
    // A connector missing from a fresh answer is not held (deleted): it is being revoked.
    return new Set([...resources].filter((r) => this.configs.has(connectorOf(r))));
  }

  /** The configs and target states of the resources' connectors: for onStart, never logged. */
  configsOf(resources) {
    const configs = {};
    const target_states = {};
    new Set([...resources].map(connectorOf)).forEach((name) => {
      const held = this.configs.get(name);
      if (!held) return;
      configs[name] = { digest: held.digest, config: { ...held.config } };
      target_states[name] = held.target_state;
    });
    return { configs, target_states };
  }

  /** The config digests of the resources' connectors: what log lines carry instead of values. */
  digestsOf(resources) {
    const out = {};
    new Set([...resources].map(connectorOf)).forEach((name) => {
      if (this.configs.has(name)) out[name] = this.configs.get(name).digest;
    });
    return out;
  }

  /** The resources as handed to onStart/onStop and logged: connectors, tasks, their tokens. */
  described(resources) {
    return { ...toCat(resources), fencing_tokens: tokensJson(resources, this.tokens) };
  }

  async stopWork(resources, reason) {
    const epoch = this.epoch;
    const what = this.described(resources);
    // A resource whose start failed runs nothing: it is given up without onStop.
    const started = new Set([...resources].filter((r) => !this.failedStarts.has(r)));
    if (started.size > 0) await this.retry(() => this.onStop(this.described(started)), 'stop');
    this.released(resources, reason, what, epoch);
    this.done(); // acknowledge at once: the next heartbeat no longer lists them
  }

  /** Stopped resources are no longer run nor owned: forget them; the `stop` line says so. */
  released(resources, reason, what = this.described(resources), epoch = this.epoch) {
    resources.forEach((r) => {
      this.running.delete(r);
      this.statuses.delete(r); // released: the coordinator reads it UNASSIGNED until reported
      this.reported.delete(r);
      this.acted.delete(r);
      this.applied.delete(r);
      this.failedStarts.delete(r);
    });
    this.log('stop', { member_epoch: epoch, reason, ...what });
    const keep = union(this.assigned, this.running);
    [...this.tokens.keys()].filter((k) => !keep.has(k)).forEach((k) => this.tokens.delete(k));
  }

  async startWork(resources) {
    await null; // reconcile() stores this promise as `busy` before any of it runs
    this.starting = resources;
    const what = this.described(resources);
    const given = { ...what, ...this.configsOf(resources) };
    const config_digests = this.digestsOf(resources); // never the values
    this.log('start', { member_epoch: this.epoch, ...what, config_digests });
    const counts = new Map([...resources].map((r) => [r, this.restartCounts.get(r) || 0]));
    let ok = true;
    try {
      await this.onStart(given); // once: a failed start runs again only on a restart
    } catch (err) {
      ok = false;
      this.log('error', { what: 'start', error: String(err) });
      this.setStatus(resources, 'FAILED', traceOf(err));
    }
    resources.forEach((r) => this.running.add(r)); // held either way
    this.starting = new Set();
    this.recordStart(resources, counts, ok);
    if (ok) {
      resources.forEach((r) => {
        const held = this.configs.get(connectorOf(r));
        this.statuses.set(r, { state: this.stateFor(r, held && held.target_state), trace: '' });
      });
    }
    this.done();
  }

  /** onReconfigure for the running resources of connectors whose config digest changed. */
  async reconfigureWork() {
    await null; // reconcile() stores this promise as `busy` before any of it runs
    const names = new Set(this.reconfigure);
    this.reconfigure = new Set();
    const resources = new Set(
      [...this.running].filter((r) => names.has(connectorOf(r)) && !this.failedStarts.has(r)),
    );
    const connectors = [...names].filter((n) => this.configs.has(n)).sort();
    if (resources.size > 0 && connectors.length > 0) {
      const what = this.described(resources);
      this.log('reconfigured', {
        member_epoch: this.epoch,
        ...what,
        connectors,
        config_digests: this.digestsOf(resources),
      });
      try {
        // `connectors` names the reconfigured connectors (held or not: a worker may run only
        // tasks of one); `resources` exactly the running resources reconfigured.
        const given = { ...what, connectors, resources: toCat(resources) };
        await this.onReconfigure({ ...given, ...this.configsOf(resources) });
        this.setStatus(resources, 'RUNNING', '');
      } catch (err) {
        this.log('error', { what: 'reconfigure', error: String(err) });
        this.setStatus(resources, 'FAILED', traceOf(err));
      }
    }
    this.busy = null;
    this.wakeUp();
  }

  /** What it will report for these resources (changes only: see report()). */
  setStatus(resources, state, trace) {
    resources.forEach((r) => this.statuses.set(r, { state, trace }));
    this.wakeUp();
  }

  done() {
    this.busy = null;
    this.nextHeartbeatAt = Date.now();
    this.wakeUp();
  }

  async retry(fn, what, onError = () => {}) {
    for (let attempt = 1; ; attempt++) {
      try {
        return await fn();
      } catch (err) {
        this.log('error', { what, attempt, error: String(err) });
        onError(err);
        const backoff = this.o.retryInitialMs * 2 ** (attempt - 1);
        await new Promise((r) => setTimeout(r, Math.min(this.o.retryMaxMs, backoff)));
      }
    }
  }

  // --- heartbeats -----------------------------------------------------------------------------

  /** Leaving as a member (epoch > 0) while work still stops. */
  get stillHeartbeating() {
    return this.phase === 'LEAVING' && this.epoch > 0 && (this.busy || this.owned.size > 0);
  }

  heartbeatDue() {
    if (this.stillHeartbeating) {
      // Leaving while the work stops: still a member, so heartbeat as one (the owned list
      // shrinking as it stops) and keep the session, which must not expire while work runs.
      return Date.now() >= this.nextHeartbeatAt;
    }
    if (['REJOINING', 'LEAVING', 'FATAL'].includes(this.phase) && (this.busy || this.owned.size)) {
      return false; // stop first, then rejoin, leave or exit
    }
    if (this.phase === 'FATAL') {
      this.phase = 'LEFT';
      return false;
    }
    if (this.phase === 'LEAVING') {
      if (this.epoch <= 0) this.phase = 'LEFT'; // never joined: nothing to leave
      return this.phase === 'LEAVING' && Date.now() >= this.nextHeartbeatAt; // a failed leave backs off
    }
    if (this.phase === 'REJOINING') this.phase = 'JOINING';
    return Date.now() >= this.nextHeartbeatAt;
  }

  buildHeartbeat() {
    const o = this.o;
    const request = { group_id: o.groupId, member_id: o.memberId, member_epoch: this.epoch };
    const owned = this.owned;
    if (this.fullNext || this.epoch === 0) {
      if (o.instanceId) request.instance_id = o.instanceId;
      request.rebalance_timeout_ms = o.rebalanceTimeoutMs;
      request.client_assignors = { assignors: [ASSIGNOR] };
      request.connectors_and_tasks = toCat(owned); // present, even when empty: "I run nothing"
      if (o.url !== undefined) request.url = o.url;
    } else if (keyOf(owned) !== this.lastReported) {
      request.connectors_and_tasks = toCat(owned);
    } // else ABSENT: unchanged since the last heartbeat
    return { request, ownedKey: request.connectors_and_tasks ? keyOf(owned) : null };
  }

  async heartbeat() {
    if (this.phase === 'LEAVING' && !this.stillHeartbeating) return this.sendLeave();
    const { request, ownedKey } = this.buildHeartbeat();
    const sentAt = Date.now();
    let resp;
    try {
      resp = await this.call(this.coordinator, 'ConnectGroupHeartbeat', request);
    } catch (err) {
      this.retryLater(`heartbeat failed: ${err.message}`);
      if (this.failures % 3 === 0) await this.findCoordinator();
      return;
    }
    const code = typeof resp.error_code === 'string' ? resp.error_code : 'UNKNOWN_SERVER_ERROR';
    if (SUCCESS.has(code)) {
      this.onSuccess(request, resp, sentAt, ownedKey);
    } else if (REJOIN.has(code)) {
      this.loseMembership(`${code}: ${resp.error_message}`);
    } else if (FATAL.has(code)) {
      const fix = CONFIGURATION_ERRORS[code]; // undefined for the others: no `fix` key
      this.log('fatal', { error_code: code, error_message: resp.error_message, fix });
      this.fatal = `${code}: ${resp.error_message}`;
      if (fix) this.fatal += ` [configuration error: ${fix}]`;
      this.phase = 'FATAL';
      this.assigned = new Set();
    } else if (FIND.has(code)) {
      this.retryLater(`${code}: ${resp.error_message}`);
      await this.findCoordinator();
    } else {
      this.retryLater(`${code}: ${resp.error_message}`);
    }
    if (resp.throttle_time_ms > 0) {
      // A quota (e.g. joins per principal): no request before it has passed.
      this.nextHeartbeatAt = Math.max(this.nextHeartbeatAt, Date.now() + resp.throttle_time_ms);
    }
  }

  onSuccess(request, resp, sentAt, ownedKey) {
    if (this.phase === 'LEAVING' && request.member_epoch === 0) {
      this.epoch = resp.member_epoch; // joined just as we decided to leave: leave properly
      return;
    }
    if (this.phase === 'LEAVING' && request.member_epoch > 0) {
      // A heartbeat while the work stops before the leave: the session is kept; the answer's
      // assignment does not matter any more (everything stops).
      this.keepSession(resp, sentAt, ownedKey);
      this.epoch = resp.member_epoch;
      return;
    }
    if (this.phase !== 'JOINING' && this.phase !== 'MEMBER') return; // we rejoin or leave now
    if (this.phase === 'JOINING') {
      this.log('joined', { member_epoch: resp.member_epoch });
      this.membership += 1;
      this.fetchedRevision = null; // fetch again after every join
    }
    this.phase = 'MEMBER';
    this.keepSession(resp, sentAt, ownedKey);
    this.epoch = resp.member_epoch;
    const revision = Number(resp.lifecycle_revision) || 0;
    if (revision !== this.revision) this.revisionsSeen += 1;
    this.revision = revision;
    if (resp.assignment) {
      // Present: the full set we may run now. Absent (null): keep what we have.
      this.assigned = toSet(resp.assignment.connectors_and_tasks);
      // Its tokens; a resource it keeps without a token keeps the one it had, and one still
      // running outside it (being revoked) the one it ran under.
      const sent = tokensFrom(resp.assignment.fencing_tokens);
      const keep = union(this.assigned, this.running);
      const tokens = new Map([...this.tokens].filter(([k]) => keep.has(k)));
      sent.forEach((token, k) => this.assigned.has(k) && tokens.set(k, token));
      this.tokens = tokens;
      this.log('assignment', {
        member_epoch: this.epoch,
        ...toCat(this.assigned),
        fencing_tokens: tokensJson(this.assigned, this.tokens),
      });
    }
    if (resp.error_code === 'COMPUTE_ASSIGNMENT' && !this.computing) this.compute();
    if (keyOf(this.owned) !== this.lastReported) this.nextHeartbeatAt = Date.now();
    this.lifecycle();
  }

  /** What every successful heartbeat answer updates: the session's clock, the coordinator's
   * interval and timeout, what it has been told. */
  keepSession(resp, sentAt, ownedKey) {
    this.failures = 0;
    this.fullNext = false;
    if (ownedKey !== null) this.lastReported = ownedKey;
    this.lastSuccessSentAt = sentAt;
    if (resp.heartbeat_interval_ms > 0) this.heartbeatIntervalMs = resp.heartbeat_interval_ms;
    if (resp.session_timeout_ms > 0) this.sessionTimeoutMs = resp.session_timeout_ms;
    this.nextHeartbeatAt = Date.now() + this.heartbeatIntervalMs;
  }

  retryLater(why) {
    this.failures += 1;
    this.fullNext = true;
    const exponential = 50 * 2 ** Math.min(this.failures - 1, 10);
    const backoff = Math.min(2000, this.heartbeatIntervalMs, exponential);
    this.nextHeartbeatAt = Date.now() + Math.max(50, backoff);
    this.log('retry', { why, attempt: this.failures });
  }

  loseMembership(why) {
    this.log('rejoin', { why });
    this.phase = this.phase === 'LEAVING' ? 'LEAVING' : 'REJOINING';
    this.epoch = 0;
    this.assigned = new Set();
    this.revision = 0;
    this.fetchedRevision = null;
    this.configs = new Map();
    this.restartCounts = new Map();
    this.reconfigure = new Set();
    this.reported = new Map(); // a new membership: new grants, new tokens
    this.fullNext = true;
    this.lastSuccessSentAt = null;
    this.failures = 0;
    this.nextHeartbeatAt = Date.now();
  }

  /** Not heard for nearly a session timeout: stop everything before anyone else may start it. */
  checkSelfFence() {
    if ((this.phase !== 'MEMBER' && !this.stillHeartbeating) || this.lastSuccessSentAt === null) {
      return;
    }
    const margin = Math.max(this.heartbeatIntervalMs, Math.floor(this.sessionTimeoutMs / 5));
    const silent = Date.now() - this.lastSuccessSentAt;
    if (silent >= this.sessionTimeoutMs - margin) {
      this.loseMembership(`no successful heartbeat for ${silent} ms: fencing itself`);
    }
  }

  async sendLeave() {
    const o = this.o;
    const epoch = o.instanceId ? -2 : -1; // -2: a static member's work waits for its successor
    const request = { group_id: o.groupId, member_id: o.memberId, member_epoch: epoch };
    if (o.instanceId) request.instance_id = o.instanceId;
    try {
      const resp = await this.call(this.coordinator, 'ConnectGroupHeartbeat', request);
      this.log('left', { member_epoch: request.member_epoch, error_code: resp.error_code });
      this.phase = 'LEFT';
    } catch (err) {
      if (Date.now() > this.leaveDeadline) {
        const error = `leave not delivered (${err.message}); the session will expire`;
        this.log('left', { error });
        this.phase = 'LEFT';
      } else {
        this.retryLater(`leave failed: ${err.message}`);
      }
    }
  }

  async findCoordinator() {
    const o = this.o;
    const candidates = [this.address, ...o.coordinators.filter((a) => a !== this.address)];
    for (const address of candidates) {
      let admin;
      try {
        admin = new this.services.ConnectGroupAdmin(
          address,
          this.credentials(address),
          this.channelOptions(),
        );
      } catch (err) {
        this.log('find_coordinator_failed', { address, error: String(err.message) });
        continue;
      }
      try {
        const resp = await this.call(admin, 'FindCoordinator', { group_id: o.groupId });
        if (resp.error_code === 'NONE' && resp.host) {
          const found = `${resp.host}:${resp.port}`;
          if (found !== this.address) {
            this.log('reconnect', { coordinator: found });
            this.connect(found);
          }
          return;
        }
      } catch (err) {
        this.log('retry', { why: `FindCoordinator at ${address} failed: ${err.message}` });
      } finally {
        admin.close();
      }
    }
  }

  // --- connector lifecycle (DESIGN 3.20): configs in, statuses out ----------------------------

  /** Fetch configs or report statuses if due; each runs beside the heartbeats, one at a time. */
  lifecycle() {
    if (this.phase !== 'MEMBER' || this.revision <= 0) return;
    const now = Date.now();
    if (now < this.memberCallsNotBefore) return; // throttled: both calls wait
    if (!this.fetching && this.fetchedRevision !== this.revision && now >= this.fetchNotBefore) {
      this.fetching = true;
      this.fetchConfigs().finally(() => ((this.fetching = false), this.wakeUp()));
    }
    if (!this.reporting && now >= this.lastReportAt + this.heartbeatIntervalMs) {
      const entries = this.statusChanges();
      if (entries.length > 0) {
        this.reporting = true;
        this.lastReportAt = now;
        this.report(entries).finally(() => ((this.reporting = false), this.wakeUp()));
      }
    }
  }

  /**
   * A member call's error answer: THROTTLING_QUOTA_EXCEEDED holds both calls back for its
   * throttle_time_ms; the others are retried later (the heartbeat deals with membership).
   */
  memberCallRefused(call, resp) {
    const code = typeof resp.error_code === 'string' ? resp.error_code : 'UNKNOWN_SERVER_ERROR';
    if (code === 'THROTTLING_QUOTA_EXCEEDED') {
      const wait = resp.throttle_time_ms > 0 ? resp.throttle_time_ms : this.heartbeatIntervalMs;
      this.memberCallsNotBefore = Date.now() + wait;
      this.log('throttled', { call, throttle_time_ms: wait });
    } else {
      this.log('retry', { why: `${call}: ${code}: ${resp.error_message}` });
    }
  }

  async fetchConfigs() {
    const o = this.o;
    const membership = this.membership;
    const seen = this.revisionsSeen;
    const known_digests = {};
    this.configs.forEach((held, name) => (known_digests[name] = held.digest));
    const request = {
      group_id: o.groupId,
      member_id: o.memberId,
      member_epoch: this.epoch,
      known_digests,
    };
    let resp;
    try {
      resp = await this.call(this.coordinator, 'ConnectGroupConfigs', request);
    } catch (err) {
      resp = { error_code: 'UNKNOWN_SERVER_ERROR', error_message: `transport: ${err.message}` };
    }
    if (membership !== this.membership || this.phase !== 'MEMBER') return; // stale
    if (resp.error_code !== 'NONE') {
      this.fetchNotBefore = Date.now() + this.heartbeatIntervalMs;
      this.memberCallRefused('ConnectGroupConfigs', resp);
      return;
    }
    const configs = new Map();
    const changed = [];
    let incomplete = false;
    for (const held of resp.connectors) {
      const before = this.configs.get(held.connector);
      let config = held.config ? { ...held.config.values } : null; // ABSENT: the digest we sent
      if (!config && before && before.digest === held.config_digest) config = before.config;
      if (!config) {
        incomplete = true; // cannot happen with a correct coordinator: ask again, naming nothing
        continue;
      }
      configs.set(held.connector, {
        digest: held.config_digest,
        config,
        target_state: held.target_state,
      });
      if (!before || before.digest !== held.config_digest) changed.push(held.connector);
      if (before && before.digest !== held.config_digest) this.reconfigure.add(held.connector);
    }
    this.configs = configs;
    this.restartCounts = restartCountsFrom(resp.restart_counts);
    this.fetchedRevision = incomplete ? null : Number(resp.lifecycle_revision);
    if (incomplete) this.fetchNotBefore = Date.now() + this.heartbeatIntervalMs;
    else if (seen === this.revisionsSeen) {
      // No heartbeat answer brought a revision while it was asked: the answer's is the latest
      // known (it may be newer than the last heartbeat's, when the revision rose meanwhile).
      // Without this, such an answer would be fetched again and again until a heartbeat answer
      // caught up, and nothing would start meanwhile.
      this.revision = this.fetchedRevision;
    }
    const config_digests = {};
    configs.forEach((held, name) => (config_digests[name] = held.digest));
    this.log('configs', {
      member_epoch: request.member_epoch,
      lifecycle_revision: Number(resp.lifecycle_revision),
      config_digests,
      changed,
    });
  }

  /** The statuses that differ from what the coordinator last answered, as StatusEntry objects. */
  statusChanges() {
    const owned = this.owned;
    const entries = [];
    this.statuses.forEach(({ state, trace }, key) => {
      if (!owned.has(key) || !this.tokens.has(key)) return;
      const token = this.tokens.get(key);
      const last = this.reported.get(key);
      if (last && last[0] === state && last[1] === trace && last[2] === token) return;
      const [connector, task] = JSON.parse(key);
      const entry = { connector, fencing_token: token, state, trace };
      if (task !== undefined) entry.task = task; // ABSENT: the connector itself
      entries.push({ key, entry });
    });
    return entries;
  }

  async report(entries) {
    const o = this.o;
    const membership = this.membership;
    const request = {
      group_id: o.groupId,
      member_id: o.memberId,
      member_epoch: this.epoch,
      entries: entries.map((e) => e.entry),
    };
    let resp;
    try {
      resp = await this.call(this.coordinator, 'ConnectGroupReportStatus', request);
    } catch (err) {
      resp = { error_code: 'UNKNOWN_SERVER_ERROR', error_message: `transport: ${err.message}` };
    }
    if (membership !== this.membership || this.phase !== 'MEMBER') return; // stale
    if (resp.error_code !== 'NONE') {
      this.memberCallRefused('ConnectGroupReportStatus', resp);
      return;
    }
    const counted = [];
    const refused = [];
    entries.forEach(({ key, entry }, i) => {
      const result = resp.results[i] || { error_code: 'UNKNOWN_SERVER_ERROR' };
      const resource = { connector: entry.connector, task: entry.task, state: entry.state };
      if (result.error_code === 'NONE') counted.push(resource);
      else refused.push({ ...resource, error_code: result.error_code, why: result.error_message });
      // Counted, or refused (NOT_RESOURCE_OWNER: not held under that token): either way, not
      // sent again until it changes; a new grant brings a new token.
      const now = this.statuses.get(key);
      if (result.error_code !== 'UNKNOWN_SERVER_ERROR' && now) {
        this.reported.set(key, [entry.state, entry.trace, entry.fencing_token]);
      }
    });
    this.log('status', { member_epoch: request.member_epoch, counted, refused });
  }

  // --- COMPUTE_ASSIGNMENT ---------------------------------------------------------------------

  async compute() {
    this.computing = true;
    const o = this.o;
    try {
      const prepared = await this.call(this.coordinator, 'ConnectGroupPrepareAssignment', {
        group_id: o.groupId,
        member_id: o.memberId,
        member_epoch: this.epoch,
      });
      if (prepared.error_code !== 'NONE') {
        // UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH, ...: abandon; the heartbeat says what next.
        this.log('compute', { outcome: 'prepare refused', error_code: prepared.error_code });
        return;
      }
      if (prepared.group_epoch === this.lastInstalledEpoch) return; // computed already
      const install = {
        group_id: o.groupId,
        member_id: o.memberId,
        member_epoch: this.epoch,
        group_epoch: prepared.group_epoch,
        error: 0,
        members: [],
        assignor_state: Buffer.alloc(0),
        scheduled_rebalance_delay_ms: 0,
      };
      if (prepared.assignor_name === ASSIGNOR.name) {
        install.members = assign(prepared);
      } else {
        install.error = 1;
        install.error_message = `this client has no assignor ${prepared.assignor_name}`;
      }
      const resp = await this.call(this.coordinator, 'ConnectGroupInstallAssignment', install);
      if (resp.error_code === 'NONE' && install.error === 0) {
        this.lastInstalledEpoch = prepared.group_epoch;
      }
      this.log('compute', {
        outcome: resp.error_code === 'NONE' ? 'installed' : 'install refused',
        group_epoch: prepared.group_epoch,
        error_code: resp.error_code,
        error_message: resp.error_message,
      });
    } catch (err) {
      this.log('compute', { outcome: 'failed', error: err.message });
    } finally {
      this.computing = false;
      this.wakeUp();
    }
  }
}

function main(argv) {
  const env = process.env;
  const { values } = parseArgs({
    args: argv,
    options: {
      coordinator: { type: 'string', default: env.CONNECT_GROUP_COORDINATOR || '127.0.0.1:9093' },
      group: { type: 'string', default: env.CONNECT_GROUP_GROUP || 'connect-cluster' },
      // A member id belongs to one process (DESIGN 3.2): by default a fresh random one.
      'member-id': {
        type: 'string',
        default: env.CONNECT_GROUP_MEMBER_ID || `${os.hostname()}-${crypto.randomBytes(6).toString('hex')}`,
      },
      'tls-ca': { type: 'string', default: env.CONNECT_GROUP_TLS_CA },
      'tls-cert': { type: 'string', default: env.CONNECT_GROUP_TLS_CERT },
      'tls-key': { type: 'string', default: env.CONNECT_GROUP_TLS_KEY },
      'tls-server-name': { type: 'string', default: env.CONNECT_GROUP_TLS_SERVER_NAME },
      'allow-plaintext': { type: 'boolean', default: Boolean(env.CONNECT_GROUP_ALLOW_PLAINTEXT) },
      'instance-id': { type: 'string' },
      url: { type: 'string' },
      'rebalance-timeout-ms': { type: 'string', default: '60000' },
      'rpc-timeout-ms': { type: 'string', default: '5000' },
      'max-message-bytes': {
        type: 'string',
        default: env.CONNECT_GROUP_MAX_MESSAGE_BYTES || String(DEFAULT_MAX_MESSAGE_BYTES),
      },
      protos: { type: 'string', default: DEFAULT_PROTOS },
      'exec-hook': { type: 'string', default: env.CONNECT_GROUP_EXEC_HOOK || undefined },
      'hook-timeout-s': { type: 'string', default: '30' },
      help: { type: 'boolean', short: 'h' },
    },
  });
  if (values.help) {
    process.stdout.write(
      'usage: node worker.js [--coordinator HOST:PORT[,HOST:PORT...]] [--group ID] ' +
        '[--member-id ID] [--instance-id ID] [--url URL] [--rebalance-timeout-ms MS] ' +
        '[--rpc-timeout-ms MS] [--max-message-bytes N] [--protos DIR] [--tls-ca FILE] ' +
        '[--tls-cert FILE --tls-key FILE] [--tls-server-name NAME] [--allow-plaintext] ' +
        '[--exec-hook CMD] [--hook-timeout-s S]\n',
    );
    return;
  }
  // The exec hook (exec_hook.js): the callbacks read the worker's epoch at each call.
  let worker = null;
  let callbacks = {};
  if (values['exec-hook']) {
    const who = () => ({ groupId: values.group, memberId: values['member-id'], memberEpoch: worker.epoch });
    try {
      callbacks = hookCallbacks(values['exec-hook'], Number(values['hook-timeout-s']), who, (e, f) =>
        worker.log(e, f),
      );
    } catch (err) {
      process.stderr.write(`worker.js: ${err.message}\n`);
      process.exit(2);
    }
    // As the agent: a failing revoked (or target-state) call is retried 1 s doubling to 30 s.
    callbacks.retryInitialMs = 1000;
    callbacks.retryMaxMs = 30000;
  }
  worker = new Worker({
    ...callbacks,
    coordinators: values.coordinator.split(',').map((a) => a.trim()).filter(Boolean),
    groupId: values.group,
    memberId: values['member-id'],
    instanceId: values['instance-id'],
    url: values.url,
    rebalanceTimeoutMs: Number(values['rebalance-timeout-ms']),
    rpcTimeoutMs: Number(values['rpc-timeout-ms']),
    maxMessageBytes: Number(values['max-message-bytes']),
    protoRoot: values.protos,
    tlsCa: values['tls-ca'],
    tlsCert: values['tls-cert'],
    tlsKey: values['tls-key'],
    tlsServerName: values['tls-server-name'],
    allowPlaintext: values['allow-plaintext'],
  });
  let signals = 0;
  const onSignal = (name) => {
    signals += 1;
    if (signals === 1) worker.leave();
    else {
      worker.log('exit', { reason: `${name} again: giving up without leaving` });
      process.exit(1);
    }
  };
  process.on('SIGTERM', () => onSignal('SIGTERM'));
  process.on('SIGINT', () => onSignal('SIGINT'));
  worker.run().then(
    (code) => process.exit(code),
    (err) => {
      worker.log('crash', { error: String(err && err.stack) });
      process.exit(1);
    },
  );
}

/** What a status report says about an error thrown by onStart/onReconfigure: its stack. */
function traceOf(err) {
  const text = String((err && err.stack) || err);
  return text.length > MAX_TRACE_CHARS ? text.slice(0, MAX_TRACE_CHARS) : text;
}

module.exports = { Worker, ASSIGNOR, CONFIGURATION_ERRORS, loadServices, tokensFrom, tokensJson };

if (require.main === module) main(process.argv.slice(2));
