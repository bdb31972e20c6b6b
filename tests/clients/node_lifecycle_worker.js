#!/usr/bin/env node
'use strict';
/**
 * clients/node/worker.js used as a library, for tests/clients/test_node_lifecycle.py:
 *
 *   node node_lifecycle_worker.js COORDINATOR GROUP MEMBER_ID FAIL_FILE RECEIVED_FILE \
 *     [RESTART_STOP_MS]
 *
 * onStart throws while FAIL_FILE exists (the worker reports FAILED, and runs onStart again only
 * on a restart: DESIGN 3.20). What onStart, onStop, onReconfigure and onTargetState are handed,
 * config values included, is appended to RECEIVED_FILE as JSON lines: never to stdout, which is
 * the worker's log. With RESTART_STOP_MS, onStop takes that long when it is a restart's.
 */

const fs = require('fs');
const path = require('path');
const { Worker } = require(path.resolve(__dirname, '..', '..', 'clients', 'node', 'worker.js'));

const [coordinator, groupId, memberId, failFile, receivedFile, restartStopMs] =
  process.argv.slice(2);
const record = (callback, given) =>
  fs.appendFileSync(receivedFile, JSON.stringify({ callback, ...given }) + '\n');

const worker = new Worker({
  coordinators: [coordinator],
  groupId,
  memberId,
  rebalanceTimeoutMs: 5000,
  onStart: (given) => {
    if (fs.existsSync(failFile)) throw new Error('start refused by the test (fail file present)');
    record('onStart', given);
  },
  onStop: async (given) => {
    record('onStop', given);
    if (given.reason === 'restart' && restartStopMs) {
      await new Promise((resolve) => setTimeout(resolve, Number(restartStopMs)));
    }
  },
  onReconfigure: (given) => record('onReconfigure', given),
  onTargetState: (given) => record('onTargetState', given),
});
process.on('SIGTERM', () => worker.leave());
worker.run().then((code) => process.exit(code));
