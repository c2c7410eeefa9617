"""The Lua scripts of approval requests. Each runs atomically, which is what makes a decision count once,
an approved call run once, and a suspended job resume exactly once whoever acts first: the deciding
approver, the timeout sweep, or the worker that is suspending the job.

A job moves between ``running``, ``awaiting_approval`` and ``queued`` here with its status indexes and
batch counts, as ``TRANSITION`` (lua.py) moves them; the final-record guard refuses every change.
"""

from __future__ import annotations

# Move a job's record from status `from` to `to`: the record, its two status indexes, its batch counts.
_MOVE = """
local function move(rec, job, from, to, now, idx_from, idx_to, counts)
  redis.call('HSET', rec, 'status', to, to .. '_at', now, 'updated_at', now)
  redis.call('ZREM', idx_from, job)
  redis.call('ZADD', idx_to, tonumber(now), job)
  if redis.call('HEXISTS', rec, 'batch_id') == 1 then
    redis.call('HINCRBY', counts, from, -1)
    redis.call('HINCRBY', counts, to, 1)
  end
end
"""

# Create a request unless the job's map already has one for this call (a redelivery asks again).
# KEYS: 1 request hash, 2 job's approval map, 3 all requests, 4 pending requests, 5 final guard,
#       6 job record. ARGV: 1 request id, 2 map field, 3 request JSON, 4 asked at, 5 deadline,
#       6 call sha256, 7 job id, 8 ttl.
# Returns {'created', id} | {'exists', id} | {'final', ''} (the job ended: nothing written) |
#         {'missing', ''} (no job record).
CREATE = """
if redis.call('EXISTS', KEYS[6]) == 0 then return {'missing', ''} end
if redis.call('EXISTS', KEYS[5]) == 1 then return {'final', ''} end
local known = redis.call('HGET', KEYS[2], ARGV[2])
if known then return {'exists', known} end
local ttl = tonumber(ARGV[8])
redis.call('HSET', KEYS[1], 'request', ARGV[3], 'status', 'pending', 'asked_at', ARGV[4],
  'deadline', ARGV[5], 'call_sha256', ARGV[6], 'job_id', ARGV[7])
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('HSET', KEYS[2], ARGV[2], ARGV[1])
redis.call('EXPIRE', KEYS[2], ttl)
redis.call('ZADD', KEYS[3], tonumber(ARGV[4]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', tonumber(ARGV[4]) - ttl)
redis.call('ZADD', KEYS[4], tonumber(ARGV[5]), ARGV[1])
return {'created', ARGV[1]}
"""

# Decide a pending request: approved, denied, or timed_out (the sweep; also any decision past the
# deadline). A request of an ended job is withdrawn instead. If the job is suspended waiting, it goes
# back to queued (its deliveries counted afresh) and the caller publishes its message.
# KEYS: 1 request, 2 pending requests, 3 job record, 4 final guard, 5 deliveries, 6 batch counts,
#       7 index awaiting_approval, 8 index queued.
# ARGV: 1 request id, 2 decision, 3 by, 4 now, 5 reason, 6 expected call sha256 ("" for any),
#       7 job id, 8 the signed decision's JSON ("" for none: the timeout sweep, an unsigned decision).
# Returns {outcome, detail}: {'approved'|'denied'|'timed_out', 'republish' or ''} when decided now;
# {'decided', status} (decided before); {'withdrawn', ''}; {'mismatch', sha}; {'missing', ''}.
DECIDE = (
    _MOVE
    + """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {'missing', ''} end
if status ~= 'pending' then return {'decided', status} end
if redis.call('EXISTS', KEYS[4]) == 1 then
  redis.call('HSET', KEYS[1], 'status', 'withdrawn', 'decided_at', ARGV[4], 'decided_by', 'job ended')
  redis.call('ZREM', KEYS[2], ARGV[1])
  return {'withdrawn', ''}
end
local sha = redis.call('HGET', KEYS[1], 'call_sha256')
if ARGV[6] ~= '' and ARGV[6] ~= sha then return {'mismatch', sha} end
local decision, by, reason = ARGV[2], ARGV[3], ARGV[5]
if decision ~= 'timed_out' and tonumber(ARGV[4]) > tonumber(redis.call('HGET', KEYS[1], 'deadline')) then
  decision, by, reason = 'timed_out', 'timeout', 'no decision before the deadline'
end
redis.call('HSET', KEYS[1], 'status', decision, 'decided_by', by, 'decided_at', ARGV[4], 'reason', reason)
if ARGV[8] ~= '' then redis.call('HSET', KEYS[1], 'decision', ARGV[8]) end
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('HGET', KEYS[3], 'status') == 'awaiting_approval' then
  move(KEYS[3], ARGV[7], 'awaiting_approval', 'queued', ARGV[4], KEYS[7], KEYS[8], KEYS[6])
  redis.call('DEL', KEYS[5])
  return {decision, 'republish'}
end
return {decision, ''}
"""
)

# Suspend a running job that waits for decisions: store its checkpoint and move it to
# awaiting_approval, or, when one of its requests was decided meanwhile, straight back to queued (the
# caller publishes it). Its deliveries are counted afresh either way: a suspension is not a crash.
# KEYS: 1 record, 2 final guard, 3 checkpoint, 4 deliveries, 5 batch counts, 6 index running,
#       7 index awaiting_approval, 8 index queued, 9.. the requests waited for.
# ARGV: 1 job id, 2 now, 3 ttl, 4 checkpoint JSON.
# Returns {'suspended'} | {'decided'} | {'final'} | {'missing'} | {'state', status}.
SUSPEND = (
    _MOVE
    + """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {'missing'} end
if redis.call('EXISTS', KEYS[2]) == 1 then return {'final'} end
if status ~= 'running' then return {'state', status} end
redis.call('SET', KEYS[3], ARGV[4], 'EX', tonumber(ARGV[3]))
redis.call('DEL', KEYS[4])
for i = 9, #KEYS do
  if redis.call('HGET', KEYS[i], 'status') ~= 'pending' then
    move(KEYS[1], ARGV[1], 'running', 'queued', ARGV[2], KEYS[6], KEYS[8], KEYS[5])
    return {'decided'}
  end
end
move(KEYS[1], ARGV[1], 'running', 'awaiting_approval', ARGV[2], KEYS[6], KEYS[7], KEYS[5])
return {'suspended'}
"""
)

# Take an approved request for execution, once. KEYS: 1 request, 2 final guard. ARGV: 1 worker, 2 now.
# Returns {'go'} (now executing) | {'final'} (the job ended: never) | {status} (anything else).
CONSUME = """
if redis.call('EXISTS', KEYS[2]) == 1 then return {'final'} end
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {'missing'} end
if status ~= 'approved' then return {status} end
redis.call('HSET', KEYS[1], 'status', 'executing', 'executed_by', ARGV[1], 'executed_at', ARGV[2])
return {'go'}
"""

# Withdraw every undecided or approved-but-unused request of an ending job.
# KEYS: 1 pending requests, 2.. the job's requests. ARGV: 1 now, then the request ids (same order).
# Returns {id, status it had, ...} for each request withdrawn.
WITHDRAW = """
local out = {}
for i = 2, #KEYS do
  local status = redis.call('HGET', KEYS[i], 'status')
  if status == 'pending' or status == 'approved' then
    redis.call('HSET', KEYS[i], 'status', 'withdrawn', 'withdrawn_at', ARGV[1], 'withdrawn_from', status)
    redis.call('ZREM', KEYS[1], ARGV[i])
    table.insert(out, ARGV[i])
    table.insert(out, status)
  end
end
return out
"""
