"""The Lua scripts of the write side. Each runs atomically in Redis, which is what makes a job end
exactly once however many deliveries or workers race on it."""

from __future__ import annotations

# A state change of one job, with its indexes, batch counts and retention, in one step. A final
# change also appends the seal (the final audit event, committing to the record) in the same step,
# if the chain's tip is still the one the seal was linked to: the first final write wins, record and
# seal together, however many deliveries race.
# KEYS: 1 record, 2 final guard, 3 done list, 4 batch counts, 5 batch jobs, 6 audit stream,
#       7 deliveries, 8 key register, 9.. one index per status (in the order of the status names in
#       ARGV[15..])
# ARGV: 1 job id, 2 new status, 3 now (epoch s), 4 ttl (s), 5 "1" if final, 6 guard value,
#       7 result JSON (final only), 8 worker name ("" to keep),
#       9 expected chain tip, 10 seal event JSON, 11 its link hash, 12 signature, 13 key id,
#       14 the key's KeyInfo JSON ("" to skip; final only), 15.. status names
# The seal's key is registered if the register lacks it (a Redis that lost its data): an entry is
# never left signed by a key the register has not seen. A registered key, revoked or not, is kept.
# Returns {outcome, detail}; outcome is "ok" (detail: the previous status), "final" (already ended:
# nothing written), "missing" (no record: never submitted, withdrawn or expired) or "moved" (another
# writer appended to the chain first: nothing written; detail: the tip to link the seal to).
TRANSITION = """
local cur = redis.call('HGET', KEYS[1], 'status')
if not cur then return {'missing', ''} end
if redis.call('EXISTS', KEYS[2]) == 1 then return {'final', cur} end
local job, new, now, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
if ARGV[5] == '1' then
  local head = redis.call('HGET', KEYS[1], 'audit_head') or ''
  if head ~= ARGV[9] then return {'moved', head} end
  redis.call('XADD', KEYS[6], '*', 'event', ARGV[10], 'hash', ARGV[11], 'sig', ARGV[12], 'key', ARGV[13])
  if ARGV[14] ~= '' then redis.call('HSETNX', KEYS[8], ARGV[13], ARGV[14]) end
  redis.call('HSET', KEYS[1], 'audit_head', ARGV[11])
  redis.call('HINCRBY', KEYS[1], 'audit_count', 1)
  redis.call('SET', KEYS[2], ARGV[6], 'EX', ttl)
  redis.call('HSET', KEYS[1], 'result', ARGV[7])
  redis.call('RPUSH', KEYS[3], new)
elseif new == 'running' then
  redis.call('HINCRBY', KEYS[1], 'attempts', 1)
end
if ARGV[8] ~= '' then redis.call('HSET', KEYS[1], 'worker', ARGV[8]) end
redis.call('HSET', KEYS[1], 'status', new, new .. '_at', ARGV[3], 'updated_at', ARGV[3])
for i = 15, #ARGV do
  local index = KEYS[i - 6]
  if ARGV[i] == cur and cur ~= new then redis.call('ZREM', index, job) end
  if ARGV[i] == new then
    redis.call('ZADD', index, now, job)
    redis.call('ZREMRANGEBYSCORE', index, '-inf', now - ttl)
  end
end
local batch = redis.call('HGET', KEYS[1], 'batch_id')
if batch and cur ~= new then
  redis.call('HINCRBY', KEYS[4], cur, -1)
  redis.call('HINCRBY', KEYS[4], new, 1)
end
for i = 1, 7 do
  if i ~= 4 and i ~= 5 or batch then redis.call('EXPIRE', KEYS[i], ttl) end
end
return {'ok', cur}
"""

# One delivery of a job's message. KEYS: 1 deliveries hash, 2 record. ARGV: 1 retry number, 2 ttl.
# Returns the deliveries of this retry's message (1 on the first delivery).
COUNT_DELIVERY = """
local n = redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('HINCRBY', KEYS[2], 'deliveries', 1) end
return n
"""

# Append one signed audit event if the chain tip is still the one its link was computed from, and the
# job has not ended (a sealed chain takes no more events).
# KEYS: 1 record, 2 stream, 3 final guard, 4 key register. ARGV: 1 expected tip, 2 event JSON,
# 3 its link hash, 4 signature, 5 key id, 6 ttl, 7 the key's KeyInfo JSON ("" to skip), registered
# if the register lacks it (as in TRANSITION).
# Returns {1, new tip} when appended, {0, actual tip} when another writer got there first,
# {-1, ""} when the record is gone, {-2, ""} when the job has ended (its chain is sealed).
AUDIT_APPEND = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {-1, ''} end
if redis.call('EXISTS', KEYS[3]) == 1 then return {-2, ''} end
local head = redis.call('HGET', KEYS[1], 'audit_head') or ''
if head ~= ARGV[1] then return {0, head} end
redis.call('XADD', KEYS[2], '*', 'event', ARGV[2], 'hash', ARGV[3], 'sig', ARGV[4], 'key', ARGV[5])
if ARGV[7] ~= '' then redis.call('HSETNX', KEYS[4], ARGV[5], ARGV[7]) end
redis.call('HSET', KEYS[1], 'audit_head', ARGV[3])
redis.call('HINCRBY', KEYS[1], 'audit_count', 1)
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[6]))
return {1, ARGV[3]}
"""

# A cancel request for one job, unless it has ended: the request (kept with the record's retention),
# its time in the record (``cancel_requested_at``), the fleet's set of pending requests and a pub/sub
# message to the workers, in one step.
# KEYS: 1 record, 2 final guard, 3 cancel request, 4 pending set. ARGV: 1 job id, 2 request JSON,
# 3 ttl (s), 4 channel, 5 now (epoch s).
# Returns {outcome, status}: "requested" (first request), "again" (one was already pending),
# "final" (the job had ended: nothing written) or "missing" (no record).
REQUEST_CANCEL = """
local cur = redis.call('HGET', KEYS[1], 'status')
if not cur then return {'missing', ''} end
if redis.call('EXISTS', KEYS[2]) == 1 then return {'final', cur} end
local first = redis.call('SET', KEYS[3], ARGV[2], 'NX', 'EX', tonumber(ARGV[3]))
if first then redis.call('HSET', KEYS[1], 'cancel_requested_at', ARGV[5]) end
redis.call('SADD', KEYS[4], ARGV[1])
redis.call('EXPIRE', KEYS[4], tonumber(ARGV[3]))
redis.call('PUBLISH', ARGV[4], ARGV[1])
if first then return {'requested', cur} end
return {'again', cur}
"""

# The queued records of one submit (a job, or a whole batch), each with its audit chain's entry 0, in
# one step: unless a batch it names was created by another submitter (sandfleet/core/batch_creator.py),
# then nothing at all is written. A batch named for the first time takes the submitter's digest as
# its creator, in its counts hash (which lives as long as the batch: every transition refreshes it).
# KEYS: 1 every-job index, 2 queued index, then per batch: its counts hash, its job list; then per job:
#       its record, its audit stream.
# ARGV: 1 now (epoch s), 2 ttl (s), 3 number of batches B, then B creator digests (one per batch);
#       then per job: its id, its batch's number (1..B; 0: none), entry 0's event JSON and link hash,
#       N (the record's field/value count), then the N fields and values of the record.
# Returns {outcome, batch number}: "ok", "refused" (another creator) or "unowned" (a batch that
# records no creator: made by an older producer), with the number of the batch refused.
RECORD_QUEUED = """
local now, ttl, nb = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
for b = 1, nb do
  local counts, jobs = KEYS[1 + 2 * b], KEYS[2 + 2 * b]
  local owner = redis.call('HGET', counts, 'creator')
  if owner then
    if owner ~= ARGV[3 + b] then return {'refused', tostring(b)} end
  elseif redis.call('EXISTS', counts) == 1 or redis.call('EXISTS', jobs) == 1 then
    return {'unowned', tostring(b)}
  end
end
for b = 1, nb do redis.call('HSET', KEYS[1 + 2 * b], 'creator', ARGV[3 + b]) end
local a, k = 4 + nb, 3 + 2 * nb
while a <= #ARGV do
  local job, b, n = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 4])
  local record, audit = KEYS[k], KEYS[k + 1]
  redis.call('HSET', record, unpack(ARGV, a + 5, a + 4 + n))
  redis.call('XADD', audit, '*', 'event', ARGV[a + 2], 'hash', ARGV[a + 3], 'sig', '', 'key', '')
  redis.call('ZADD', KEYS[1], now, job)
  redis.call('ZADD', KEYS[2], now, job)
  redis.call('EXPIRE', record, ttl)
  redis.call('EXPIRE', audit, ttl)
  if b > 0 then
    redis.call('RPUSH', KEYS[2 + 2 * b], job)
    redis.call('HINCRBY', KEYS[1 + 2 * b], 'queued', 1)
    redis.call('HINCRBY', KEYS[1 + 2 * b], 'total', 1)
  end
  a, k = a + 5 + n, k + 2
end
for b = 1, nb do
  redis.call('EXPIRE', KEYS[1 + 2 * b], ttl)
  redis.call('EXPIRE', KEYS[2 + 2 * b], ttl)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
return {'ok', '0'}
"""

# One worker's claim of a due webhook outbox entry (sandfleet/core/webhook_outbox.py): if the entry
# is due, count the try and move its score past the try's lease (backoff doubling per try, capped,
# plus the POST's timeout), so no other worker sends it meanwhile; a worker that dies holding the
# claim loses it when the lease ends.
# KEYS: 1 the outbox sorted set, 2 the job's outbox hash. ARGV: 1 member, 2 now (epoch s),
# 3 the tries field, 4 first backoff (s), 5 backoff cap (s), 6 POST timeout (s).
# Returns the try's number (1, 2, ...), or 0 when the entry is not due (or gone): not claimed.
CLAIM_WEBHOOK = """
local due = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not due or tonumber(due) > tonumber(ARGV[2]) then return 0 end
local tries = redis.call('HINCRBY', KEYS[2], ARGV[3], 1)
local wait = math.min(tonumber(ARGV[5]), tonumber(ARGV[4]) * 2 ^ (tries - 1)) + tonumber(ARGV[6])
redis.call('ZADD', KEYS[1], tonumber(ARGV[2]) + wait, ARGV[1])
return tries
"""
