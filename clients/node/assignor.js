'use strict';
/**
 * A simple sticky, balanced assignor for `incremental_cooperative` (pure: no I/O, no clock).
 *
 * Used only when the coordinator chooses this Node worker to compute a target, which happens
 * when no member with a wider version range is present (the Python agents advertise
 * `incremental_cooperative` [1-2] and so cover this client's [1-1]; see README.md).
 *
 * Rules, for connectors and, separately, for tasks:
 *  - sticky: each member keeps its share of the last installed target (or, if it has none, what
 *    it owns now), restricted to the catalogue, each resource once;
 *  - balanced: every member ends with the floor or the ceiling of (resources / members); the
 *    members holding the most keep the ceilings, so only what balance requires moves;
 *  - everything is placed at once: no scheduled rebalance delay (KIP-415's delay is the Python
 *    assignor's), and the assignor state it installs is empty ("no state").
 */

/**
 * @typedef {{connector: string, task: number}} TaskId
 * @typedef {{connectors: string[], tasks: TaskId[]}} ConnectorsAndTasks
 * @typedef {{member_id: string, connectors_and_tasks: ConnectorsAndTasks | null}} MemberLike
 * @typedef {{name: string, task_count: number}} ConnectorSpec
 * @typedef {{members: MemberLike[], catalogue: ConnectorSpec[], target_assignment: MemberLike[],
 *            assignor_version: number}} PreparedGroup  (a PrepareAssignment response)
 * @typedef {{member_id: string, connectors_and_tasks: ConnectorsAndTasks, version: number}}
 *          MemberAssignment
 */

const taskKey = (/** @type {TaskId} */ t) => JSON.stringify([t.connector, t.task]);
const fromTaskKey = (/** @type {string} */ key) => {
  const [connector, task] = JSON.parse(key);
  return { connector, task };
};
const byString = (/** @type {string} */ a, /** @type {string} */ b) => (a < b ? -1 : a > b ? 1 : 0);

/**
 * Balance one kind of resource over `ids`.
 * @param {string[]} order member ids, in the order they claim their previous share
 * @param {string[]} all every resource of this kind in the catalogue
 * @param {(id: string) => string[]} previous a member's previous share
 * @returns {Map<string, string[]>} member id -> its share
 */
function balance(order, all, previous) {
  const free = new Set(all);
  /** @type {Map<string, string[]>} */
  const shares = new Map();
  for (const id of order) {
    const share = previous(id).filter((r) => free.has(r));
    share.forEach((r) => free.delete(r));
    shares.set(id, share.sort(byString));
  }
  const floor = Math.floor(all.length / order.length);
  const ceilings = all.length % order.length;
  const byLoad = [...order].sort(
    (a, b) => shares.get(b).length - shares.get(a).length || byString(a, b),
  );
  const quota = new Map(byLoad.map((id, i) => [id, floor + (i < ceilings ? 1 : 0)]));
  const pool = [...free];
  for (const [id, share] of shares) {
    while (share.length > quota.get(id)) pool.push(share.pop());
  }
  pool.sort(byString);
  for (const id of [...order].sort(byString)) {
    const share = shares.get(id);
    while (share.length < quota.get(id)) share.push(pool.shift());
  }
  return shares;
}

/**
 * Compute the next target from a PrepareAssignment answer.
 * @param {PreparedGroup} group
 * @returns {MemberAssignment[]} one full share per member
 */
function assign(group) {
  const empty = { connectors: [], tasks: [] };
  const target = new Map(group.target_assignment.map((m) => [m.member_id, m.connectors_and_tasks]));
  const owned = new Map(group.members.map((m) => [m.member_id, m.connectors_and_tasks]));
  const ids = group.members.map((m) => m.member_id);
  if (ids.length === 0) return [];
  // Members of the last target claim first, so a newcomer's stale owned list never wins.
  const order = [
    ...ids.filter((id) => target.has(id)).sort(byString),
    ...ids.filter((id) => !target.has(id)).sort(byString),
  ];
  const start = (/** @type {string} */ id) =>
    (target.has(id) ? target.get(id) : owned.get(id)) || empty;
  const connectors = balance(
    order,
    group.catalogue.map((c) => c.name),
    (id) => [...start(id).connectors],
  );
  const tasks = balance(
    order,
    group.catalogue.flatMap((c) =>
      Array.from({ length: c.task_count }, (_, task) => taskKey({ connector: c.name, task })),
    ),
    (id) => start(id).tasks.map(taskKey),
  );
  return [...ids].sort(byString).map((id) => ({
    member_id: id,
    connectors_and_tasks: {
      connectors: connectors.get(id),
      tasks: tasks.get(id).map(fromTaskKey),
    },
    version: group.assignor_version,
  }));
}

module.exports = { assign, balance };
