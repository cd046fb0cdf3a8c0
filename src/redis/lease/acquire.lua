-- Takes one lease of a key's concurrency limit, or says how many are held.
--
-- KEYS[1]: the key's lease set, a sorted set of lease ids scored by their
--          expiry, in Unix milliseconds on this Redis's clock.
-- ARGV[1]: the limit (an integer >= 0; 0 only counts).
-- ARGV[2]: the lease time in milliseconds.
-- ARGV[3]: the new lease's id, unique to the process and the permit.
--
-- The clock is Redis's own (TIME), read once: the processes sharing a
-- limit need not agree on the time. A lease is live while now < expiry;
-- expired ones are dropped first, then counted. An admission adds the
-- lease and sets the set's expiry to its last lease's, so that a set
-- whose holders all died vanishes with its last lease.
--
-- Returns {admitted (1 or 0), held (after the call), now_ms, expiry_ms
-- (0 when refused)}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZCARD', KEYS[1])
if held >= tonumber(ARGV[1]) then
  return {0, held, now, 0}
end
local expiry = now + tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], expiry, ARGV[3])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], last[2])
return {1, held + 1, now, expiry}
